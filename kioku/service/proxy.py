"""One turn through the proxy: sync the request with the log, build kioku's prompt, forward it,
record the reply.

Store first: the request's new messages are stored (and the turn's compaction applied) before
the upstream is called, so an upstream failure or a client that hangs up loses nothing the
client wrote. The reply is committed before the last byte of the response: before responding,
or, streaming, before the event that carries `finish_reason` and `[DONE]`, so a process killed
at any point never loses a reply a client received, and a read right after a 200 sees it. The
whole turn holds the conversation's turn lock (`kioku.service.turns`): one turn at a time,
across processes, and a duplicate or a retry gets the reply its first run got.

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

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from kioku import protocol
from kioku.alternation import alternate
from kioku.context import Prompt
from kioku.engine import Conversation
from kioku.errors import BadParameter, InputError, ModelError, UpstreamError
from kioku.ids import check_id, is_valid_id
from kioku.messages import LogEntry
from kioku.models import Completion
from kioku.service import generation as gen
from kioku.service.cards import note_card, stored_card
from kioku.service.chat_request import MAX_NAME_LENGTH, ChatBody, Split, split_messages
from kioku.service.conventions import check_headers, header_text
from kioku.service.metrics import prefix_reuse
from kioku.service.turns import (
    IDEMPOTENCY_HEADER,
    REQUEST_META,
    Replay,
    Ticket,
    name_request,
    replay_response,
)
from kioku.service.upstream import StreamState, completions_of
from kioku.store_turns import HeldTurn
from kioku.sync import Synced, SyncPlan, replace_reply, sync

if TYPE_CHECKING:
    from kioku.service.app import Service, Slot

log = logging.getLogger("kioku.service")

CONVERSATION_HEADER = "x-kioku-conversation"
CHARACTER_HEADER = "x-kioku-character"
MODE_HEADER = "x-kioku-mode"  # stateful | stateless (default: one message = stateful)


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
    conversation_id: str = ""  # as the client named it (the store's key may differ)

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
    *,
    fresh: bool = False,
    generation: gen.Generation | None = None,
    user: str | None = None,
) -> Turn:
    """Store what is new and build the prompt (runs in a thread, holding the turn lock).
    `fresh`: another process ran the last turn, so what this one cached may be stale."""
    kk = svc.kioku(tenant)
    if fresh:  # what this process read of the conversation may have changed since
        slot.transcripts = slot.user = None
    if fresh or slot.conv is None or (split.system is not None and split.system != slot.system):
        known = slot.conv is not None and not fresh
        old = slot.system if known else stored_card(kk.store, conversation_id, tenant)
        slot.conv = kk.conversation(
            conversation_id, system_prompt=split.system, character=character
        )
        note_card(kk.store, slot.conv.id, old, split.system)
        slot.system = split.system
        slot.character = slot.conv.info().character
    conv = slot.conv
    if gen.is_side(generation, split, stateful, gen.sends_transcripts(conv, slot)):
        return side_turn(tenant, conv, split, slot.character, started, conversation_id)
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
    return Turn(
        tenant,
        conv,
        synced,
        prompt,
        started,
        slot.character,
        media,
        extend=extend,
        conversation_id=conversation_id,
    )


def start_side(
    svc: Service, tenant: str, conversation_id: str, split: Split, character: str, started: float
) -> Turn:
    """A side request: the conversation's memory when it exists, nothing created or stored."""
    key = svc.conversation_key(tenant, conversation_id) if conversation_id else None
    conv = Conversation(svc.kioku(tenant), key or "")  # "": none, its memory is empty
    return side_turn(tenant, conv, split, character, started, conversation_id)


def side_turn(
    tenant: str,
    conv: Conversation,
    split: Split,
    character: str,
    started: float,
    conversation_id: str = "",
) -> Turn:
    """A side request's turn: its images come from the request itself (nothing of it is
    stored) or, for the raw window's, from the store."""
    prompt, entry = gen.side_prompt(conv, split, character)
    refs = protocol.refs_of(prompt.messages)
    blobs = {**conv.store.blobs(refs - split.blobs.keys()), **split.blobs}
    media = protocol.media_of({r: blobs[r] for r in refs if r in blobs})
    return Turn(
        tenant,
        conv,
        Synced(entry, SyncPlan()),
        prompt,
        started,
        character,
        media,
        side=True,
        conversation_id=conversation_id,
    )


def finish_turn(
    turn: Turn, completion: Completion, others: Sequence[Completion] = (), request: str = ""
) -> LogEntry | None:
    """Record the reply (a regeneration replaces the old one) with the name of the request it
    answers and, with n > 1, the other choices beside it; a reply with neither text nor tool
    calls is not stored."""
    conv = turn.conv
    if turn.side:
        return None
    if not completion.text.strip() and not completion.tool_calls:
        conv.store.log(conv.id, "reply", "not_stored", detail="no text and no tool calls")
        return None
    meta = {REQUEST_META: request} if request else None
    if turn.extend is not None:
        entry = gen.continued(conv, turn.extend, completion)
    elif turn.regenerate is not None:
        entry = replace_reply(conv, turn.regenerate, completion, turn.character, meta)
    else:
        entry = conv.record(completion, author=turn.character, meta=meta)
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


def kioku_headers(
    turn: Turn, upstream_s: float | None = None, reply: LogEntry | None = None
) -> dict[str, str]:
    h = {
        # percent-encoded UTF-8
        "X-Kioku-Conversation": quote(turn.conversation_id or turn.conv.id, safe=""),
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
    if reply is not None:
        h["X-Kioku-Reply-Seq"] = str(reply.seq)
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


def _check_conversation(svc: Service, tenant: str, conversation_id: str, param: str) -> None:
    """A new conversation's id must follow `kioku.ids`; one stored before the rule still works."""
    if svc.gate.resolve(tenant, conversation_id) is None:
        try:
            check_id(conversation_id)
        except InputError as e:
            raise BadParameter(str(e), param) from None


async def chat(
    svc: Service, body: ChatBody, tenant: str, headers: dict[str, str], raw: bytes = b""
) -> Response:
    arrived, started = time.time(), time.monotonic()
    check_headers(headers)
    cid = header_text(headers.get(CONVERSATION_HEADER)) or body.user or ""
    generation = gen.generation_of(headers.get(gen.GENERATION_HEADER))
    side = generation in gen.SIDE  # nothing stored: no turn lock, no new id
    if not cid and not side:
        raise InputError(
            "name the conversation: send the header X-Kioku-Conversation (or the `user` field)"
        )
    if not side and not is_valid_id(cid):
        param = "X-Kioku-Conversation" if headers.get(CONVERSATION_HEADER) else "user"
        await run_in_threadpool(_check_conversation, svc, tenant, cid, param)
    split = split_messages(body.messages)
    mode = headers.get(MODE_HEADER, "").lower()
    stateful = {"stateful": True, "stateless": False}.get(mode)
    character = header_text(headers.get(CHARACTER_HEADER)) or next(
        (m.name for m in split.chat if m.role == "assistant" and m.name), ""
    )
    user = header_text(headers.get(gen.USER_HEADER))
    for header, name in ((CHARACTER_HEADER, character), (gen.USER_HEADER, user)):
        if name and len(name) > MAX_NAME_LENGTH:
            shown = header.title()  # X-Kioku-Character
            raise BadParameter(f"{shown} is over {MAX_NAME_LENGTH} characters", shown)
    if side:
        turn = await run_in_threadpool(start_side, svc, tenant, cid, split, character, started)
        return await _run(svc, body, tenant, None, turn, split)
    request = name_request(
        header_text(headers.get(IDEMPOTENCY_HEADER)),
        raw,
        tenant=tenant,
        conversation=cid,
        shape=f"{mode}\0{character}\0{generation}\0{user}",
    )
    replay = await svc.gate.replayed(tenant, cid, request)
    if replay is None:
        slot = svc.slot(tenant, cid)

        def begin(held: HeldTurn) -> Turn:
            # another process ran the last turn: what this one cached may be stale
            last = held.previous.last_owner
            fresh = last is not None and last != svc.gate.owner.name
            return start_turn(
                svc, slot, tenant, cid, split, stateful, character, started,
                fresh=fresh, generation=generation, user=user,
            )  # fmt: skip

        held = await svc.gate.enter(slot, tenant, cid, request, arrived, then=begin)
        if not isinstance(held, Replay):
            try:
                return await _run(svc, body, tenant, held, held.value, split)
            except BaseException:
                held.finish_soon()  # nothing if the turn already ended (or a stream took it)
                raise
        replay = held
    return replay_response(cid, replay, stream=body.stream, model=body.model or "")


async def _run(
    svc: Service, body: ChatBody, tenant: str, ticket: Ticket | None, turn: Turn, split: Split
) -> Response:
    """The turn, holding its ticket (its message stored, its prompt built; a side request has
    none): upstream, commit the reply, respond."""
    if ticket is not None and not turn.side:
        slot = ticket.slot
        reuse = prefix_reuse(slot.last_prompt, turn.prompt.messages)
        slot.last_prompt = turn.prompt.messages
        svc.metrics.prefix_reuse.observe(tenant, reuse)
    svc.metrics.prompt_tokens.observe(tenant, turn.prompt.tokens)
    data = upstream_body(body, turn, split, svc.profile.response_reserve)
    if body.stream:
        return await _stream(svc, turn, data, ticket)
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
    reply = await _commit(svc, ticket, turn, completion, answer.seconds, others)
    return JSONResponse(answer.payload, headers=kioku_headers(turn, answer.seconds, reply))


async def _failed(svc: Service, turn: Turn, error: UpstreamError) -> None:
    """Count, log (with the cause: the access line only says 502) and record a failure."""
    cause = error.__cause__
    log.warning(
        "upstream %s (%s) for tenant %r, conversation %r, message #%s: %s%s",
        error.kind,
        error.status,
        turn.tenant,
        turn.conversation_id or turn.conv.id,
        turn.entry.seq,
        error.message,
        f" (cause: {cause!r})" if cause is not None else "",
    )
    svc.metrics.error(turn.tenant, error.kind)
    await run_in_threadpool(_note_failure, turn, error)


def _observe(svc: Service, turn: Turn, upstream_s: float) -> None:
    total = time.monotonic() - turn.started
    m = svc.metrics
    m.turn_seconds.observe(turn.tenant, total)
    m.upstream_seconds.observe(turn.tenant, upstream_s)
    m.overhead_seconds.observe(turn.tenant, max(0.0, total - upstream_s))


async def _commit(
    svc: Service,
    ticket: Ticket | None,
    turn: Turn,
    completion: Completion,
    upstream_s: float,
    others: Sequence[Completion] = (),
) -> LogEntry | None:
    """Store the reply and end the turn (the lock then names the request that got it), before
    the client sees the reply's last byte. Then the tic guard reads the new reply, off the
    response's path, so the next turn finds its alerts computed. A side request stores
    nothing."""
    if ticket is None or turn.side:
        if ticket is not None:  # a Test Message inside a turn: the turn ends with no reply
            await ticket.finish(None)
        _observe(svc, turn, upstream_s)
        return None

    def store_and_end() -> LogEntry | None:
        # the reply, its counters and the turn's end (with the request that got the reply)
        # commit as one transaction; PostgreSQL's lock is let go once it has
        with turn.conv.store.atomic():
            reply = finish_turn(turn, completion, others, ticket.request.name)
            ticket.end(reply.seq if reply is not None else None, release=False)
        ticket.release_store()
        return reply

    try:
        reply = await run_in_threadpool(store_and_end)  # one hop for both
    except BaseException:
        svc.metrics.error(turn.tenant, "reply_not_stored")
        await ticket.finish(None)
        raise
    ticket.released()
    _observe(svc, turn, upstream_s)

    async def tics() -> None:
        if reply is None:
            return
        try:
            await run_in_threadpool(turn.conv.kioku.layers.after_reply, turn.conv.id, reply)
        except Exception:
            log.exception("tic detection failed for %s", turn.conv.id)

    svc.spawn(tics())
    return reply


def _sse_error(error: UpstreamError) -> str:
    return f"data: {json.dumps(error.body())}\n\n"


async def _stream(
    svc: Service, turn: Turn, data: dict[str, Any], ticket: Ticket | None
) -> Response:
    """Relay the upstream's SSE. The status code is chosen once the upstream answered (or
    refused); an upstream slower than `svc.keepalive_s` gets a 200 with keep-alive comments,
    and an error after that arrives as an SSE `error` event. From the event that carries
    `finish_reason` on, the events are held back until the reply is stored."""
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
        task.cancel()
        await _failed(svc, turn, first[1])
        raise first[1]

    async def relay() -> AsyncIterator[str]:
        state = StreamState("the upstream")
        held_back: list[str] = []
        commit: asyncio.Task[LogEntry | None] | None = None

        async def commit_now() -> None:
            nonlocal commit
            completion = state.completion()
            assert completion is not None
            commit = asyncio.ensure_future(
                _commit(
                    svc,
                    ticket,
                    turn,
                    completion,
                    time.monotonic() - opened,
                    state.completions()[1:],
                )
            )
            await asyncio.shield(commit)

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
                    if commit is None and state.finish_reason is not None:
                        held_back.append(value + "\n")
                        if state.done:
                            await commit_now()
                            yield "".join(held_back)
                        continue
                    yield value + "\n"
                elif kind == "error":
                    await _failed(svc, turn, value)
                    yield _sse_error(value)
                    return
                elif kind == "end":
                    break
            if commit is None and state.completion() is not None:
                await commit_now()  # the upstream ended without [DONE]
                yield "".join(held_back)
            elif commit is None:
                error = UpstreamError(
                    502,
                    f"the upstream's stream ended without a finish_reason after "
                    f"{len(state.text)} chars; the reply was not stored",
                )
                await _failed(svc, turn, error)
                yield _sse_error(error)
        except Exception as e:
            # past the first byte a status can no longer say it: an error event does, never a
            # stream that just stops (kioku's own fault, so it is logged with its traceback)
            log.exception("the stream of conversation %r broke", turn.conversation_id)
            stored = (
                commit is not None
                and commit.done()
                and not commit.cancelled()
                and commit.exception() is None
            )
            yield _sse_error(
                UpstreamError(
                    500,
                    f"kioku failed while relaying the stream ({type(e).__name__}); the reply "
                    + ("was stored" if stored else "was not stored: send the request again"),
                    kind="server_error",
                    code="stream_failed",
                )
            )
        finally:
            if not task.done():
                task.cancel()
            if ticket is not None:
                ticket.finish_soon(after=commit)
            if commit is None and state.finish_reason is None and not turn.side:
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
