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
the prefix-cache base; the parts the client marks as changing each turn are moved out of it,
`kioku.service.card_parts`); system messages further down (author's notes at their depth,
post-history instructions) are not stored: they go upstream where the client put them
(`kioku.client_parts`), counted in the prompt's budget.

Tool calls, tool results and content parts (images) are stored with their messages and sent
upstream as the client wrote them (`kioku.chat_messages`). With `n > 1`, choice 0 is the stored
reply; the other choices are kept beside it (`Store.choices`).

What a request is — a turn, a swipe, a continue, or a side request that stores nothing (quiet,
impersonate, SillyTavern's Test Message) — is decided in `kioku.service.generation`; storing it
and building its prompt in `kioku.service.chat_turn`; the message list sent upstream is made to
alternate roles by `kioku.alternation`, last.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from kioku.alternation import alternate
from kioku.errors import BadParameter, InputError, UpstreamError
from kioku.ids import is_valid_id, key_for
from kioku.messages import LogEntry
from kioku.models import Completion
from kioku.service import generation as gen
from kioku.service.chat_request import MAX_NAME_LENGTH, ChatBody, split_messages
from kioku.service.chat_turn import (
    Request,
    Turn,
    note_failure,
    note_interrupted,
    start_side,
    start_turn,
    store_reply,
)
from kioku.service.conventions import check_headers, header_text, speakers_of, volatile_of
from kioku.service.metrics import prefix_reuse
from kioku.service.relay import Hooks, open_stream, relay
from kioku.service.turns import (
    IDEMPOTENCY_HEADER,
    Replay,
    Ticket,
    name_request,
    replay_response,
)
from kioku.service.upstream import completions_of
from kioku.store.turns import HeldTurn

if TYPE_CHECKING:
    from kioku.service.slot import Slot
    from kioku.service.state import Service

log = logging.getLogger("kioku.service")

CONVERSATION_HEADER = "x-kioku-conversation"
CHARACTER_HEADER = "x-kioku-character"
MODE_HEADER = "x-kioku-mode"  # stateful | stateless (default: one message = stateful)
EXAMPLES_HEADER = "x-kioku-examples"
PARENT_HEADER = "x-kioku-parent"


def upstream_body(body: ChatBody, turn: Turn, reserve: int) -> dict[str, Any]:
    data = body.model_dump(exclude_none=True, exclude={"messages", "user", "stream"})
    if "stream" in body.model_fields_set and not body.stream:
        data["stream"] = False  # as the client wrote it (LangChain, LlamaIndex do)
    # the client's own parts (author's notes, world info, post-history instructions) are in
    # the prompt already, where it put them (`kioku.client_parts`)
    messages = [m.to_json(turn.media) for m in turn.prompt.messages]
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


def conversation_key(svc: Service, tenant: str, name: str) -> str:
    """The id a chat name is kept under (`kioku.ids.key_for`): a name a URL cannot carry gets
    an encoded id, unless a conversation was stored under the name itself before the rule."""
    if is_valid_id(name) or svc.conversation_key(tenant, name) is not None:
        return name
    return key_for(name)


async def chat(
    svc: Service, body: ChatBody, tenant: str, headers: dict[str, str], raw: bytes = b""
) -> Response:
    arrived, started = time.time(), time.monotonic()
    check_headers(headers)
    cid = header_text(headers.get(CONVERSATION_HEADER)) or body.user or ""
    generation = gen.generation_of(headers.get(gen.GENERATION_HEADER))
    side = generation in gen.SIDE  # nothing stored: no turn lock, no new id
    if not cid.strip() and not side:
        raise InputError(
            "name the conversation: send the header X-Kioku-Conversation (or the `user` field)"
        )
    if cid and not is_valid_id(cid):
        cid = await run_in_threadpool(conversation_key, svc, tenant, cid)
    given_character = header_text(headers.get(CHARACTER_HEADER)) or ""
    user = header_text(headers.get(gen.USER_HEADER))
    for header, name in ((CHARACTER_HEADER, given_character), (gen.USER_HEADER, user)):
        if name and len(name) > MAX_NAME_LENGTH:
            shown = header.title()  # X-Kioku-Character
            raise BadParameter(f"{shown} is over {MAX_NAME_LENGTH} characters", shown)
    as_sent = svc.settings.card_as_sent  # the ablation: the card as the client sent it
    split = split_messages(
        body.messages,
        volatile=frozenset() if as_sent else volatile_of(headers),
        user=user or "",
        character=given_character,
        speakers=speakers_of(headers),
    )
    mode = headers.get(MODE_HEADER, "").lower()
    parent = header_text(headers.get(PARENT_HEADER))
    req = Request(
        stateful={"stateful": True, "stateless": False}.get(mode),
        character=given_character
        or next((m.name for m in split.chat if m.role == "assistant" and m.name), ""),
        generation=generation,
        user=user,
        examples="" if as_sent else (headers.get(EXAMPLES_HEADER) or "").strip().lower(),
        speakers=speakers_of(headers),
        parent=key_for(parent) if parent and parent != cid else None,
    )
    character = req.character
    if side:
        turn = await run_in_threadpool(start_side, svc, tenant, cid, split, character, started)
        return await _run(svc, body, tenant, None, turn)
    request = name_request(
        header_text(headers.get(IDEMPOTENCY_HEADER)),
        raw,
        tenant=tenant,
        conversation=cid,
        shape=f"{mode}\0{character}\0{generation}\0{user}\0{req.examples}\0{req.speakers}",
    )
    replay = await svc.gate.replayed(tenant, request)
    if replay is None:

        def begin(held: HeldTurn, slot: Slot) -> Turn:
            # another process ran the last turn, or the lock has no record (a first turn, or
            # the conversation was deleted by `kioku delete`): what this one cached may be stale
            fresh = held.previous.last_owner != svc.gate.owner.name
            return start_turn(
                svc, slot, tenant, cid, held.conversation, split, req, started, fresh=fresh
            )

        async with svc.gate.turn(tenant, cid, request, arrived, then=begin) as held:
            if not isinstance(held, Replay):
                return await _run(svc, body, tenant, held, held.value)
            replay = held
    return replay_response(cid, replay, stream=body.stream, model=body.model or "")


async def _run(
    svc: Service, body: ChatBody, tenant: str, ticket: Ticket | None, turn: Turn
) -> Response:
    """The turn, holding its ticket (its message stored, its prompt built; a side request has
    none): upstream, commit the reply, respond."""
    if ticket is not None and not turn.side:
        slot = ticket.slot
        reuse = prefix_reuse(slot.remember_prompt(turn.prompt.messages), turn.prompt.messages)
        svc.metrics.prefix_reuse.observe(tenant, reuse)
    svc.metrics.prompt_tokens.observe(tenant, turn.prompt.tokens)
    data = upstream_body(body, turn, svc.profile.response_reserve)
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
    """Count, log (with the cause: the access line only says 502) and record a failure; a
    refusal for size teaches the service the upstream's window (`WindowKeeper.learn`)."""
    svc.window.learn(error, turn.prompt.tokens)
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
    await run_in_threadpool(note_failure, turn, error)


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
        ended = functools.partial(ticket.end, release=False)
        reply = store_reply(turn, completion, others, ticket.request.name, ended)
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


async def _stream(
    svc: Service, turn: Turn, data: dict[str, Any], ticket: Ticket | None
) -> Response:
    """Relay the upstream's SSE (`kioku.service.relay`); what it stores, the turn does."""

    async def failed(error: UpstreamError) -> None:
        await _failed(svc, turn, error)

    async def commit(
        completion: Completion, upstream_s: float, others: Sequence[Completion]
    ) -> LogEntry | None:
        return await _commit(svc, ticket, turn, completion, upstream_s, others)

    def ended(committing: asyncio.Task[LogEntry | None] | None) -> None:
        if ticket is not None:
            ticket.finish_soon(after=committing)

    def interrupted(relayed: int) -> None:
        if not turn.side:  # the client hung up (or the upstream broke): the message stays
            asyncio.get_running_loop().run_in_executor(None, note_interrupted, turn, relayed)

    opened = await open_stream(svc.upstream, data, svc.keepalive_s, failed)
    hooks = Hooks(failed, commit, ended, interrupted, turn.conversation_id)
    return StreamingResponse(
        relay(opened, hooks),
        media_type="text/event-stream",
        headers={**kioku_headers(turn), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
