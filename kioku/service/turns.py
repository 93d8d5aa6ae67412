"""One turn at a time per conversation, and requests that change nothing twice.

Measured before (issue 11): a double submit, or a client's retry while the first request ran,
stored the user message once and the reply up to 12 times, and every later stateless turn of
that conversation got 409 "would rewrite 11 stored messages": it was jammed.

A turn (store what is new, call the model, store the reply) now holds the conversation's turn
lock from its start to its end: an asyncio lock per conversation in this process (`Slot.lock`),
and across processes the store's lock (`kioku.store.turns`: an advisory lock on PostgreSQL, a lock
row on SQLite). Both are the conversation's store key's, never its name's (issue 43: keyed by
name, a rename let a turn under the old name and one under the new run at once on one
conversation): a request finds the key by the name once, takes the key's locks, and checks that
the name still leads there (else it follows the name). Every request is named:

- `Idempotency-Key: K` names it by K (per tenant, kept 24 h): K again gets the same reply, also
  after the first request finished or its process died; K with another body or conversation
  is refused (422);
- without a key, by its body while it runs: an identical request that arrives while the first
  is in flight waits for it and gets the same reply. Once the first has answered, an identical
  request is a new turn (for a stateless client: a regeneration) — send a key to retry exactly.

A request that waits longer than `wait_s` for the lock gets 409 "turn in progress" with
Retry-After. Each reply is stored with the name of its request (`meta.request`), so whoever
takes over the lock of a process that died finds a reply that process stored but never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from kioku.chat_messages import chat_message
from kioku.errors import InputError, KeyReused, NameMoved, NotFound, TurnInProgress
from kioku.messages import LogEntry
from kioku.owners import may_be_alive, new_owner
from kioku.store import Store
from kioku.store.turns import DEFAULT_TURN_LEASE_S, HeldTurn, TurnState

if TYPE_CHECKING:
    from kioku.service.slot import Slot

log = logging.getLogger("kioku.service")

IDEMPOTENCY_HEADER = "idempotency-key"
MAX_KEY_LENGTH = 255
REQUEST_META = "request"  # the reply's meta key naming the request it answers
_FOLLOWS = 8  # a name that moves to another key this often while a request waits: 409
_MAX_HINTS = 10_000


@dataclass(frozen=True)
class RequestName:
    name: str  # "k:<hash of the Idempotency-Key>" or "b:<hash of the request>"
    fingerprint: str  # the request itself: a key sent again must come with the same one
    keyed: bool


# hashlib lets go of the GIL for a larger piece, and the event loop then waits to get it back
# from the threads storing turns: hash in smaller pieces, it is quicker here
_GIL_PIECE = 2047


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = memoryview(p.encode() if isinstance(p, str) else p)
        for i in range(0, len(data), _GIL_PIECE):
            h.update(data[i : i + _GIL_PIECE])
        h.update(b"\0")
    return h.hexdigest()[:32]


def name_request(
    key: str | None, raw: bytes, *, tenant: str, conversation: str, shape: str = ""
) -> RequestName:
    """Name a request by its Idempotency-Key, else by its body. `shape`: the headers that
    change what the turn does (mode, character)."""
    fingerprint = _digest(conversation, raw, shape)
    if key is None:
        return RequestName("b:" + _digest(tenant, fingerprint), fingerprint, keyed=False)
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise InputError(
            f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters (a UUID is fine)"
        )
    return RequestName("k:" + _digest(key), fingerprint, keyed=True)


@dataclass(frozen=True)
class Replay:
    """The reply another run of the same request stored."""

    entry: LogEntry


class Owner:
    """A service in this process, as the turn lock names it: host, pid and a token (a new
    process can get an old pid; `kioku.owners`)."""

    def __init__(self) -> None:
        self.name = new_owner()

    def alive(self, other: str) -> bool:
        """Whether the process that wrote `other` may still run (unknown hosts: yes; the lease
        decides for them)."""
        return may_be_alive(other)


@dataclass(eq=False)
class Ticket:
    """A held turn, with what `then` made of it (see `Gate.enter`). End it exactly once: with
    the reply's seq, or None (no reply)."""

    gate: Gate
    slot: Slot
    held: HeldTurn
    request: RequestName
    value: Any = None
    heartbeat: asyncio.Task[None] | None = None
    finished: bool = False

    @property
    def previous(self) -> TurnState:
        return self.held.previous

    def end(self, reply_seq: int | None, release: bool = True) -> None:
        """Release the store's lock, recording the reply (in a thread: it writes). With
        `release=False` (inside the transaction that stores the reply) call `release_store`
        once that has committed."""
        self.gate.end(self.held, self.request, reply_seq, release)

    def release_store(self) -> None:
        self.gate.store.release_turn(self.held)

    def released(self) -> None:
        """After `end`: let the next turn of this process in."""
        if self.finished:
            return
        self.finished = True
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        self.slot.lock.release()

    async def finish(self, reply_seq: int | None) -> None:
        if self.finished:
            return
        try:
            await run_in_threadpool(self.end, reply_seq)
        finally:
            self.released()

    def finish_soon(self, after: asyncio.Task[Any] | None = None) -> None:
        """Finish from code that may be cancelled (a stream the client left): in a task of its
        own, or not at all if `after` (the reply's commit) is running: it ends the turn."""
        if self.finished or after is not None:
            return
        self.gate.spawn(self.finish(None))


class Gate:
    """Admits one turn at a time per conversation (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        wait_s: float,
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
        slot: Callable[[str, str], Slot],
        lease_s: float = DEFAULT_TURN_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.wait_s = wait_s
        self.spawn = spawn
        self.slot = slot  # (tenant, the store's key) → this process's slot of it
        self.lease_s = lease_s
        self.clock = clock
        self.owner = Owner()
        # (tenant, name) → the key it led to last: a hint that saves a thread hop per turn;
        # `_attempt` checks it once the lock is held, and a stale one is followed
        self._hints: dict[tuple[str, str], str] = {}

    def _busy(self, conversation: str, wait_s: float) -> TurnInProgress:
        return TurnInProgress(
            f"turn in progress: conversation {conversation!r} is answering another request "
            f"(waited {wait_s:g} s); send this one again when it is done",
            retry_after_s=max(1.0, wait_s / 4),
        )

    def _entry(self, tenant: str, key: str, seq: int | None) -> LogEntry | None:
        if seq is None:
            return None
        try:
            self.store.conversation(key, tenant=tenant)  # a record of this tenant's only
        except NotFound:
            return None
        found = self.store.entries_at(key, [seq])
        return found[0] if found and found[0].role == "assistant" else None

    async def replayed(self, tenant: str, request: RequestName) -> Replay | None:
        """For a keyed request: the reply its key already got (KeyReused for another body)."""
        if not request.keyed:
            return None
        record = await run_in_threadpool(
            self.store.idempotency_key, tenant, request.name, now=self.clock()
        )
        if record is None:
            return None
        if record.fingerprint != request.fingerprint:
            raise KeyReused(
                "this Idempotency-Key was first sent with another request (another body or "
                f"conversation, {time.time() - record.created_at:.0f} s ago); use a new key "
                "for a new request"
            )
        entry = await run_in_threadpool(self._entry, tenant, record.conversation, record.reply_seq)
        return Replay(entry) if entry is not None else None

    async def enter(
        self,
        tenant: str,
        name: str,
        request: RequestName,
        arrived: float,
        then: Callable[[HeldTurn, Slot], Any] | None = None,
        *,
        create: bool = True,
        wait_s: float | None = None,
    ) -> Ticket | Replay:
        """Wait for the turn of the conversation named `name` (409 after `wait_s`), found by
        its name once and then held by its key: the key's lock here and in the store. Returns
        the held turn (`held.conversation`: the key) with `then(held, slot)` (run in the same
        thread that took the lock: one hop for both), or the reply an identical request got
        while this one waited (the turn then is not held). A name unknown once the lock is
        held is a new conversation (its key planned, `Store.planned_key`), or NotFound without
        `create`. A name that moved to another key while this one waited (a rename, another
        first turn) is followed to that key. `wait_s`: a shorter wait than a turn's."""
        wait_s = self.wait_s if wait_s is None else min(wait_s, self.wait_s)
        deadline = time.monotonic() + wait_s
        for _ in range(_FOLLOWS):
            key = self._hints.get((tenant, name))
            if key is None:
                key = await run_in_threadpool(self._key, tenant, name, create)
            slot = self.slot(tenant, key)
            try:
                await asyncio.wait_for(slot.lock.acquire(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise self._busy(name, wait_s) from None
            try:
                delay = 0.005
                while True:
                    got = await run_in_threadpool(
                        self._attempt, slot, tenant, name, key, request, arrived, then, create
                    )
                    if got is not None:
                        break
                    if time.monotonic() + delay > deadline:
                        raise self._busy(name, wait_s)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
            except NameMoved:
                slot.lock.release()
                self._hints.pop((tenant, name), None)
                continue
            except NotFound:
                slot.lock.release()
                self._hints.pop((tenant, name), None)
                raise
            except BaseException:
                slot.lock.release()
                raise
            held, outcome = got
            if isinstance(outcome, Replay):
                slot.lock.release()  # `_attempt` already ended the turn
                return outcome
            ticket = Ticket(self, slot, held, request, outcome)
            if not self.store.is_postgres:
                ticket.heartbeat = asyncio.create_task(self._renew(held))
            return ticket
        raise self._busy(name, wait_s)

    @contextlib.asynccontextmanager
    async def turn(
        self,
        tenant: str,
        name: str,
        request: RequestName,
        arrived: float,
        then: Callable[[HeldTurn, Slot], Any] | None = None,
    ) -> AsyncIterator[Ticket | Replay]:
        """`enter`, as one block around the turn: a turn the block leaves with an error is
        ended (in a task of its own: the block may be cancelled); one it leaves normally has
        ended with its reply, or belongs to the stream that relays it (`Ticket.finish_soon`)."""
        held = await self.enter(tenant, name, request, arrived, then=then)
        try:
            yield held
        except BaseException:
            if isinstance(held, Ticket):
                held.finish_soon()  # nothing if the turn already ended (or a stream took it)
            raise

    def forget(self, tenant: str, name: str) -> None:
        """A name this process renamed away: its next request looks it up again."""
        self._hints.pop((tenant, name), None)

    def _key(self, tenant: str, name: str, create: bool) -> str:
        """The key of the conversation named `name`, or the key it would get."""
        key = self.store.conversation_key(tenant, name)
        if key is not None:
            return key
        if not create:
            raise NotFound(f"no conversation {name!r}; `kioku memory` lists them")
        return self.store.planned_key(tenant, name)

    def _attempt(
        self,
        slot: Slot,
        tenant: str,
        name: str,
        key: str,
        request: RequestName,
        arrived: float,
        then: Callable[[HeldTurn, Slot], Any] | None,
        create: bool,
    ) -> tuple[HeldTurn, Any] | None:
        """Take the key's lock (None: held elsewhere); see that the name still leads to it
        (`NameMoved` if not); then the reply to replay, or `then(held, slot)`."""
        held = self.store.take_turn(
            tenant,
            key,
            self.owner.name,
            request.name,
            now=self.clock(),
            lease_s=self.lease_s,
            alive=self.owner.alive,
        )
        if held is None:
            return None
        try:
            now = self.store.conversation_key(tenant, name)
            if now is None and not create:
                raise NotFound(f"no conversation {name!r}; `kioku memory` lists them")
            if now is None and self.store.planned_key(tenant, name) != key:
                raise NameMoved(f"the key {key!r} was taken while {name!r} waited")
            if now is not None and now != key:
                raise NameMoved(f"{name!r} is kept under {now!r} now")
            if now is None:
                slot.clear()  # a new conversation: nothing this process cached is of it
            if len(self._hints) >= _MAX_HINTS:
                self._hints.clear()
            self._hints[(tenant, name)] = key
            prev = held.previous
            seq: int | None = None
            if prev.done == request.name and (prev.done_at or 0.0) >= arrived:
                seq = prev.done_seq  # it finished while this one waited
            elif prev.running == request.name:
                seq = self._stored_by_the_dead(key, request)
            entry = self._entry(tenant, key, seq) if seq is not None else None
            if entry is not None:
                self.end(held, request, entry.seq)
                return held, Replay(entry)
            return held, then(held, slot) if then is not None else None
        except BaseException:
            self.end(held, request, None)
            raise

    def end(
        self, held: HeldTurn, request: RequestName, reply_seq: int | None, release: bool = True
    ) -> None:
        """Release the store's lock of a turn, recording the reply that `request` got."""
        done = reply_seq is not None
        try:
            self.store.end_turn(
                held,
                now=self.clock(),
                done=request.name if done else None,
                done_seq=reply_seq,
                key=(request.name, request.fingerprint) if request.keyed and done else None,
                release=release,
            )
        except Exception:
            # the lock row keeps this owner until its lease is over (PostgreSQL: the session
            # that held the lock is closed, and the lock with it)
            log.exception("could not release the turn lock of %s", held.conversation)

    def _stored_by_the_dead(self, key: str, request: RequestName) -> int | None:
        """The seq of the reply a process that died during this request had already stored."""
        try:
            last = self.store.tail(key, 1)
        except NotFound:
            return None
        if last and last[0].role == "assistant" and last[0].meta.get(REQUEST_META) == request.name:
            return last[0].seq
        return None

    async def _renew(self, held: HeldTurn) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                ok = await run_in_threadpool(
                    self.store.renew_turn, held, now=self.clock(), lease_s=self.lease_s
                )
            except Exception:
                log.exception("could not renew the turn lock of %s", held.conversation)
                continue
            if not ok:
                log.warning("the turn lock of %s was taken over", held.conversation)
                return


# a replayed reply, in the shape the client asked for ---------------------------------------


def replay_response(conversation: str, replay: Replay, *, stream: bool, model: str) -> Response:
    """The stored reply as a completion (or a stream of one), tool calls included."""
    entry = replay.entry
    message = chat_message(entry.message).to_json()
    calls = message.get("tool_calls") or []
    finish = str(entry.meta.get("finish_reason") or ("tool_calls" if calls else "stop"))
    headers = {
        "X-Kioku-Conversation": quote(conversation, safe=""),
        "X-Kioku-Reply-Seq": str(entry.seq),
        "X-Kioku-Replayed": "true",
    }
    base = {
        "id": f"chatcmpl-kioku-{entry.seq}",
        "created": int(entry.message.at.timestamp()) if entry.message.at else int(time.time()),
        "model": model,
    }
    if not stream:
        return JSONResponse(
            {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": 0,
                    "completion_tokens": entry.tokens,
                    "total_tokens": entry.tokens,
                },
            },
            headers=headers,
        )
    chunk = {**base, "object": "chat.completion.chunk"}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
    deltas = [
        {"index": 0, "delta": delta},
        {"index": 0, "delta": {}, "finish_reason": finish},
    ]
    events = [f"data: {json.dumps({**chunk, 'choices': [d]})}\n\n" for d in deltas]
    events.append("data: [DONE]\n\n")
    return StreamingResponse(
        iter(events),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache"},
    )
