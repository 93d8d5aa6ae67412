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

Tool calls, tool results and content parts (images) are stored with their messages and sent
upstream as the client wrote them (`kioku.protocol`). With `n > 1`, choice 0 is the stored
reply; the other choices are kept beside it (`Store.choices`).

What a request is — a turn, a swipe, a continue, or a side request that stores nothing (quiet,
impersonate, SillyTavern's Test Message) — is decided in `kioku.service.generation`; the
message list sent upstream is made to alternate roles by `kioku.alternation`, last.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from kioku import protocol
from kioku.alternation import alternate
from kioku.context import Prompt
from kioku.dates import parse_client_date
from kioku.engine import Conversation
from kioku.errors import BadParameter, InputError, ModelError, UpstreamError
from kioku.messages import LogEntry, Role
from kioku.models import ChatMessage, Completion
from kioku.service import generation as gen
from kioku.service.cards import note_card, stored_card
from kioku.service.conventions import check_headers, header_text
from kioku.service.metrics import prefix_reuse
from kioku.service.upstream import StreamState, completions_of
from kioku.sync import Incoming, Synced, SyncPlan, replace_reply, sync

if TYPE_CHECKING:
    from kioku.service.app import Service, Slot

log = logging.getLogger("kioku.service")

CONVERSATION_HEADER = "x-kioku-conversation"
CHARACTER_HEADER = "x-kioku-character"
MODE_HEADER = "x-kioku-mode"  # stateful | stateless (default: one message = stateful)
ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


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


def system_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A system message is text (the card, an author's note): an image there would vanish."""
    if isinstance(content, list) and any(
        not isinstance(p, dict) or p.get("type") != "text" for p in content
    ):
        raise BadParameter(
            f"{where} is a system message with a part that is not text; kioku keeps system "
            "messages as text: send images in a user message",
            f"{where}.content",
        )
    return content_text(content)


@dataclass(frozen=True)
class Split:
    system: str | None  # leading system messages: the character card
    chat: tuple[Incoming, ...]
    before_last: tuple[ChatMessage, ...] = ()  # system messages inside the history
    after_last: tuple[ChatMessage, ...] = ()  # system messages after the last message
    blobs: Mapping[str, bytes] = field(default_factory=dict)  # media parts, by sha256


def split_messages(messages: Sequence[ChatMessageIn]) -> Split:
    system: list[str] = []
    chat: list[Incoming] = []
    inside: list[ChatMessage] = []
    after: list[ChatMessage] = []
    blobs: dict[str, bytes] = {}
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            raise InputError(f"unknown role {m.role!r}; use system, user, assistant or tool")
        if role == "system":
            text = system_text(m.content, f"messages.{i}")
            if not chat:
                system.append(text)
            else:
                after.append(ChatMessage("system", text))
            continue
        parsed = protocol.incoming(
            m.role, m.content, name=m.name, extra=m.model_extra, where=f"messages.{i}"
        )
        if parsed.is_empty:
            continue  # nothing kioku can store
        blobs.update(parsed.blobs)
        inside.extend(after)
        after = []
        at = parse_client_date((m.model_extra or {}).get("send_date"))
        chat.append(Incoming(role, parsed.text, m.name or "", parsed.parts, at))
    if not chat:
        raise InputError("the request has no user or assistant message to answer")
    system_prompt = "\n\n".join(system) if system else None
    return Split(system_prompt, tuple(chat), tuple(inside), tuple(after), blobs)


@dataclass
class Turn:
    tenant: str
    conv: Conversation
    synced: Synced
    prompt: Prompt
    started: float
    character: str = ""
    media: Mapping[str, Any] = field(default_factory=dict)  # blob hash -> content part
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
        return side_turn(tenant, conv, split, slot.character, started)
    synced = sync(
        conv,
        split.chat,
        stateful=stateful,
        character=slot.character,
        blobs=split.blobs,
        user=gen.user_name(conv, slot, user),
        named=generation is not None,
    )
    if stateful is False or (stateful is None and len(split.chat) > 1):
        gen.note_transcript(conv, slot)
    extend = None
    if generation == gen.Generation.CONTINUE and synced.entry.role == "assistant":
        extend = synced.entry.seq
    prompt = conv.prepare_for(synced.entry)
    media = protocol.media_of(conv.store.blobs(protocol.refs_of(prompt.messages)))
    return Turn(tenant, conv, synced, prompt, started, slot.character, media, extend=extend)


def start_side(
    svc: Service, tenant: str, conversation_id: str, split: Split, character: str, started: float
) -> Turn:
    """A side request: the conversation's memory when it exists, nothing created or stored."""
    conv = Conversation(svc.kioku(tenant), conversation_id)
    return side_turn(tenant, conv, split, character, started)


def side_turn(
    tenant: str, conv: Conversation, split: Split, character: str, started: float
) -> Turn:
    """A side request's turn: its images come from the request itself (nothing of it is
    stored) or, for the raw window's, from the store."""
    prompt, entry = gen.side_prompt(conv, split, character)
    refs = protocol.refs_of(prompt.messages)
    blobs = {**conv.store.blobs(refs - split.blobs.keys()), **split.blobs}
    media = protocol.media_of({r: blobs[r] for r in refs if r in blobs})
    return Turn(tenant, conv, Synced(entry, SyncPlan()), prompt, started, character, media, True)


def finish_turn(
    turn: Turn, completion: Completion, others: Sequence[Completion] = ()
) -> LogEntry | None:
    """Record the reply (a regeneration replaces the old one) and, with n > 1, the other
    choices beside it; a reply with neither text nor tool calls is not stored."""
    conv = turn.conv
    if turn.side:
        return None
    if not completion.text.strip() and not completion.tool_calls:
        conv.store.log(conv.id, "reply", "not_stored", detail="no text and no tool calls")
        return None
    if turn.extend is not None:
        entry = gen.continued(conv, turn.extend, completion)
    elif turn.regenerate is not None:
        entry = replace_reply(conv, turn.regenerate, completion, turn.character)
    else:
        entry = conv.record(completion, author=turn.character)
    if others or turn.regenerate is not None:
        alternatives = [protocol.reply_message(c, turn.character) for c in others]
        conv.store.set_choices(conv.id, entry.seq, alternatives)
    conv.store.incr(conv.id, "turns")
    return entry


def upstream_body(body: ChatBody, turn: Turn, split: Split, reserve: int) -> dict[str, Any]:
    data = body.model_dump(exclude_none=True, exclude={"messages", "user", "stream"})
    if "stream" in body.model_fields_set and not body.stream:
        data["stream"] = False  # as the client wrote it (LangChain, LlamaIndex do)
    messages = [m.to_json(turn.media) for m in turn.prompt.messages]
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
    check_headers(headers)
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
        completion, *others = completions_of(answer.payload)
    except UpstreamError as error:
        await _failed(svc, turn, error)
        raise
    await _store_reply(svc, slot, turn, completion, answer.seconds, others)
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
    svc: Service,
    slot: Slot,
    turn: Turn,
    completion: Completion,
    upstream_s: float,
    others: Sequence[Completion] = (),
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
            await run_in_threadpool(finish_turn, turn, completion, others)
        except Exception:
            svc.metrics.error(turn.tenant, "reply_not_stored")
            log.exception("the reply to %s #%s was not stored", turn.conv.id, turn.entry.seq)
        finally:
            slot.lock.release()
        try:
            await run_in_threadpool(turn.conv.kioku.layers.tic_alerts, turn.conv.id)
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
        state = StreamState("the upstream")
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
                    try:
                        state.take(value)
                    except ModelError as e:  # a line that is not JSON: the stream is broken
                        kind, value = "error", UpstreamError(502, f"{e}; the reply was not stored")
                if kind == "line" and state.error is not None:
                    yield value + "\n"  # the upstream's own error event, as it wrote it
                    await _failed(svc, turn, UpstreamError(502, f"the upstream: {state.error}"))
                    return
                if kind == "line":
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
                    f"{len(state.text)} chars; the reply was not stored",
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
                        detail=f"{len(state.text)} chars relayed",
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
    others = state.completions()[1:]
    await _store_reply(svc, slot, turn, completion, time.monotonic() - opened, others)
    return True
