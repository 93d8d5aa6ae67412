"""One turn through the proxy: sync the request with the log, build kioku's prompt, forward it,
record the reply.

Store first: the request's new messages are stored (and the turn's compaction applied) before
the upstream is called, so an upstream failure or a client that hangs up loses nothing the
client wrote. The reply is recorded while the response leaves, under the conversation's lock
(taken before the last byte is sent, released once the reply is stored), so the client's next
request always finds it in the log and no client waits for the store.

The client's leading system messages are the character card (the conversation's system prompt,
the prefix-cache base); system messages further down (author's notes, post-history
instructions) are not stored: they go to the upstream at the end, next to the new message,
where they do not break the cache of what precedes them.

What a request is — a turn, a swipe, a continue, or a side request that stores nothing (quiet,
impersonate, SillyTavern's Test Message) — is decided in `kioku.service.generation`; the
message list sent upstream is made to alternate roles by `kioku.alternation`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from kioku.alternation import alternate
from kioku.context import Prompt
from kioku.engine import Conversation
from kioku.errors import InputError
from kioku.messages import LogEntry
from kioku.models import ChatMessage, Completion
from kioku.service import generation as gen
from kioku.service.cards import note_card, stored_card
from kioku.service.metrics import prefix_reuse
from kioku.service.upstream import StreamState, UpstreamError, completion_of
from kioku.sync import Incoming, Synced, SyncPlan, replace_reply, sync

if TYPE_CHECKING:
    from kioku.service.app import Service, Slot

log = logging.getLogger("kioku.service")

CONVERSATION_HEADER = "x-kioku-conversation"
CHARACTER_HEADER = "x-kioku-character"
MODE_HEADER = "x-kioku-mode"  # stateful | stateless (default: one message = stateful)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ROLES |= {"tool": "tool", "function": "tool"}


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatBody(BaseModel):
    """An OpenAI chat completion request; fields kioku does not use pass to the upstream."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(None, description="Names the conversation (or X-Kioku-Conversation).")
    max_tokens: int | None = Field(None, ge=1)


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


@dataclass(frozen=True)
class Split:
    system: str | None  # leading system messages: the character card
    chat: tuple[Incoming, ...]
    before_last: tuple[ChatMessage, ...] = ()  # system messages inside the history
    after_last: tuple[ChatMessage, ...] = ()  # system messages after the last message


def split_messages(messages: Sequence[ChatMessageIn]) -> Split:
    system: list[str] = []
    chat: list[Incoming] = []
    inside: list[ChatMessage] = []
    after: list[ChatMessage] = []
    for m in messages:
        role = ROLES.get(m.role)
        if role is None:
            raise InputError(f"unknown role {m.role!r}; use system, user, assistant or tool")
        text = content_text(m.content)
        if role == "system":
            if not chat:
                system.append(text)
            else:
                after.append(ChatMessage("system", text))
            continue
        if not text.strip():
            continue  # a tool call without text: nothing kioku can store
        inside.extend(after)
        after = []
        chat.append(Incoming(role, text, m.name or ""))  # type: ignore[arg-type]
    if not chat:
        raise InputError("the request has no user or assistant message to answer")
    return Split("\n\n".join(system) if system else None, tuple(chat), tuple(inside), tuple(after))


@dataclass
class Turn:
    tenant: str
    conv: Conversation
    synced: Synced
    prompt: Prompt
    started: float
    character: str = ""
    side: bool = False  # a side request (quiet, impersonate, Test Message): nothing is stored
    extend: int | None = None  # a continue: the stored reply the new text extends

    @property
    def entry(self) -> LogEntry:
        return self.synced.entry

    @property
    def regenerate(self) -> int | None:
        return self.synced.plan.regenerate


def start_turn(
    svc: Service,
    slot: Slot,
    tenant: str,
    conversation_id: str,
    split: Split,
    stateful: bool | None,
    character: str,
    started: float,
    generation: gen.Generation | None = None,
    user: str | None = None,
) -> Turn:
    """Store what is new and build the prompt (runs in a thread, under the slot's lock)."""
    kk = svc.kioku(tenant)
    if slot.conv is None or (split.system is not None and split.system != slot.system):
        old = (
            slot.system if slot.conv is not None else stored_card(kk.store, conversation_id, tenant)
        )
        slot.conv = kk.conversation(
            conversation_id, system_prompt=split.system, character=character
        )
        note_card(kk.store, conversation_id, old, split.system)
        slot.system = split.system
        slot.character = slot.conv.info().character
    conv = slot.conv
    if gen.is_side(generation, split, stateful, gen.sends_transcripts(conv, slot)):
        prompt, entry = gen.side_prompt(conv, split, slot.character)
        return Turn(tenant, conv, Synced(entry, SyncPlan()), prompt, started, slot.character, True)
    synced = sync(
        conv,
        split.chat,
        stateful=stateful,
        character=slot.character,
        user=gen.user_name(conv, slot, user),
        named=generation is not None,
    )
    if stateful is False or (stateful is None and len(split.chat) > 1):
        gen.note_transcript(conv, slot)
    extend = None
    if generation == gen.Generation.CONTINUE and synced.entry.role == "assistant":
        extend = synced.entry.seq
    prompt = conv.prepare_for(synced.entry)
    return Turn(tenant, conv, synced, prompt, started, slot.character, extend=extend)


def start_side(
    svc: Service, tenant: str, conversation_id: str, split: Split, character: str, started: float
) -> Turn:
    """A side request: the conversation's memory when it exists, nothing created or stored."""
    conv = Conversation(svc.kioku(tenant), conversation_id)
    prompt, entry = gen.side_prompt(conv, split, character)
    return Turn(tenant, conv, Synced(entry, SyncPlan()), prompt, started, character, True)


def finish_turn(turn: Turn, completion: Completion) -> LogEntry | None:
    """Record the reply (a regeneration replaces the old one); a reply without text (a tool
    call) is not stored."""
    conv = turn.conv
    if turn.side:
        return None
    if not completion.text.strip():
        conv.store.log(conv.id, "reply", "not_stored", detail="no text (a tool call?)")
        return None
    if turn.extend is not None:
        entry = gen.continued(conv, turn.extend, completion)
    elif turn.regenerate is not None:
        entry = replace_reply(conv, turn.regenerate, completion, turn.character)
    else:
        entry = conv.record(completion, author=turn.character)
    conv.store.incr(conv.id, "turns")
    return entry


def upstream_body(body: ChatBody, turn: Turn, split: Split, reserve: int) -> dict[str, Any]:
    data = body.model_dump(exclude_none=True, exclude={"messages", "user", "stream"})
    messages = [m.to_json() for m in turn.prompt.messages]
    last = messages.pop()
    messages += [m.to_json() for m in split.before_last]
    messages.append(last)
    messages += [m.to_json() for m in split.after_last]
    data["messages"] = alternate(messages)
    # the prompt was sized so that prompt + reserve fits the window: never ask for more
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(data.get(key), int):
            data[key] = min(data[key], reserve)
    if "max_completion_tokens" not in data:
        data["max_tokens"] = min(data.get("max_tokens", reserve), reserve)
    return data


def header_text(value: str | None) -> str | None:
    """A header as its sender meant it: HTTP carries bytes, clients send UTF-8 (a Japanese
    conversation id), ASGI hands them over decoded as latin-1."""
    if value is None:
        return None
    if value[:7].lower() == "utf-8''":  # RFC 8187: what a browser's fetch can send
        return unquote(value[7:])
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def kioku_headers(turn: Turn, upstream_s: float | None = None) -> dict[str, str]:
    h = {
        "X-Kioku-Conversation": quote(turn.conv.id, safe=""),  # percent-encoded UTF-8
        "X-Kioku-Seq": str(turn.entry.seq),
        "X-Kioku-Memory-Version": str(turn.prompt.memory_version),
        "X-Kioku-Prompt-Tokens": str(turn.prompt.tokens),
    }
    if turn.regenerate is not None:
        h["X-Kioku-Regenerated"] = str(turn.regenerate)
    if turn.side:
        h["X-Kioku-Stored"] = "false"  # a side request: nothing was stored
    if turn.extend is not None:
        h["X-Kioku-Continued"] = str(turn.extend)
    if upstream_s is not None:
        h["X-Kioku-Upstream-Ms"] = f"{upstream_s * 1000:.2f}"
    return h


def _note_failure(turn: Turn, error: UpstreamError) -> None:
    conv = turn.conv
    if turn.side:
        return  # nothing of a side request is stored, not even its failure
    conv.store.log(
        conv.id,
        "upstream",
        error.kind,
        first_seq=turn.entry.seq,
        last_seq=turn.entry.seq,
        detail=error.message[:500],
    )
    conv.store.incr(conv.id, "upstream_errors")


async def chat(svc: Service, body: ChatBody, tenant: str, headers: dict[str, str]) -> Response:
    started = time.monotonic()
    cid = header_text(headers.get(CONVERSATION_HEADER)) or body.user
    generation = gen.generation_of(headers.get(gen.GENERATION_HEADER))
    if not cid and generation not in gen.SIDE:
        raise InputError(
            "name the conversation: send the header X-Kioku-Conversation (or the `user` field)"
        )
    split = split_messages(body.messages)
    mode = headers.get(MODE_HEADER, "").lower()
    stateful = {"stateful": True, "stateless": False}.get(mode)
    character = header_text(headers.get(CHARACTER_HEADER)) or next(
        (m.name for m in split.chat if m.role == "assistant" and m.name), ""
    )
    user = header_text(headers.get(gen.USER_HEADER))
    slot = svc.slot(tenant, cid or "")
    async with slot.lock:
        if not cid or generation in gen.SIDE:
            turn = await run_in_threadpool(
                start_side, svc, tenant, cid or "", split, character, started
            )
        else:
            turn = await run_in_threadpool(
                start_turn, svc, slot, tenant, cid, split, stateful, character, started,
                generation, user,
            )  # fmt: skip
        if not turn.side:
            reuse = prefix_reuse(slot.last_prompt, turn.prompt.messages)
            slot.last_prompt = turn.prompt.messages
            svc.metrics.prefix_reuse.observe(tenant, reuse)
    svc.metrics.prompt_tokens.observe(tenant, turn.prompt.tokens)
    data = upstream_body(body, turn, split, svc.profile.response_reserve)
    if body.stream:
        return await _stream(svc, slot, turn, data)
    p = svc.profile
    try:
        async with asyncio.timeout(p.reply_timeout_s + p.connect_timeout_s):
            answer = await svc.upstream.chat(data)
    except TimeoutError:
        error = svc.upstream.timed_out()
        await _failed(svc, turn, error)
        raise error from None
    except UpstreamError as error:
        await _failed(svc, turn, error)
        raise
    try:
        completion = completion_of(answer.payload)
    except UpstreamError as error:
        await _failed(svc, turn, error)
        raise
    await _store_reply(svc, slot, turn, completion, answer.seconds)
    return JSONResponse(answer.payload, headers=kioku_headers(turn, answer.seconds))


async def _failed(svc: Service, turn: Turn, error: UpstreamError) -> None:
    svc.metrics.error(turn.tenant, error.kind)
    await run_in_threadpool(_note_failure, turn, error)


def _observe(svc: Service, turn: Turn, upstream_s: float) -> None:
    total = time.monotonic() - turn.started
    m = svc.metrics
    m.turn_seconds.observe(turn.tenant, total)
    m.upstream_seconds.observe(turn.tenant, upstream_s)
    m.overhead_seconds.observe(turn.tenant, max(0.0, total - upstream_s))


async def _store_reply(
    svc: Service, slot: Slot, turn: Turn, completion: Completion, upstream_s: float
) -> None:
    """Record the reply while the response leaves. The conversation's lock is taken now and
    held until the reply is stored, so the client's next request (which waits for the lock)
    always finds it in the log, and the client does not wait for the store. Then the tic guard
    reads the new reply, so the next turn finds its alerts computed."""
    if turn.side:
        _observe(svc, turn, upstream_s)
        return
    await slot.lock.acquire()
    _observe(svc, turn, upstream_s)

    async def store() -> None:
        try:
            await run_in_threadpool(finish_turn, turn, completion)
        except Exception:
            svc.metrics.error(turn.tenant, "reply_not_stored")
            log.exception("the reply to %s #%s was not stored", turn.conv.id, turn.entry.seq)
        finally:
            slot.lock.release()
        layers = turn.conv.kioku.layers
        if layers is not None:
            try:
                await run_in_threadpool(layers.tic_alerts, turn.conv.id)
            except Exception:
                log.exception("tic detection failed for %s", turn.conv.id)

    svc.spawn(store())


def _sse_error(error: UpstreamError) -> str:
    return f"data: {json.dumps(error.body())}\n\n"


async def _stream(svc: Service, slot: Slot, turn: Turn, data: dict[str, Any]) -> Response:
    """Relay the upstream's SSE. The status code is chosen once the upstream answered (or
    refused); an upstream slower than `svc.keepalive_s` gets a 200 with keep-alive comments,
    and an error after that arrives as an SSE `error` event."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    opened = time.monotonic()

    async def pump() -> None:
        try:
            async with svc.upstream.stream(data) as lines:
                await queue.put(("open", None))
                async for line in lines:
                    await queue.put(("line", line))
            await queue.put(("end", None))
        except UpstreamError as e:
            await queue.put(("error", e))

    task = asyncio.create_task(pump())
    try:
        first: tuple[str, Any] | None = await asyncio.wait_for(queue.get(), svc.keepalive_s)
    except TimeoutError:
        first = None
    if first is not None and first[0] == "error":
        await _failed(svc, turn, first[1])
        raise first[1]

    async def relay() -> AsyncIterator[str]:
        state = StreamState()
        recorded = False
        try:
            if first is None:
                yield ": kioku is waiting for the upstream\n\n"
            while True:
                try:
                    kind, value = await asyncio.wait_for(queue.get(), svc.keepalive_s)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if kind == "line":
                    state.take(value)
                    if state.done and not recorded:
                        recorded = await _record(svc, slot, turn, state, opened)
                    yield value + "\n"
                elif kind == "error":
                    await _failed(svc, turn, value)
                    yield _sse_error(value)
                    return
                elif kind == "end":
                    break
            if not recorded and not await _record(svc, slot, turn, state, opened):
                error = UpstreamError(
                    502,
                    f"the upstream's stream ended without a finish_reason after "
                    f"{len(''.join(state.parts))} chars; the reply was not stored",
                )
                await _failed(svc, turn, error)
                yield _sse_error(error)
        finally:
            if not task.done():
                task.cancel()
            if not recorded and state.finish_reason is None and not turn.side:
                # the client hung up (or the upstream broke): the user message stays stored
                conv = turn.conv
                asyncio.get_running_loop().run_in_executor(
                    None,
                    lambda: conv.store.log(
                        conv.id,
                        "stream",
                        "interrupted",
                        first_seq=turn.entry.seq,
                        last_seq=turn.entry.seq,
                        detail=f"{len(''.join(state.parts))} chars relayed",
                    ),
                )

    return StreamingResponse(
        relay(),
        media_type="text/event-stream",
        headers={**kioku_headers(turn), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _record(svc: Service, slot: Slot, turn: Turn, state: StreamState, opened: float) -> bool:
    completion = state.completion()
    if completion is None:
        return False
    await _store_reply(svc, slot, turn, completion, time.monotonic() - opened)
    return True
