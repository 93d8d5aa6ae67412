"""The turn lock and the idempotency record, in the database every `kioku serve` process shares.

One turn at a time per conversation (store the user message, call the model, store the reply),
across processes and hosts, so that a double submit or a client's retry can neither store a
reply twice nor interleave with another turn:

The lock is the conversation's store key's (`ConversationInfo.id`), never its name: a rename
moves the name, and the turns under either name still take one lock (`kioku.service.turns`).

- PostgreSQL: a session advisory lock, held on a connection of its own for the whole turn. A
  process that dies drops its connection and, with it, the lock. Its key is 64 bits of a hash of
  tenant and conversation (`kioku.store.db.lock_key`), so two conversations of any tenants never share
  a lock (a 32-bit `hashtext` made one tenant's turns wait for another's).
- SQLite (one host): the `turn_locks` row is the lock. Its owner (host, pid, a token per
  process) holds it until a lease that the turn renews; a lock whose owner is dead (no such
  process on this host) or whose lease ran out is taken over at once.

Either way the row records the request that ran last (`done`, the seq of its reply, when) and
the request that was running when its owner died (`running`), which is what lets a duplicate get
the same reply instead of a second one (see `kioku.service.turns`).

`Idempotency-Key`s are kept per tenant (a hash of the key, the request's fingerprint, the reply's
seq) for `IDEMPOTENCY_TTL_S`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    create_engine,
    delete,
    select,
    text,
    update,
)

from kioku.store import schema as s
from kioku.store.db import Database, lock_key

DEFAULT_TURN_LEASE_S = 30.0
IDEMPOTENCY_TTL_S = 24 * 3600.0
# connections that hold turn locks: one per turn in flight in a process, beside the store's pool
TURN_LOCK_POOL = 16
TURN_LOCK_OVERFLOW = 512


@dataclass(frozen=True)
class TurnState:
    """What the turn lock's row said when it was taken."""

    running: str | None = None  # the request of an owner that died during its turn
    done: str | None = None  # the last request that ended with a reply
    done_seq: int | None = None  # that reply's seq
    done_at: float | None = None
    last_owner: str | None = None  # who held the lock last (to drop caches another one stales)


@dataclass
class HeldTurn:
    tenant: str
    conversation: str
    owner: str
    previous: TurnState
    session: Connection | None = field(default=None, repr=False)  # PostgreSQL: holds the lock


@dataclass(frozen=True)
class KeyRecord:
    fingerprint: str
    conversation: str
    reply_seq: int
    created_at: float


_LOCK_ROW = select(s.turn_locks).where(
    s.turn_locks.c.tenant == bindparam("tenant"),
    s.turn_locks.c.conversation == bindparam("conversation"),
)
_END_TURN = (
    update(s.turn_locks)
    .where(
        s.turn_locks.c.tenant == bindparam("of_tenant"),
        s.turn_locks.c.conversation == bindparam("of_conversation"),
        s.turn_locks.c.owner == bindparam("of_owner"),
    )
    .values({c: bindparam(f"new_{c}") for c in ("owner", "lease_until", "running", "last_owner")})
)
_END_TURN_DONE = _END_TURN.values(
    {c: bindparam(f"new_{c}") for c in ("done", "done_seq", "done_at")}
)


def turn_lock_key(tenant: str, conversation: str) -> int:
    """The PostgreSQL advisory lock key of a conversation's turns."""
    return lock_key("turn", tenant, conversation)


class TurnLocks(Database):
    """Turn locks and idempotency keys (a base of `Store`)."""

    _lock_engine: Engine | None = None

    def _locks(self) -> Engine:
        if self._lock_engine is None:
            self._lock_engine = create_engine(
                self.engine.url,
                pool_size=TURN_LOCK_POOL,
                max_overflow=TURN_LOCK_OVERFLOW,
                pool_pre_ping=True,
                isolation_level="AUTOCOMMIT",  # a session lock, never an open transaction
            )
        return self._lock_engine

    def close(self) -> None:
        super().close()
        if self._lock_engine is not None:
            self._lock_engine.dispose()

    # the lock ----------------------------------------------------------------------------

    def take_turn(
        self,
        tenant: str,
        conversation: str,
        owner: str,
        request: str,
        *,
        now: float,
        lease_s: float = DEFAULT_TURN_LEASE_S,
        alive: Callable[[str], bool] = lambda owner: True,
    ) -> HeldTurn | None:
        """Take the conversation's turn lock for `request`, or None while another holds it.
        `alive(owner)` says whether another owner's process still runs (SQLite)."""
        session: Connection | None = None
        if self.is_postgres:
            session = self._locks().connect()
            try:
                got = session.execute(
                    text("SELECT pg_try_advisory_lock(:k)"),
                    {"k": turn_lock_key(tenant, conversation)},
                ).scalar()
            except Exception:
                session.invalidate()
                session.close()
                raise
            if not got:
                session.close()
                return None
        try:
            previous = self._claim(tenant, conversation, owner, request, now, lease_s, alive)
        except BaseException:
            if session is not None:
                self._unlock(session, tenant, conversation)
            raise
        if previous is None:
            return None
        return HeldTurn(tenant, conversation, owner, previous, session)

    def _claim(
        self,
        tenant: str,
        conversation: str,
        owner: str,
        request: str,
        now: float,
        lease_s: float,
        alive: Callable[[str], bool],
    ) -> TurnState | None:
        with self.atomic() as conn:
            row = conn.execute(_LOCK_ROW, {"tenant": tenant, "conversation": conversation}).first()
            held = row is not None and row.owner is not None
            if (
                row is not None
                and held
                and not self.is_postgres  # there the advisory lock already excludes the others
                # this process's own lock too: two `Slot`s of one conversation (one evicted
                # while in use) must not both hold it; a release that failed waits for the lease
                and (row.lease_until or 0.0) > now
                and alive(row.owner)
            ):
                return None
            conn.execute(
                self._built("claim_turn", self._claim_statement),
                dict(
                    tenant=tenant,
                    conversation=conversation,
                    owner=owner,
                    lease_until=now + lease_s,
                    running=request,
                ),
            )
        if row is None:
            return TurnState()
        return TurnState(
            running=row.running if held else None,
            done=row.done,
            done_seq=row.done_seq,
            done_at=row.done_at,
            last_owner=row.owner if held else row.last_owner,
        )

    def renew_turn(self, held: HeldTurn, *, now: float, lease_s: float) -> bool:
        """Extend a held lock's lease; False if it was lost (taken over after it expired)."""
        t = s.turn_locks
        with self.atomic() as conn:
            done = conn.execute(
                update(t)
                .where(
                    t.c.tenant == held.tenant,
                    t.c.conversation == held.conversation,
                    t.c.owner == held.owner,
                )
                .values(lease_until=now + lease_s)
            )
        return bool(done.rowcount)

    def _claim_statement(self) -> Any:
        t = s.turn_locks
        stmt = self._upsert(t)
        new = {c: stmt.excluded[c] for c in ("owner", "lease_until", "running")}
        return stmt.on_conflict_do_update(index_elements=[t.c.tenant, t.c.conversation], set_=new)

    def end_turn(
        self,
        held: HeldTurn,
        *,
        now: float,
        done: str | None = None,
        done_seq: int | None = None,
        key: tuple[str, str] | None = None,
        release: bool = True,
    ) -> None:
        """Release the lock; with `done`, record that request's reply (and with `key`, the
        Idempotency-Key hash and fingerprint that name it for `IDEMPOTENCY_TTL_S`). Inside a
        caller's `atomic()` pass `release=False` and `release_turn` once it has committed: on
        PostgreSQL the advisory lock must outlive what the turn wrote."""
        k = s.idempotency_keys
        values: dict[str, Any] = dict(
            owner=None, lease_until=None, running=None, last_owner=held.owner
        )
        ends = _END_TURN
        if done is not None:
            values |= dict(done=done, done_seq=done_seq, done_at=now)
            ends = _END_TURN_DONE
        try:
            with self.atomic() as conn:
                # a lock taken over is no longer ours to end
                where = dict(
                    of_tenant=held.tenant, of_conversation=held.conversation, of_owner=held.owner
                )
                conn.execute(ends, {f"new_{c}": v for c, v in values.items()} | where)
                if key is not None and done_seq is not None:
                    conn.execute(delete(k).where(k.c.created_at < now - IDEMPOTENCY_TTL_S))
                    conn.execute(
                        self._insert_ignore(k).values(
                            tenant=held.tenant,
                            key=key[0],
                            fingerprint=key[1],
                            conversation=held.conversation,
                            reply_seq=done_seq,
                            created_at=now,
                        )
                    )
        finally:
            if release:
                self.release_turn(held)

    def release_turn(self, held: HeldTurn) -> None:
        """Let go of PostgreSQL's advisory lock (the row says the lock is free already)."""
        if held.session is not None:
            self._unlock(held.session, held.tenant, held.conversation)
            held.session = None

    def _unlock(self, session: Connection, tenant: str, conversation: str) -> None:
        if session.closed or session.invalidated:
            return  # the session is gone, and its lock with it
        try:
            session.execute(
                text("SELECT pg_advisory_unlock(:k)"),
                {"k": turn_lock_key(tenant, conversation)},
            )
        except Exception:
            # a session that may still hold the lock must not go back to the pool
            session.invalidate()
        finally:
            session.close()

    # idempotency keys --------------------------------------------------------------------

    def idempotency_key(self, tenant: str, key: str, *, now: float) -> KeyRecord | None:
        k = s.idempotency_keys
        with self.reading() as conn:
            row = conn.execute(
                select(k).where(
                    k.c.tenant == tenant,
                    k.c.key == key,
                    k.c.created_at >= now - IDEMPOTENCY_TTL_S,
                )
            ).first()
        if row is None:
            return None
        return KeyRecord(row.fingerprint, row.conversation, int(row.reply_seq), row.created_at)
