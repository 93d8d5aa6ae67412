"""A chat model over the OpenAI-compatible HTTP API (llama.cpp, llama-cpp-python, vLLM, clouds).

Policy is kept apart from I/O, as in httpx (whose `Client` and `AsyncClient` share a
`BaseClient`): `_BaseChatModel` builds the requests, decides what a failure means (`_RetryPolicy`)
and reads the answers (`kioku.wire`, the parser the proxy's upstream uses too). Each call is
written once, as a generator that yields what to do next (send this request, sleep, read this
body) and returns the result; `OpenAIChatModel` and `AsyncOpenAIChatModel` only carry those steps
out, one with `httpx.Client`, the other with `httpx.AsyncClient`. So the two cannot drift: the
same retries, the same errors, the same completions (`tests/test_client.py` runs one scripted
server conversation through both). The seed's failures shape the rules:

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
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from kioku.errors import ConfigError, ModelError, ModelTimeout, ModelUnavailable
from kioku.models import ChatRequest, Completion, Usage
from kioku.profiles import Profile
from kioku.tls import tls_context
from kioku.wire import StreamState, read_completion, read_json

DEFAULT_RETRIES = 2
# how servers say a request is larger than their window (llama.cpp, llama-cpp-python, vLLM,
# OpenAI): "exceeds the available context size", "Requested tokens (25766) exceed context window
# of 8192", "maximum context length is 8192 tokens. However, you requested 25766 tokens"
CONTEXT_LENGTH = re.compile(
    r"context (?:size|length|window)|n_ctx|maximum context|requested \d+ tokens|"
    r"requested tokens|too many tokens|prompt is too long",
    re.IGNORECASE,
)
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


def server_message(response: httpx.Response, limit: int = 500) -> str:
    """The error text a server sent, whatever its dialect (OpenAI, llama.cpp, vLLM, FastAPI),
    cut at `limit` characters."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:limit] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or body.get("detail")
            if msg:
                return str(msg)[:limit]
        elif isinstance(err, str):
            return err[:limit]
        if body.get("message"):
            return str(body["message"])[:limit]
    return json.dumps(body)[:limit]


class _Api:
    """Requests and errors of the OpenAI chat API, without I/O."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key: str | None,
        timeouts: Timeouts,
        profile: Profile | None = None,
    ):
        self.profile = profile
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
        return read_completion(payload, f"the server at {self.root}", self.model or "")

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
        if response.status_code in (400, 413, 422) and CONTEXT_LENGTH.search(msg):
            return ModelError(f"{where} failed with {response.status_code}: {msg}; {self._hint()}")
        return ModelError(f"{where} failed with {response.status_code}: {msg}")

    def _hint(self) -> str:
        """What to do when the server's window is smaller than kioku's profile assumes."""
        p = self.profile
        used = f"kioku's profile is {p.name}, a {p.window:,}-token window" if p else "kioku"
        return (
            f"the request is larger than the server's context window ({used}): pass --profile "
            "local-8k, or --window N with the server's context size (llama.cpp -c / --n_ctx; "
            "env KIOKU_PROFILE, KIOKU_WINDOW)"
        )


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
                f"no answer from {url} within the timeout ({type(exc).__name__}); a slow "
                "model needs a longer wait: --reply-timeout SECONDS (env KIOKU_REPLY_TIMEOUT) "
                "for replies, --summary-timeout (KIOKU_SUMMARY_TIMEOUT) for summaries, or use "
                "a faster model"
            )
        if isinstance(exc, httpx.TransportError) and attempt < self.retries:
            return None
        if isinstance(exc, httpx.TransportError):
            return ModelUnavailable(
                f"cannot reach the model server at {url} after {attempt + 1} tries: {exc!r}; "
                "start it or check the URL"
            )
        return ModelError(f"request to {url} failed: {exc!r}")


# The steps a flow yields; a driver carries them out and sends back the response (or throws
# the transport's exception into the flow).
@dataclass(frozen=True)
class _Send:
    request: httpx.Request
    stream: bool = False


@dataclass(frozen=True)
class _Read:
    response: httpx.Response  # a streamed response whose body the flow needs (an error)


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Step = _Send | _Read | _Sleep
T = TypeVar("T")
Flow = Generator[_Step, Any, T]


class _BaseChatModel:
    """Everything the two clients share: requests, retries, errors and parsing, as flows."""

    http: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key: str | None,
        profile: Profile | None,
        timeouts: Timeouts | None,
        retries: int,
        backoff_s: float,
    ) -> None:
        t = timeouts or (Timeouts.from_profile(profile) if profile else Timeouts())
        self.api = _Api(base_url, model, api_key, t, profile)
        self.policy = _RetryPolicy(retries, backoff_s)
        self._tokenize: Callable[[str], dict[str, Any]] | None = None
        self._tokenize_url = ""
        self._tokenize_checked = False

    @property
    def name(self) -> str:
        return self.api.model or self.api.root

    def _request(
        self, method: str, url: str, purpose: str = "reply", body: Any = None
    ) -> httpx.Request:
        timeout = self.api.timeouts.for_purpose(purpose)
        return self.http.build_request(method, url, json=body, timeout=timeout)

    def _chat(self, request: ChatRequest, stream: bool = False) -> httpx.Request:
        body = self.api.chat_body(request, stream=stream)
        return self._request("POST", f"{self.api.root}/chat/completions", request.purpose, body)

    def _retrying(self, request: httpx.Request, stream: bool = False) -> Flow[httpx.Response]:
        """Send until an answer can be used: connection errors and 5xx are retried with
        backoff (a stream only before its first byte), a read timeout raises at once."""
        url = str(request.url)
        attempt = 0
        while True:
            try:
                r: httpx.Response = yield _Send(request, stream)
                if stream and r.is_error:
                    yield _Read(r)
            except httpx.HTTPError as e:
                error = self.policy.on_exception(e, attempt, url)
                if error is not None:
                    raise error from e
                yield _Sleep(self.policy.delay(attempt))
                attempt += 1
                continue
            if self.policy.retry_response(r, attempt):
                yield _Sleep(self.policy.delay(attempt, r))
                attempt += 1
                continue
            if r.is_error:
                raise self.api.error(r)
            return r

    def _complete(self, request: ChatRequest) -> Flow[Completion]:
        r = yield from self._retrying(self._chat(request))
        return self.api.completion(read_json(r.text, str(r.request.url)))

    def _models(self) -> Flow[list[str]]:
        r = yield from self._retrying(self._request("GET", f"{self.api.root}/models"))
        data = read_json(r.text, str(r.request.url))
        return [str(m.get("id")) for m in (data.get("data") or []) if isinstance(m, dict)]

    def _tokenize_flow(self, text: str) -> Flow[list[int] | None]:
        """Token ids from the server's own tokenizer, or None when it offers none.

        llama.cpp: `POST /tokenize {"content"}`; vLLM: `POST /tokenize {"model", "prompt"}`;
        llama-cpp-python: `POST /extras/tokenize {"input"}` (its ids include BOS). The first
        endpoint that answers is remembered; a server that is down raises `ModelUnavailable`."""
        if self._tokenize is not None:
            r = yield from self._retrying(
                self._request("POST", self._tokenize_url, body=self._tokenize(text))
            )
            return _token_ids(r)
        if self._tokenize_checked:
            return None
        model = self.api.model or ""
        variants: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
            (f"{self.api.server}/tokenize", lambda t: {"content": t}),
            (f"{self.api.server}/tokenize", lambda t: {"model": model, "prompt": t}),
            (f"{self.api.server}/extras/tokenize", lambda t: {"input": t}),
        ]
        for url, make in variants:
            try:
                r = yield from self._retrying(self._request("POST", url, body=make(text)))
                ids = _token_ids(r)
            except ModelUnavailable:
                raise
            except (ModelError, KeyError, TypeError, ValueError):
                continue
            self._tokenize, self._tokenize_url = make, url
            return ids
        self._tokenize_checked = True
        return None


def _token_ids(r: httpx.Response) -> list[int]:
    return [int(x["id"]) if isinstance(x, dict) else int(x) for x in r.json()["tokens"]]


class _StreamBase:
    """What both streams share: the parsing of each line and how a stream may end."""

    def __init__(self, request: httpx.Request, model: str) -> None:
        self.request = request
        self.url = str(request.url)
        self.state = StreamState(self.url, model)

    def _delta(self, line: str) -> str:
        delta = self.state.take(line)
        if self.state.error is not None:
            raise ModelError(f"the stream from {self.url} reported an error: {self.state.error}")
        return delta

    def _broken(self, e: httpx.HTTPError) -> ModelUnavailable:
        return ModelUnavailable(
            f"the connection to {self.url} broke during the stream: {e!r}; the reply is "
            "incomplete and was not used"
        )

    def _ended(self) -> None:
        if self.state.finish_reason is None:
            raise ModelUnavailable(
                f"the stream from {self.url} ended without a finish_reason after "
                f"{len(self.text)} chars; the reply is incomplete and was not used"
            )

    @property
    def text(self) -> str:
        return self.state.text

    @property
    def finish_reason(self) -> str | None:
        return self.state.finish_reason

    @property
    def usage(self) -> Usage | None:
        return self.state.usage

    @property
    def model(self) -> str:
        return self.state.model

    def completion(self) -> Completion:
        done = self.state.completion()
        if done is None:
            raise ModelError("the stream has not finished; iterate it first")
        return done


class CompletionStream(_StreamBase):
    """Deltas of a streamed completion. Iterate for text; afterwards `finish_reason`, `usage`
    and `completion()` say how it ended. A stream that breaks off raises, it does not end.
    Retries happen before the first byte only."""

    def __init__(self, client: OpenAIChatModel, request: httpx.Request) -> None:
        super().__init__(request, client.api.model or "")
        self._gen = self._deltas(client)

    def _deltas(self, client: OpenAIChatModel) -> Generator[str, None, None]:
        r = client._run(client._retrying(self.request, stream=True))
        try:
            for line in r.iter_lines():
                delta = self._delta(line)
                if delta:
                    yield delta
        except httpx.HTTPError as e:
            raise self._broken(e) from e
        finally:
            r.close()
        self._ended()

    def __iter__(self) -> Iterator[str]:
        return self._gen

    def close(self) -> None:
        """Stop early and release the connection (the reply is then incomplete)."""
        self._gen.close()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncCompletionStream(_StreamBase):
    """The async twin of `CompletionStream` (`async for delta in stream`)."""

    def __init__(self, client: AsyncOpenAIChatModel, request: httpx.Request) -> None:
        super().__init__(request, client.api.model or "")
        self._gen = self._deltas(client)

    async def _deltas(self, client: AsyncOpenAIChatModel) -> AsyncGenerator[str, None]:
        r = await client._run(client._retrying(self.request, stream=True))
        try:
            async for line in r.aiter_lines():
                delta = self._delta(line)
                if delta:
                    yield delta
        except httpx.HTTPError as e:
            raise self._broken(e) from e
        finally:
            await r.aclose()
        self._ended()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._gen

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class OpenAIChatModel(_BaseChatModel):
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
        super().__init__(base_url, model, api_key, profile, timeouts, retries, backoff_s)
        self.sleep = sleep
        self.http: httpx.Client = httpx.Client(
            transport=transport, headers=self.api.headers, verify=tls_context()
        )

    def _run(self, flow: Flow[T]) -> T:
        """Carry out a flow's steps with the sync client."""
        value: Any = None
        error: httpx.HTTPError | None = None
        while True:
            try:
                step = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if isinstance(step, _Send):
                    value = self.http.send(step.request, stream=step.stream)
                elif isinstance(step, _Read):
                    step.response.read()
                else:
                    self.sleep(step.seconds)
            except httpx.HTTPError as e:
                error = e

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(self, request: ChatRequest) -> Completion:
        return self._run(self._complete(request))

    def stream(self, request: ChatRequest) -> CompletionStream:
        """Stream a completion (sent when iteration starts)."""
        return CompletionStream(self, self._chat(request, stream=True))

    def models(self) -> list[str]:
        return self._run(self._models())

    def tokenize(self, text: str) -> list[int] | None:
        return self._run(self._tokenize_flow(text))


class AsyncOpenAIChatModel(_BaseChatModel):
    """The async twin of `OpenAIChatModel`: the same flows, carried out with `await`."""

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
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        super().__init__(base_url, model, api_key, profile, timeouts, retries, backoff_s)
        self.sleep = sleep
        self.http: httpx.AsyncClient = httpx.AsyncClient(
            transport=transport, headers=self.api.headers, verify=tls_context()
        )

    async def _run(self, flow: Flow[T]) -> T:
        """Carry out a flow's steps with the async client."""
        value: Any = None
        error: httpx.HTTPError | None = None
        while True:
            try:
                step = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if isinstance(step, _Send):
                    value = await self.http.send(step.request, stream=step.stream)
                elif isinstance(step, _Read):
                    await step.response.aread()
                else:
                    await self.sleep(step.seconds)
            except httpx.HTTPError as e:
                error = e

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncOpenAIChatModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(self, request: ChatRequest) -> Completion:
        return await self._run(self._complete(request))

    def stream(self, request: ChatRequest) -> AsyncCompletionStream:
        """Stream a completion (sent when iteration starts)."""
        return AsyncCompletionStream(self, self._chat(request, stream=True))

    async def models(self) -> list[str]:
        return await self._run(self._models())

    async def tokenize(self, text: str) -> list[int] | None:
        return await self._run(self._tokenize_flow(text))
