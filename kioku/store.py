"""The append-only log, memory items and durable jobs, on SQLite or PostgreSQL.

The store is the only module that talks to the database. Messages get a gap-free `seq` per
conversation inside the transaction that stores them; nothing here ever deletes a message.
A fold (apply memory, move the raw-window start) is one transaction, so a crash leaves either the
old memory state or the new one, never half of each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from kioku import schema as s
from kioku.errors import InputError, NotFound, StoreError
from kioku.memory import MemoryItem, coverage_gaps
from kioku.messages import LogEntry, Message, parts_from_json

DEFAULT_URL = "sqlite:///kioku.db"
DEFAULT_LEASE_S = 600.0
# namespace of the per-conversation advisory locks taken while claiming a job (PostgreSQL)
CLAIM_LOCK_NS = 0x6B696F


@dataclass(frozen=True)
class ConversationInfo:
    id: str
    tenant: str
    character: str
    system_prompt: str
    profile: str
    next_seq: int
    raw_start: int
    memory_version: int


@dataclass(frozen=True)
class Job:
    id: int
    conversation_id: str
    kind: str
    first_seq: int
    last_seq: int
    status: str
    attempts: int
    run_after: float
    payload: dict[str, Any]


def make_engine(url: str) -> Engine:
    """An engine with the settings kioku relies on (WAL and immediate write locks on SQLite)."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "before_cursor_execute", _refuse_nul)
        return engine
    scratch: str | None = None
    if url in ("sqlite://", "sqlite:///:memory:"):
        # An in-memory database lives in one connection, which threads (the background worker)
        # cannot share safely; a throwaway file behaves the same and is removed with the engine.
        scratch = tempfile.mkdtemp(prefix="kioku-")
        url = f"sqlite:///{os.path.join(scratch, 'scratch.db')}"
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    if scratch is not None:
        weakref.finalize(engine, shutil.rmtree, scratch, True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE: a deferred transaction that later
        # writes can deadlock against another writer instead of waiting for it.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers (`Store.atomic`) take the write lock up front; readers start deferred so that,
        # under WAL, they never queue behind a writer.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get(s.WRITE_FLAG) else "BEGIN")

    return engine


def _refuse_nul(
    _conn: Any, _cursor: Any, _statement: Any, parameters: Any, _ctx: Any, _many: Any
) -> None:
    """PostgreSQL text cannot hold a NUL character: refuse such input as bad input (nothing is
    stored), not as a database failure."""
    rows = parameters if isinstance(parameters, list | tuple) else [parameters]
    for row in rows:
        values = row.values() if isinstance(row, dict) else row
        if isinstance(values, str):
            values = [values]
        for v in values or ():
            if isinstance(v, str) and "\x00" in v:
                raise InputError(
                    "text with a NUL character (\\x00) cannot be stored in PostgreSQL; "
                    "remove it and send again"
                )


def _new_id(result: Any) -> int:
    return int(result.inserted_primary_key[0])


def _message_row(row: Any) -> LogEntry:
    at = datetime.fromisoformat(row.at) if row.at else None
    msg = Message(role=row.role, parts=parts_from_json(row.parts), author=row.author, at=at)
    return LogEntry(seq=row.seq, message=msg, tokens=row.tokens, meta=row.meta or {})


def _item_row(row: Any) -> MemoryItem:
    return MemoryItem(
        id=row.id,
        kind=row.kind,
        first_seq=row.first_seq,
        last_seq=row.last_seq,
        text=row.text,
        tokens=row.tokens,
        source=row.source,
        model=row.model,
        prompt_version=row.prompt_version,
        data=row.data or {},
        status=row.status,
        ready_at=row.ready_at,
        replaces=tuple(row.replaces or ()),
        stale=bool(row.stale),
    )


def _job_row(row: Any) -> Job:
    return Job(
        id=row.id,
        conversation_id=row.conversation_id,
        kind=row.kind,
        first_seq=row.first_seq,
        last_seq=row.last_seq,
        status=row.status,
        attempts=row.attempts,
        run_after=row.run_after,
        payload=dict(row.payload or {}),
    )


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        s.migrate(engine)

    @classmethod
    def open(cls, url: str = DEFAULT_URL) -> Store:
        if "://" not in url:
            url = f"sqlite:///{url}"
        return cls(make_engine(url))

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def _upsert(self, table: Any) -> Any:
        """The dialect's INSERT, which has `on_conflict_do_nothing/_do_update`."""
        return pg_insert(table) if self.is_postgres else sqlite_insert(table)

    def _insert_ignore(self, table: Any) -> Any:
        return self._upsert(table).on_conflict_do_nothing()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def atomic(self) -> Iterator[Connection]:
        try:
            with s.writing(self.engine) as conn:
                yield conn
        except SQLAlchemyError as e:
            raise StoreError(f"database error, transaction rolled back: {e}") from e

    # conversations -----------------------------------------------------------------------

    def ensure_conversation(
        self,
        conversation_id: str,
        *,
        tenant: str = "default",
        system_prompt: str | None = None,
        character: str = "",
        profile: str = "local-64k",
    ) -> ConversationInfo:
        with self.atomic() as conn:
            row = conn.execute(
                select(s.conversations).where(s.conversations.c.id == conversation_id)
            ).first()
            if row is None:
                # ON CONFLICT DO NOTHING: two first turns of one conversation may race here
                conn.execute(
                    self._insert_ignore(s.conversations).values(
                        id=conversation_id,
                        tenant=tenant,
                        character=character,
                        system_prompt=system_prompt or "",
                        profile=profile,
                        next_seq=0,
                        raw_start=0,
                        memory_version=0,
                        created_at=time.time(),
                    )
                )
            elif row.tenant != tenant:
                # another tenant's conversation: answer as if it did not exist
                raise NotFound(f"no conversation {conversation_id!r}")
            elif system_prompt is not None and system_prompt != row.system_prompt:
                conn.execute(
                    update(s.conversations)
                    .where(s.conversations.c.id == conversation_id)
                    .values(system_prompt=system_prompt)
                )
        return self.conversation(conversation_id, tenant=tenant)

    def conversation(self, conversation_id: str, tenant: str | None = None) -> ConversationInfo:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(s.conversations).where(s.conversations.c.id == conversation_id)
            ).first()
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFound(
                f"no conversation {conversation_id!r}; list them with `kioku memory --list`"
            )
        return ConversationInfo(
            id=row.id,
            tenant=row.tenant,
            character=row.character,
            system_prompt=row.system_prompt,
            profile=row.profile,
            next_seq=row.next_seq,
            raw_start=row.raw_start,
            memory_version=row.memory_version,
        )

    def conversations(self, tenant: str | None = None) -> list[ConversationInfo]:
        q = select(s.conversations.c.id).order_by(s.conversations.c.created_at)
        if tenant is not None:
            q = q.where(s.conversations.c.tenant == tenant)
        with self.engine.connect() as conn:
            ids = [r.id for r in conn.execute(q)]
        return [self.conversation(i) for i in ids]

    # the log -----------------------------------------------------------------------------

    def append(
        self,
        conversation_id: str,
        message: Message,
        tokens: int,
        meta: dict[str, Any] | None = None,
    ) -> LogEntry:
        """Store one message under the next gap-free seq and return it."""
        with self.atomic() as conn:
            return self._append(conn, conversation_id, message, tokens, meta)

    def _append(
        self,
        conn: Connection,
        conversation_id: str,
        message: Message,
        tokens: int,
        meta: dict[str, Any] | None = None,
    ) -> LogEntry:
        c = s.conversations.c
        q = select(c.next_seq).where(c.id == conversation_id)
        if self.is_postgres:
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise NotFound(f"no conversation {conversation_id!r}")
        seq = int(row.next_seq)
        conn.execute(
            update(s.conversations).where(c.id == conversation_id).values(next_seq=seq + 1)
        )
        conn.execute(
            insert(s.messages).values(
                conversation_id=conversation_id,
                seq=seq,
                role=message.role,
                author=message.author,
                at=message.at.isoformat() if message.at else None,
                parts=message.parts_json(),
                text=message.text,
                tokens=tokens,
                content_hash=message.content_hash(),
                created_at=time.time(),
                superseded=0,
                meta=meta,
            )
        )
        return LogEntry(seq=seq, message=message, tokens=tokens, meta=meta or {})

    def entries(
        self, conversation_id: str, first: int = 0, last: int | None = None
    ) -> list[LogEntry]:
        m = s.messages.c
        q = select(s.messages).where(m.conversation_id == conversation_id, m.seq >= first)
        if last is not None:
            q = q.where(m.seq <= last)
        with self.engine.connect() as conn:
            return [_message_row(r) for r in conn.execute(q.order_by(m.seq))]

    def tail(self, conversation_id: str, n: int, role: str | None = None) -> list[LogEntry]:
        """The newest `n` messages (of one role), oldest first."""
        m = s.messages.c
        q = select(s.messages).where(m.conversation_id == conversation_id)
        if role is not None:
            q = q.where(m.role == role)
        with self.engine.connect() as conn:
            rows = list(conn.execute(q.order_by(m.seq.desc()).limit(n)))
        return [_message_row(r) for r in reversed(rows)]

    def tail_hashes(
        self, conversation_id: str, n: int, role: str | None = None
    ) -> list[tuple[int, str]]:
        """(seq, content hash) of what `tail` would return: a cheap "has it changed?" key."""
        m = s.messages.c
        q = select(m.seq, m.content_hash).where(m.conversation_id == conversation_id)
        if role is not None:
            q = q.where(m.role == role)
        with self.engine.connect() as conn:
            rows = list(conn.execute(q.order_by(m.seq.desc()).limit(n)))
        return [(int(r.seq), str(r.content_hash)) for r in reversed(rows)]

    def notes_snapshot(self, conversation_id: str) -> str:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(s.notes_snapshots.c.text).where(
                    s.notes_snapshots.c.conversation_id == conversation_id
                )
            ).first()
        return row.text if row else ""

    def set_notes_snapshot(self, conversation_id: str, text: str, memory_version: int) -> None:
        with self.atomic() as conn:
            t = s.notes_snapshots
            values = dict(text=text, memory_version=memory_version, updated_at=time.time())
            conn.execute(
                self._upsert(t)
                .values(conversation_id=conversation_id, **values)
                .on_conflict_do_update(index_elements=[t.c.conversation_id], set_=values)
            )

    def count_messages(self, conversation_id: str) -> int:
        return self.conversation(conversation_id).next_seq

    def tokens_between(self, conversation_id: str, first: int, last: int | None = None) -> int:
        m = s.messages.c
        q = select(func.coalesce(func.sum(m.tokens), 0)).where(
            m.conversation_id == conversation_id, m.seq >= first
        )
        if last is not None:
            q = q.where(m.seq <= last)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    # memory ------------------------------------------------------------------------------

    def items(self, conversation_id: str, *statuses: str) -> list[MemoryItem]:
        mi = s.memory_items.c
        q = select(s.memory_items).where(mi.conversation_id == conversation_id)
        if statuses:
            q = q.where(mi.status.in_(statuses))
        with self.engine.connect() as conn:
            return [_item_row(r) for r in conn.execute(q.order_by(mi.first_seq, mi.id))]

    def add_item(
        self, conversation_id: str, item: MemoryItem, conn: Connection | None = None
    ) -> int:
        values = dict(
            conversation_id=conversation_id,
            kind=item.kind,
            first_seq=item.first_seq,
            last_seq=item.last_seq,
            text=item.text,
            data=dict(item.data) if item.data else None,
            tokens=item.tokens,
            source=item.source,
            model=item.model,
            prompt_version=item.prompt_version,
            status=item.status,
            ready_at=item.ready_at,
            created_at=time.time(),
            replaces=list(item.replaces) if item.replaces else None,
            stale=int(item.stale),
        )
        if conn is not None:
            return _new_id(conn.execute(insert(s.memory_items).values(**values)))
        with self.atomic() as c:
            return _new_id(c.execute(insert(s.memory_items).values(**values)))

    def fold(
        self,
        conversation_id: str,
        *,
        activate: Sequence[int],
        retire: Sequence[int],
        raw_start: int,
        expect_raw_start: int | None = None,
        add: Sequence[MemoryItem] = (),
    ) -> int:
        """Apply a new memory state in one transaction; return the new memory version.

        Refuses (StoreError, nothing changed) if the result would break the coverage invariant,
        or if the raw window moved since the caller looked (`expect_raw_start`)."""
        with self.atomic() as conn:
            c = s.conversations.c
            q = select(c.raw_start, c.memory_version).where(c.id == conversation_id)
            if self.is_postgres:
                q = q.with_for_update()
            row = conn.execute(q).first()
            if row is None:
                raise NotFound(f"no conversation {conversation_id!r}")
            if expect_raw_start is not None and row.raw_start != expect_raw_start:
                raise StoreError(
                    f"raw window moved ({expect_raw_start} → {row.raw_start}) since the fold was planned"
                )
            added = [self.add_item(conversation_id, it, conn) for it in add]
            mi = s.memory_items.c
            if activate or added:
                conn.execute(
                    update(s.memory_items)
                    .where(mi.id.in_(list(activate) + added))
                    .values(status="active")
                )
            if retire:
                conn.execute(
                    update(s.memory_items).where(mi.id.in_(list(retire))).values(status="retired")
                )
            active = [
                _item_row(r)
                for r in conn.execute(
                    select(s.memory_items).where(
                        mi.conversation_id == conversation_id, mi.status == "active"
                    )
                )
            ]
            problems = coverage_gaps(active, raw_start)
            if problems:
                raise _FoldRefused("; ".join(problems))
            version = int(row.memory_version) + 1
            conn.execute(
                update(s.conversations)
                .where(c.id == conversation_id)
                .values(raw_start=raw_start, memory_version=version)
            )
            return version

    def retire_items(self, conversation_id: str, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self.atomic() as conn:
            mi = s.memory_items.c
            conn.execute(
                update(s.memory_items)
                .where(mi.conversation_id == conversation_id, mi.id.in_(list(ids)))
                .values(status="retired")
            )

    # jobs --------------------------------------------------------------------------------

    def enqueue_job(
        self,
        conversation_id: str,
        kind: str,
        first_seq: int,
        last_seq: int,
        run_after: float,
        payload: dict[str, Any] | None = None,
    ) -> int:
        with self.atomic() as conn:
            r = conn.execute(
                insert(s.jobs).values(
                    conversation_id=conversation_id,
                    kind=kind,
                    first_seq=first_seq,
                    last_seq=last_seq,
                    payload=payload,
                    status="queued",
                    attempts=0,
                    run_after=run_after,
                    created_at=time.time(),
                )
            )
            return _new_id(r)

    def jobs(self, conversation_id: str, *statuses: str) -> list[Job]:
        j = s.jobs.c
        q = select(s.jobs).where(j.conversation_id == conversation_id)
        if statuses:
            q = q.where(j.status.in_(statuses))
        with self.engine.connect() as conn:
            return [_job_row(r) for r in conn.execute(q.order_by(j.id))]

    def claim_job(
        self,
        worker: str,
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        conversation_id: str | None = None,
    ) -> Job | None:
        """Lease the oldest due job whose conversation no other worker is compacting.

        A job left `running` by a crashed worker is claimable again once its lease expires."""
        j = s.jobs.c
        due = or_(
            and_(j.status == "queued", j.run_after <= now),
            and_(j.status == "running", j.lease_until < now),
        )
        skip: set[str] = set()
        while True:
            with self.atomic() as conn:
                busy = (
                    select(s.jobs.c.conversation_id)
                    .where(j.status == "running", j.lease_until >= now)
                    .scalar_subquery()
                )
                q = select(s.jobs).where(due, j.conversation_id.not_in(busy))
                if conversation_id is not None:
                    q = q.where(j.conversation_id == conversation_id)
                if skip:
                    q = q.where(j.conversation_id.not_in(skip))
                q = q.order_by(j.run_after, j.id).limit(1)
                if self.is_postgres:
                    q = q.with_for_update(skip_locked=True)
                row = conn.execute(q).first()
                if row is None:
                    return None
                if self.is_postgres and self._conversation_busy(conn, row, now):
                    skip.add(row.conversation_id)
                    continue
                return self._lease(conn, row, worker, now, lease_s)

    def _conversation_busy(self, conn: Connection, row: Any, now: float) -> bool:
        """PostgreSQL: did another worker claim a job of this conversation meanwhile?

        Under READ COMMITTED two workers can both see a conversation idle and lock two
        different jobs of it (SKIP LOCKED steers the second past the first). A per-conversation
        advisory lock, held to the end of the claiming transaction, makes them take turns; the
        check after it runs on a fresh snapshot and sees the other claim once it committed."""
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:ns, hashtext(:cid))"),
            {"ns": CLAIM_LOCK_NS, "cid": row.conversation_id},
        )
        j = s.jobs.c
        other = conn.execute(
            select(j.id)
            .where(
                j.conversation_id == row.conversation_id,
                j.id != row.id,
                j.status == "running",
                j.lease_until >= now,
            )
            .limit(1)
        ).first()
        return other is not None

    def _lease(self, conn: Connection, row: Any, worker: str, now: float, lease_s: float) -> Job:
        j = s.jobs.c
        conn.execute(
            update(s.jobs)
            .where(j.id == row.id)
            .values(
                status="running",
                attempts=row.attempts + 1,
                lease_until=now + lease_s,
                leased_by=worker,
            )
        )
        job = _job_row(row)
        return Job(**{**job.__dict__, "status": "running", "attempts": row.attempts + 1})

    def finish_job(
        self,
        job_id: int,
        status: str = "done",
        error: str | None = None,
        worker: str | None = None,
    ) -> bool:
        """Close a job. With `worker`, only while that worker still holds its lease: a worker
        whose lease expired (another one took the job over) changes nothing. True if closed."""
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(*_held(job_id, worker))
                .values(status=status, error=error, finished_at=time.time(), lease_until=None)
            )
            return bool(r.rowcount)

    def complete_job(
        self, job_id: int, conversation_id: str, item: MemoryItem | None, worker: str | None = None
    ) -> int | None:
        """Store a job's memory item and mark the job done in one transaction, so a crash
        between the two can neither lose the summary nor write it twice.

        With `worker`, raises LeaseLost (nothing written) if that worker no longer holds the
        job: its lease expired and another worker took the job over."""
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(*_held(job_id, worker))
                .values(status="done", finished_at=time.time(), lease_until=None)
            )
            if worker is not None and not r.rowcount:
                raise LeaseLost(f"job {job_id} is no longer leased by {worker}; not stored")
            return self.add_item(conversation_id, item, conn) if item is not None else None

    def retry_job(
        self, job_id: int, run_after: float, error: str, worker: str | None = None
    ) -> bool:
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(*_held(job_id, worker))
                .values(status="queued", run_after=run_after, error=error, lease_until=None)
            )
            return bool(r.rowcount)

    def cancel_jobs(self, conversation_id: str, up_to_seq: int) -> int:
        """Cancel queued jobs that start at or before `up_to_seq` (their range was overtaken).
        A major GC (synopsis job) folds memory, not raw messages, and a revision re-summarizes
        memory a client's edit made stale: a cut never overtakes either."""
        j = s.jobs.c
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(
                    j.conversation_id == conversation_id,
                    j.status == "queued",
                    j.kind.not_in(("synopsis", "revision")),
                    j.first_seq <= up_to_seq,
                )
                .values(status="cancelled", finished_at=time.time())
            )
            return int(r.rowcount or 0)

    # compaction log and counters ---------------------------------------------------------

    def log(
        self,
        conversation_id: str,
        event_name: str,
        outcome: str = "ok",
        *,
        duration_s: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_seq: int | None = None,
        last_seq: int | None = None,
        detail: str | None = None,
        at: float | None = None,
    ) -> None:
        with self.atomic() as conn:
            conn.execute(
                insert(s.compaction_log).values(
                    conversation_id=conversation_id,
                    event=event_name,
                    outcome=outcome,
                    duration_s=duration_s,
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    first_seq=first_seq,
                    last_seq=last_seq,
                    detail=detail,
                    at=time.time() if at is None else at,
                )
            )

    def log_entries(self, conversation_id: str | None = None) -> list[dict[str, Any]]:
        cl = s.compaction_log.c
        q = select(s.compaction_log).order_by(cl.id)
        if conversation_id is not None:
            q = q.where(cl.conversation_id == conversation_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def incr(self, conversation_id: str, name: str, by: int = 1) -> None:
        with self.atomic() as conn:
            t = s.counters.c
            # one statement, so two first increments racing on PostgreSQL cannot both insert
            conn.execute(
                self._upsert(s.counters)
                .values(conversation_id=conversation_id, name=name, value=by)
                .on_conflict_do_update(
                    index_elements=[t.conversation_id, t.name], set_={"value": t.value + by}
                )
            )

    def counters(self, conversation_id: str | None = None) -> dict[str, int]:
        t = s.counters.c
        q = select(t.name, func.sum(t.value)).group_by(t.name)
        if conversation_id is not None:
            q = q.where(t.conversation_id == conversation_id)
        with self.engine.connect() as conn:
            return {name: int(v) for name, v in conn.execute(q)}


def _held(job_id: int, worker: str | None) -> list[Any]:
    """WHERE clauses naming a job, and with `worker`, only while that worker leases it."""
    j = s.jobs.c
    if worker is None:
        return [j.id == job_id]
    return [j.id == job_id, j.status == "running", j.leased_by == worker]


class LeaseLost(StoreError):
    """A worker finished a job after its lease expired and another worker took it over."""


class _FoldRefused(StoreError):
    """A fold would have broken the coverage invariant; nothing was changed."""


FoldRefused = _FoldRefused
