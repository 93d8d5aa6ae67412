"""The upstream OpenAI-compatible server, and timeouts that agree end to end.

kioku forwards the client's request body (with kioku's messages in place of the client's) and
passes the upstream's JSON or SSE back byte for byte, so every field a server adds (`usage`,
`timings`, `system_fingerprint`, tool calls) reaches the client unchanged.

Timeouts (seed: the backend waited 150 s while its front end gave up at 40 s). All three layers
take their numbers from the profile (`kioku.profiles.Profile`):

    upstream connect  profile.connect_timeout_s (10 s)   cannot connect → 502
    upstream reply    profile.reply_timeout_s (120 s)    no answer within it → 504
                      (non-streaming: the whole answer; streaming: the longest silence)
    keep-alive        every KEEPALIVE_S (10 s) of upstream silence a streamed response sends an
                      SSE comment, so proxies and clients see a live connection
    client            set it above reply_timeout_s + 5 s (openai SDK default: 600 s); kioku
                      then always answers — with the reply or a 504 — before the client gives up

A summary never runs inside a turn (the worker does it in the background, with
profile.summary_timeout_s), so a turn's latency is kioku's few milliseconds plus the upstream's.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from kioku.client import api_root, server_message
from kioku.errors import UpstreamError
from kioku.models import Completion, Usage
from kioku.profiles import Profile

KEEPALIVE_S = 10.0
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class Answer:
    payload: dict[str, Any]
    seconds: float


def completion_of(payload: Any) -> Completion:
    """The first choice of a chat completion as kioku records it."""
    try:
        choice = payload["choices"][0]
        text = (choice.get("message") or {}).get("content") or ""
        usage = payload.get("usage") or {}
        return Completion(
            text=text if isinstance(text, str) else "",
            finish_reason=str(choice.get("finish_reason") or "unknown"),
            usage=Usage(
                int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            ),
            model=str(payload.get("model") or ""),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise UpstreamError(
            502, f"the upstream answered without choices[0]: {str(payload)[:300]}"
        ) from e


class StreamState:
    """What a relayed SSE stream said: its text, finish_reason and usage."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.usage = Usage()
        self.model = ""
        self.done = False  # saw `data: [DONE]`

    def take(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        self.model = str(chunk.get("model") or self.model)
        u = chunk.get("usage")
        if isinstance(u, dict):
            self.usage = Usage(
                int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
            )
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self.parts.append(delta["content"])
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def completion(self) -> Completion | None:
        if self.finish_reason is None:
            return None
        return Completion("".join(self.parts), self.finish_reason, self.usage, self.model)


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
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def _error(self, r: httpx.Response) -> UpstreamError:
        msg = server_message(r)
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
        return UpstreamError(
            r.status_code, f"{where} refused the request: {msg}", "invalid_request_error"
        )

    def _transport_error(self, e: httpx.HTTPError) -> UpstreamError:
        if isinstance(e, httpx.ConnectTimeout | httpx.ConnectError | httpx.PoolTimeout):
            return UpstreamError(
                502,
                f"cannot reach the upstream at {self.root} ({type(e).__name__}); start it or "
                "check --upstream",
                "upstream_unavailable",
            )
        if isinstance(e, httpx.TimeoutException):
            return self.timed_out()
        return UpstreamError(
            502, f"the upstream at {self.root} broke the connection: {e!r}", "upstream_unavailable"
        )

    def timed_out(self) -> UpstreamError:
        p = self.profile
        return UpstreamError(
            504,
            f"the upstream at {self.root} gave no answer within {p.reply_timeout_s:g} s "
            f"(profile {p.name}: reply_timeout_s); use a faster model or raise the timeout",
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
            payload = r.json()
        except ValueError as e:
            raise UpstreamError(
                502, f"the upstream answered with something other than JSON: {r.text[:200]!r}"
            ) from e
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

            async def lines() -> AsyncIterator[str]:
                try:
                    async for line in r.aiter_lines():
                        yield line
                except httpx.HTTPError as e:
                    raise self._transport_error(e) from e

            yield lines()
        finally:
            await r.aclose()

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
