"""The stream relay: the upstream's SSE passed on to the client, as HTTP only. What a turn
stores (its reply, its failure, an interrupted stream) it asks of the turn through `Hooks`.

The status code is chosen once the upstream answered (or refused, `open_stream`); an upstream
slower than the keep-alive gets a 200 with keep-alive comments, and an error after that arrives
as an SSE `error` event. From the event that carries `finish_reason` on, the events are held
back until the reply is stored, so a client never sees the last byte of a reply that was not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kioku.errors import ModelError, UpstreamError
from kioku.messages import LogEntry
from kioku.models import Completion
from kioku.service.upstream import StreamState

if TYPE_CHECKING:
    from kioku.service.upstream import Upstream

__all__ = ["Hooks", "Opened", "open_stream", "relay", "sse_error"]

log = logging.getLogger("kioku.service")


def sse_error(error: UpstreamError) -> str:
    return f"data: {json.dumps(error.body())}\n\n"


@dataclass
class Hooks:
    """What the relay asks of its turn: each a step the turn owns."""

    failed: Callable[[UpstreamError], Awaitable[None]]  # count, log, record a failure
    # store the reply and end the turn: (completion, upstream seconds, other choices)
    commit: Callable[
        [Completion, float, Sequence[Completion]], Coroutine[Any, Any, LogEntry | None]
    ]
    ended: Callable[[asyncio.Task[LogEntry | None] | None], None]  # the relay is over
    interrupted: Callable[[int], None]  # no reply was stored: how many chars were relayed
    name: str  # the conversation, for the log


@dataclass
class Opened:
    """A stream the upstream accepted, or has not answered within the keep-alive yet."""

    queue: asyncio.Queue[tuple[str, Any]]
    pump: asyncio.Task[None]
    first: tuple[str, Any] | None  # None: nothing came within the keep-alive
    opened: float
    keepalive_s: float


async def open_stream(
    upstream: Upstream,
    data: dict[str, Any],
    keepalive_s: float,
    failed: Callable[[UpstreamError], Awaitable[None]],
) -> Opened:
    """Start reading the upstream's stream; its refusal before the keep-alive is raised here,
    while a status code can still say it."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    opened = time.monotonic()

    async def pump() -> None:
        try:
            async with upstream.stream(data) as lines:
                await queue.put(("open", None))
                async for line in lines:
                    await queue.put(("line", line))
            await queue.put(("end", None))
        except UpstreamError as e:
            await queue.put(("error", e))

    task = asyncio.create_task(pump())
    try:
        first: tuple[str, Any] | None = await asyncio.wait_for(queue.get(), keepalive_s)
    except TimeoutError:
        first = None
    if first is not None and first[0] == "error":
        task.cancel()
        await failed(first[1])
        raise first[1]
    return Opened(queue, task, first, opened, keepalive_s)


def relay(stream: Opened, hooks: Hooks) -> AsyncIterator[str]:
    """The client's side of the stream: the upstream's events, keep-alives, and at most one
    error event."""
    return _Relay(stream, hooks).run()


class _Relay:
    def __init__(self, stream: Opened, hooks: Hooks) -> None:
        self.stream = stream
        self.hooks = hooks
        self.state = StreamState("the upstream")
        self.held_back: list[str] = []
        self.commit: asyncio.Task[LogEntry | None] | None = None

    async def run(self) -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(self._events()) as events:
                async for chunk in events:
                    yield chunk
        except Exception as e:
            # past the first byte a status can no longer say it: an error event does, never a
            # stream that just stops (kioku's own fault, so it is logged with its traceback)
            log.exception("the stream of conversation %r broke", self.hooks.name)
            yield sse_error(self._broke(e))
        finally:
            self._close()

    async def _events(self) -> AsyncGenerator[str, None]:
        state, queue = self.state, self.stream.queue
        if self.stream.first is None:
            yield ": kioku is waiting for the upstream\n\n"
        while True:
            try:
                kind, value = await asyncio.wait_for(queue.get(), self.stream.keepalive_s)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if kind == "line":
                try:
                    state.take(value)
                except ModelError as e:  # a line that is not JSON: the stream is broken
                    kind, value = "error", UpstreamError(502, f"{e}; the reply was not stored")
            if kind == "line" and state.error is not None:
                yield value + "\n"  # the upstream's own error event, as it wrote it
                await self.hooks.failed(UpstreamError(502, f"the upstream: {state.error}"))
                return
            if kind == "line":
                if self.commit is None and state.finish_reason is not None:
                    self.held_back.append(value + "\n")
                    if state.done:
                        await self._commit_now()
                        yield "".join(self.held_back)
                    continue
                yield value + "\n"
            elif kind == "error":
                await self.hooks.failed(value)
                yield sse_error(value)
                return
            elif kind == "end":
                break
        async for chunk in self._ended():
            yield chunk

    async def _ended(self) -> AsyncGenerator[str, None]:
        """The upstream's stream ended: a reply without [DONE] is stored, none is an error."""
        if self.commit is None and self.state.completion() is not None:
            await self._commit_now()  # the upstream ended without [DONE]
            yield "".join(self.held_back)
        elif self.commit is None:
            error = UpstreamError(
                502,
                f"the upstream's stream ended without a finish_reason after "
                f"{len(self.state.text)} chars; the reply was not stored",
            )
            await self.hooks.failed(error)
            yield sse_error(error)

    async def _commit_now(self) -> None:
        completion = self.state.completion()
        assert completion is not None
        seconds = time.monotonic() - self.stream.opened
        self.commit = asyncio.create_task(
            self.hooks.commit(completion, seconds, self.state.completions()[1:])
        )
        await asyncio.shield(self.commit)

    def _broke(self, e: Exception) -> UpstreamError:
        commit = self.commit
        stored = (
            commit is not None
            and commit.done()
            and not commit.cancelled()
            and commit.exception() is None
        )
        return UpstreamError(
            500,
            f"kioku failed while relaying the stream ({type(e).__name__}); the reply "
            + ("was stored" if stored else "was not stored: send the request again"),
            kind="server_error",
            code="stream_failed",
        )

    def _close(self) -> None:
        if not self.stream.pump.done():
            self.stream.pump.cancel()
        self.hooks.ended(self.commit)
        if self.commit is None and self.state.finish_reason is None:
            self.hooks.interrupted(len(self.state.text))
