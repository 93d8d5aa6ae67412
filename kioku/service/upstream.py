"""The upstream OpenAI-compatible server, and timeouts that agree end to end.

kioku forwards the client's request body (with kioku's messages in place of the client's) and
passes the upstream's JSON or SSE back byte for byte, so every field a server adds (`usage`,
`timings`, `system_fingerprint`, tool calls) reaches the client unchanged. What the answer said
is read by `kioku.wire`, the parser kioku's own client uses too. A request the upstream refuses
(4xx) reaches the client with the upstream's status, message, `code` and `param`; one refused
for its size carries what the server said (`kioku.service.oversize`), from which the service
learns a smaller window.

Timeouts (seed: the backend waited 150 s while its front end gave up at 40 s). All three layers
take their numbers from the profile (`kioku.profiles.Profile`):

    upstream connect  profile.connect_timeout_s (10 s)   cannot connect → 502
    upstream reply    profile.reply_timeout_s (120 s;    no answer within it → 504
                      --reply-timeout, env               (non-streaming: the whole answer;
                      KIOKU_REPLY_TIMEOUT)               streaming: the longest silence, so a
                                                         reply that keeps coming is never cut)
    keep-alive        every KEEPALIVE_S (10 s) of upstream silence a streamed response sends an
                      SSE comment, so proxies and clients see a live connection
    client            set it above reply_timeout_s + 5 s (openai SDK default: 600 s); kioku
                      then always answers — with the reply or a 504 — before the client gives up

A summary never runs inside a turn (the worker does it in the background, with
profile.summary_timeout_s), so a turn's latency is kioku's few milliseconds plus the upstream's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from kioku.client import api_root, server_message
from kioku.errors import ModelError, UpstreamError
from kioku.models import Completion
from kioku.profiles import Profile
from kioku.service.oversize import oversize_of
from kioku.tls import tls_context
from kioku.wire import StreamState, read_choices, read_json

__all__ = ["Answer", "StreamState", "Upstream", "completion_of", "completions_of"]

KEEPALIVE_S = 10.0
UPSTREAM_MESSAGE_CHARS = 8000  # the upstream's own error reaches the client whole
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class Answer:
    payload: dict[str, Any]
    seconds: float


def completions_of(payload: Any) -> list[Completion]:
    """Every choice of a chat completion, choice 0 first (`kioku.wire` reads them)."""
    try:
        return read_choices(payload, "the upstream")
    except ModelError as e:
        raise UpstreamError(502, str(e)) from e


def completion_of(payload: Any) -> Completion:
    """The first choice of a chat completion as kioku records it."""
    return completions_of(payload)[0]


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _refusal(r: httpx.Response) -> tuple[str | None, str | None, str | None]:
    """The upstream's own `type`, `code` and `param`, so its error reaches the client as it
    said it (a string code; an integer one is written as a string)."""
    try:
        err = r.json().get("error")
    except (ValueError, AttributeError):
        return None, None, None
    if not isinstance(err, dict):
        return None, None, None

    def text(key: str) -> str | None:
        v = err.get(key)
        return None if v is None or v == "" else str(v)

    return text("type"), text("code"), text("param")


class Upstream:
    """An OpenAI-compatible server behind kioku. `transport` is for tests."""

    def __init__(
        self,
        base_url: str,
        profile: Profile,
        *,
        api_key: str | None = None,
        model: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.root = api_root(base_url)
        self.model = model
        self.profile = profile
        self.timeout = httpx.Timeout(
            profile.reply_timeout_s,
            connect=profile.connect_timeout_s,
            pool=profile.connect_timeout_s,
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            transport=transport,
            headers=headers,
            timeout=self.timeout,
            verify=tls_context(),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def _error(self, r: httpx.Response) -> UpstreamError:
        msg = server_message(r, UPSTREAM_MESSAGE_CHARS)
        where = f"the upstream ({self.root})"
        if r.status_code in (401, 403):
            return UpstreamError(
                502, f"{where} refused kioku's key ({r.status_code}: {msg}); set KIOKU_LLM_API_KEY"
            )
        if r.status_code == 404:
            return UpstreamError(502, f"{where} answered 404 ({msg}); check --upstream")
        if r.status_code == 429:
            return UpstreamError(429, f"{where} is rate limiting: {msg}", "rate_limit_error")
        if r.status_code >= 500:
            return UpstreamError(502, f"{where} failed with {r.status_code}: {msg}")
        kind, code, param = _refusal(r)
        said = oversize_of(r.status_code, msg, _json(r))
        if said is not None:
            error = UpstreamError(
                r.status_code,
                f"{where} refused the prompt as larger than its context window: {msg}",
                "invalid_request_error",
                "context_length_exceeded",
                param,
            )
            error.oversize = said
            return error
        return UpstreamError(
            r.status_code,
            f"{where} refused the request: {msg}",
            kind or "invalid_request_error",
            code,
            param,
        )

    def _transport_error(self, e: httpx.HTTPError, stream: bool = False) -> UpstreamError:
        if isinstance(e, httpx.ConnectTimeout | httpx.ConnectError | httpx.PoolTimeout):
            return UpstreamError(
                502,
                f"cannot reach the upstream at {self.root} ({type(e).__name__}); start it or "
                "check --upstream",
                "upstream_unavailable",
            )
        if isinstance(e, httpx.TimeoutException):
            return self.timed_out(stream)
        return UpstreamError(
            502, f"the upstream at {self.root} broke the connection: {e!r}", "upstream_unavailable"
        )

    def timed_out(self, stream: bool = False) -> UpstreamError:
        p = self.profile
        wait = "sent nothing for" if stream else "gave no answer within"
        return UpstreamError(
            504,
            f"the upstream at {self.root} {wait} {p.reply_timeout_s:g} s; a slow model needs "
            "a longer wait: pass --reply-timeout SECONDS to kioku serve (env "
            "KIOKU_REPLY_TIMEOUT), or use a faster model",
            "upstream_timeout",
        )

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.model:
            body = {**body, "model": self.model}
        return body

    async def chat(self, body: dict[str, Any]) -> Answer:
        started = time.monotonic()
        try:
            r = await self.http.post(f"{self.root}/chat/completions", json=self.body(body))
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        if r.is_error:
            raise self._error(r)
        try:
            payload = read_json(r.text, "the upstream")
        except ModelError as e:
            raise UpstreamError(502, str(e)) from e
        if not isinstance(payload, dict):
            raise UpstreamError(502, f"the upstream answered {str(payload)[:200]!r}")
        return Answer(payload, time.monotonic() - started)

    @asynccontextmanager
    async def stream(self, body: dict[str, Any]) -> AsyncIterator[AsyncIterator[str]]:
        """Open a streamed completion; raises `UpstreamError` before the first line if the
        upstream refuses, and while iterating if the connection breaks."""
        request = self.http.build_request(
            "POST", f"{self.root}/chat/completions", json=self.body({**body, "stream": True})
        )
        try:
            r = await self.http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        try:
            if r.is_error:
                await r.aread()
                raise self._error(r)
            buffered = await self._not_a_stream(r)

            async def lines() -> AsyncIterator[str]:
                if buffered is not None:  # an SSE body under another content type
                    for line in buffered.splitlines():
                        yield line
                    return
                try:
                    async for line in r.aiter_lines():
                        yield line
                except httpx.HTTPError as e:
                    raise self._transport_error(e, stream=True) from e

            yield lines()
        finally:
            await r.aclose()

    async def _not_a_stream(self, r: httpx.Response) -> str | None:
        """A 200 to a streamed request must be SSE: anything else (a JSON completion from a
        server that ignores `stream`, an HTML error page from a proxy) is refused before a byte
        of it reaches the client. Returns the body when it is SSE under another content type."""
        if "text/event-stream" in r.headers.get("content-type", ""):
            return None
        try:
            body = (await r.aread()).decode("utf-8", "replace")
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        first = body.lstrip("\r\n").split("\n", 1)[0]
        if first.startswith(("data:", ":", "event:", "id:", "retry:")):
            return body
        kind = r.headers.get("content-type") or "no content type"
        raise UpstreamError(
            502,
            f"the upstream ({self.root}) answered a streamed request with {kind} instead of "
            f"an event stream: {body[:200]!r}; check that it supports stream=true",
        )

    async def models(self) -> dict[str, Any]:
        try:
            r = await self.http.get(f"{self.root}/models")
        except httpx.HTTPError as e:
            raise self._transport_error(e) from e
        if r.is_error:
            raise self._error(r)
        try:
            payload = r.json()
        except ValueError as e:
            raise UpstreamError(502, "the upstream's /models is not JSON") from e
        return payload if isinstance(payload, dict) else {"object": "list", "data": []}
