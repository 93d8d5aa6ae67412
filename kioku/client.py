"""A chat model over the OpenAI-compatible HTTP API (llama.cpp, llama-cpp-python, vLLM, clouds).

Policy is kept apart from I/O, as in httpx: `_Api` builds requests and reads responses without
touching the network, `_RetryPolicy` decides what a failure means, and the sync and async clients
only send. The seed's failures shape the rules:

- a reply cut at max_tokens comes back with `finish_reason == "length"`, never dressed as done;
- connection errors and 5xx are retried with backoff, then raise `ModelUnavailable`; a read
  timeout raises `ModelTimeout` at once (the server may still be working: resending would
  queue the same 30 s job twice);
- any other error raises `ModelError` carrying the server's own message;
- a server that dies mid-answer raises, it never yields a half answer as a completion.

Timeouts come from the profile (connect, reply, summary) so that every layer agrees (seed: the
backend waited 150 s while the front end gave up at 40 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from kioku.errors import ConfigError, ModelError, ModelTimeout, ModelUnavailable
from kioku.models import ChatRequest, Completion, Usage
from kioku.profiles import Profile

DEFAULT_RETRIES = 2
DEFAULT_BACKOFF_S = 0.5
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Timeouts:
    """Seconds to connect, to wait for a reply turn, and to wait for a summary."""

    connect: float = 10.0
    reply: float = 120.0
    summary: float = 300.0

    @classmethod
    def from_profile(cls, profile: Profile) -> Timeouts:
        return cls(profile.connect_timeout_s, profile.reply_timeout_s, profile.summary_timeout_s)

    def for_purpose(self, purpose: str) -> httpx.Timeout:
        # httpx's read timeout is the longest silence; a non-streamed completion is silent
        # until it is done, so it bounds the whole generation
        read = self.reply if purpose == "reply" else self.summary
        return httpx.Timeout(read, connect=self.connect)


def api_root(base_url: str) -> str:
    """`http://host:8080` → `http://host:8080/v1`; a URL with a path is taken as the API root."""
    url = httpx.URL(base_url.rstrip("/"))
    if url.scheme not in ("http", "https"):
        raise ConfigError(f"model URL {base_url!r} must start with http:// or https://")
    if url.path in ("", "/"):
        return str(url.copy_with(path="/v1"))
    return str(url)


def server_message(response: httpx.Response) -> str:
    """The error text a server sent, whatever its dialect (OpenAI, llama.cpp, vLLM, FastAPI)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or body.get("detail")
            if msg:
                return str(msg)[:500]
        elif isinstance(err, str):
            return err[:500]
        if body.get("message"):
            return str(body["message"])[:500]
    return json.dumps(body)[:500]


class _Api:
    """Requests and responses of the OpenAI chat API, without I/O."""

    def __init__(self, base_url: str, model: str | None, api_key: str | None, timeouts: Timeouts):
        self.root = api_root(base_url)
        self.server = self.root.removesuffix("/v1")
        self.model = model
        self.timeouts = timeouts
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def chat_body(self, request: ChatRequest, stream: bool = False) -> dict[str, Any]:
        body = request.to_json(self.model)
        if stream:
            body["stream"] = True
            body.setdefault("stream_options", {"include_usage": True})
        return body

    def completion(self, payload: Any) -> Completion:
        try:
            choice = payload["choices"][0]
            message = choice.get("message") or {}
            text = message.get("content") or ""
            usage = payload.get("usage") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise ModelError(
                f"the server at {self.root} answered without choices[0]: {str(payload)[:300]}"
            ) from e
        return Completion(
            text=text,
            finish_reason=choice.get("finish_reason") or "unknown",
            usage=Usage(
                int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            ),
            model=str(payload.get("model") or self.model or ""),
        )

    def error(self, response: httpx.Response) -> ModelError:
        msg = server_message(response)
        where = f"{response.request.method} {response.request.url}"
        if response.status_code in RETRY_STATUS:
            return ModelUnavailable(
                f"{where} failed with {response.status_code} after retries: {msg}; "
                "check that the model server is up and not overloaded"
            )
        if response.status_code in (401, 403):
            return ModelError(f"{where} refused ({response.status_code}): {msg}; check the API key")
        return ModelError(f"{where} failed with {response.status_code}: {msg}")


@dataclass(frozen=True)
class _RetryPolicy:
    retries: int
    backoff_s: float

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        if response is not None and response.headers.get("retry-after", "").isdigit():
            return min(30.0, float(response.headers["retry-after"]))
        return self.backoff_s * (2**attempt)

    def retry_response(self, response: httpx.Response, attempt: int) -> bool:
        return response.status_code in RETRY_STATUS and attempt < self.retries

    def on_exception(self, exc: httpx.HTTPError, attempt: int, url: str) -> ModelError | None:
        """None: retry. Otherwise the error to raise."""
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            return ModelTimeout(
                f"no answer from {url} within the timeout ({type(exc).__name__}); raise the "
                "profile's timeout or use a faster model"
            )
        if isinstance(exc, httpx.TransportError) and attempt < self.retries:
            return None
        if isinstance(exc, httpx.TransportError):
            return ModelUnavailable(
                f"cannot reach the model server at {url} after {attempt + 1} tries: {exc!r}; "
                "start it or check the URL"
            )
        return ModelError(f"request to {url} failed: {exc!r}")


def _sse_payloads(lines: Iterator[str]) -> Iterator[Any]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except ValueError as e:
            raise ModelError(f"the stream sent a line that is not JSON: {data[:200]!r}") from e


class CompletionStream:
    """Deltas of a streamed completion. Iterate for text; afterwards `finish_reason`, `usage`
    and `completion()` say how it ended. A stream that breaks off raises, it does not end."""

    def __init__(self, chunks: Iterator[Any], url: str) -> None:
        self._chunks = chunks
        self.url = url
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model = ""

    def _take(self, payload: Any) -> str:
        self.model = str(payload.get("model") or self.model)
        if payload.get("usage"):
            u = payload["usage"]
            self.usage = Usage(
                int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
            )
        delta = ""
        for choice in payload.get("choices") or ():
            delta += (choice.get("delta") or {}).get("content") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.parts.append(delta)
        return delta

    def __iter__(self) -> Iterator[str]:
        for payload in self._chunks:
            delta = self._take(payload)
            if delta:
                yield delta
        if self.finish_reason is None:
            raise ModelUnavailable(
                f"the stream from {self.url} ended without a finish_reason after "
                f"{len(self.text)} chars; the reply is incomplete and was not used"
            )

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def close(self) -> None:
        """Stop early and release the connection (the reply is then incomplete)."""
        close = getattr(self._chunks, "close", None)
        if close:
            close()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def completion(self) -> Completion:
        if self.finish_reason is None:
            raise ModelError("the stream has not finished; iterate it first")
        return Completion(self.text, self.finish_reason, self.usage or Usage(), self.model)


class OpenAIChatModel:
    """`ChatModel` over HTTP. `transport` is for tests (`httpx.MockTransport`)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        profile: Profile | None = None,
        timeouts: Timeouts | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        t = timeouts or (Timeouts.from_profile(profile) if profile else Timeouts())
        self.api = _Api(base_url, model, api_key, t)
        self.policy = _RetryPolicy(retries, backoff_s)
        self.sleep = sleep
        self.http = httpx.Client(transport=transport, headers=self.api.headers)
        self._tokenize: Callable[[str], list[int]] | None = None
        self._tokenize_checked = False

    @property
    def name(self) -> str:
        return self.api.model or self.api.root

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, url: str, timeout: httpx.Timeout, **kw: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                r = self.http.request(method, url, timeout=timeout, **kw)
            except httpx.HTTPError as e:
                error = self.policy.on_exception(e, attempt, url)
                if error is not None:
                    raise error from e
                self.sleep(self.policy.delay(attempt))
                attempt += 1
                continue
            if self.policy.retry_response(r, attempt):
                self.sleep(self.policy.delay(attempt, r))
                attempt += 1
                continue
            if r.is_error:
                raise self.api.error(r)
            return r

    def complete(self, request: ChatRequest) -> Completion:
        url = f"{self.api.root}/chat/completions"
        r = self._send(
            "POST",
            url,
            self.api.timeouts.for_purpose(request.purpose),
            json=self.api.chat_body(request),
        )
        try:
            payload = r.json()
        except ValueError as e:
            raise ModelError(
                f"{url} answered with something other than JSON: {r.text[:200]!r}"
            ) from e
        return self.api.completion(payload)

    def stream(self, request: ChatRequest) -> CompletionStream:
        """Stream a completion. Retries happen before the first byte only; once deltas flow,
        a broken connection raises `ModelUnavailable`."""
        url = f"{self.api.root}/chat/completions"
        timeout = self.api.timeouts.for_purpose(request.purpose)
        body = self.api.chat_body(request, stream=True)

        def chunks() -> Iterator[Any]:
            attempt = 0
            while True:
                try:
                    with self.http.stream("POST", url, json=body, timeout=timeout) as r:
                        if self.policy.retry_response(r, attempt):
                            r.read()
                        elif r.is_error:
                            r.read()
                            raise self.api.error(r)
                        else:
                            attempt = -1  # streaming has begun: no more retries
                            yield from _sse_payloads(r.iter_lines())
                            return
                    self.sleep(self.policy.delay(attempt))
                    attempt += 1
                except httpx.HTTPError as e:
                    if attempt < 0:
                        raise ModelUnavailable(
                            f"the connection to {url} broke during the stream: {e!r}; the reply "
                            "is incomplete and was not used"
                        ) from e
                    error = self.policy.on_exception(e, attempt, url)
                    if error is not None:
                        raise error from e
                    self.sleep(self.policy.delay(attempt))
                    attempt += 1

        return CompletionStream(chunks(), url)

    def models(self) -> list[str]:
        r = self._send("GET", f"{self.api.root}/models", self.api.timeouts.for_purpose("reply"))
        return [str(m.get("id")) for m in (r.json().get("data") or [])]

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids from the server's own tokenizer, or None when it offers none.

        llama.cpp: `POST /tokenize {"content"}`; vLLM: `POST /tokenize {"model", "prompt"}`;
        llama-cpp-python: `POST /extras/tokenize {"input"}` (its ids include BOS). The first
        endpoint that answers is remembered; a server that is down raises `ModelUnavailable`."""
        if self._tokenize is not None:
            return self._tokenize(text)
        if self._tokenize_checked:
            return None
        timeout = self.api.timeouts.for_purpose("reply")
        model = self.api.model or ""
        variants: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
            (f"{self.api.server}/tokenize", lambda t: {"content": t}),
            (f"{self.api.server}/tokenize", lambda t: {"model": model, "prompt": t}),
            (f"{self.api.server}/extras/tokenize", lambda t: {"input": t}),
        ]
        for url, make in variants:

            def call(
                t: str, url: str = url, make: Callable[[str], dict[str, Any]] = make
            ) -> list[int]:
                r = self._send("POST", url, timeout, json=make(t))
                return [int(x["id"]) if isinstance(x, dict) else int(x) for x in r.json()["tokens"]]

            try:
                ids = call(text)
            except ModelUnavailable:
                raise
            except (ModelError, KeyError, TypeError, ValueError):
                continue
            self._tokenize = call
            return ids
        self._tokenize_checked = True
        return None


class AsyncOpenAIChatModel:
    """The async twin of `OpenAIChatModel` (same requests, parsing and retry policy)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        profile: Profile | None = None,
        timeouts: Timeouts | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        t = timeouts or (Timeouts.from_profile(profile) if profile else Timeouts())
        self.api = _Api(base_url, model, api_key, t)
        self.policy = _RetryPolicy(retries, backoff_s)
        self.sleep = sleep
        self.http = httpx.AsyncClient(transport=transport, headers=self.api.headers)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(
        self, method: str, url: str, timeout: httpx.Timeout, **kw: Any
    ) -> httpx.Response:
        attempt = 0
        while True:
            try:
                r = await self.http.request(method, url, timeout=timeout, **kw)
            except httpx.HTTPError as e:
                error = self.policy.on_exception(e, attempt, url)
                if error is not None:
                    raise error from e
                await self.sleep(self.policy.delay(attempt))
                attempt += 1
                continue
            if self.policy.retry_response(r, attempt):
                await self.sleep(self.policy.delay(attempt, r))
                attempt += 1
                continue
            if r.is_error:
                raise self.api.error(r)
            return r

    async def complete(self, request: ChatRequest) -> Completion:
        url = f"{self.api.root}/chat/completions"
        r = await self._send(
            "POST",
            url,
            self.api.timeouts.for_purpose(request.purpose),
            json=self.api.chat_body(request),
        )
        try:
            payload = r.json()
        except ValueError as e:
            raise ModelError(
                f"{url} answered with something other than JSON: {r.text[:200]!r}"
            ) from e
        return self.api.completion(payload)

    async def stream(self, request: ChatRequest) -> AsyncIterator[str]:
        """Deltas only; use the sync client's `CompletionStream` when the ending matters."""
        url = f"{self.api.root}/chat/completions"
        timeout = self.api.timeouts.for_purpose(request.purpose)
        finished = False
        try:
            async with self.http.stream(
                "POST", url, json=self.api.chat_body(request, stream=True), timeout=timeout
            ) as r:
                if r.is_error:
                    await r.aread()
                    raise self.api.error(r)
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    payload = json.loads(line[5:])
                    for choice in payload.get("choices") or ():
                        finished = finished or bool(choice.get("finish_reason"))
                        delta = (choice.get("delta") or {}).get("content")
                        if delta:
                            yield delta
        except httpx.HTTPError as e:
            raise ModelUnavailable(f"the stream from {url} broke: {e!r}") from e
        if not finished:
            raise ModelUnavailable(f"the stream from {url} ended without a finish_reason")
