"""Durable summary jobs: queued, leased, retried, never run twice for one conversation at once.

A job is claimed with a short lease that its worker renews while the summary runs (a heartbeat,
`kioku.worker`): a worker that dies stops renewing, and another worker claims the job again once
the lease ran out, or at once when the holder is a process of this host that is gone
(`expire_dead_leases`, `kioku.owners`). A conversation's jobs run in two lanes: its raw range
(chapters, rolling rewrites, revisions) and its memory (the synopsis of a major GC). One job at a
time per lane, so a chapter that is slow or stuck never holds up the synopsis that keeps memory
within its share of the window. On PostgreSQL claims use FOR UPDATE SKIP LOCKED plus a
per-conversation advisory lock, so any number of workers on any number of machines never run two
jobs of one lane of a conversation at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, exists, insert, or_, select, text, update

from kioku.errors import LeaseLost
from kioku.job import DEFAULT_LEASE_S, Job, JobKind, JobStatus
from kioku.memory import MemoryItem
from kioku.store import schema as s
from kioku.store.db import Database, lock_key, new_id

# every turn asks for its conversation's jobs: built once
_JOBS = select(s.jobs).where(s.jobs.c.conversation_id == bindparam("cid")).order_by(s.jobs.c.id)
_JOBS_OF_STATUS = _JOBS.where(s.jobs.c.status.in_(bindparam("statuses", expanding=True)))


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
        error=row.error or "",
    )


def lane(kind: Any) -> Any:
    """The lane of a job kind, as SQL: a major GC folds memory, the other kinds raw messages."""
    return case((kind == "synopsis", "memory"), else_="raw")


def _held(job_id: int, worker: str | None) -> list[Any]:
    """WHERE clauses naming a job, and with `worker`, only while that worker leases it."""
    j = s.jobs.c
    if worker is None:
        return [j.id == job_id]
    return [j.id == job_id, j.status == "running", j.leased_by == worker]


def _lane_of(kind: str) -> str:
    return "memory" if kind == "synopsis" else "raw"


class JobQueue(Database):
    """Jobs live beside the memory items they produce: completing one stores its item."""

    def add_item(self, conversation_id: str, item: MemoryItem) -> int:
        raise NotImplementedError  # the Store writes memory items

    def enqueue_job(
        self,
        conversation_id: str,
        kind: JobKind,
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
            return new_id(r)

    def jobs(self, conversation_id: str, *statuses: JobStatus) -> list[Job]:
        q = _JOBS_OF_STATUS if statuses else _JOBS
        params = {"cid": conversation_id, "statuses": list(statuses)}
        with self.reading() as conn:
            return [_job_row(r) for r in conn.execute(q, params)]

    def claim_job(
        self,
        worker: str,
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        conversation_id: str | None = None,
        delay_s: float | None = None,
    ) -> Job | None:
        """Lease the oldest due job of a lane (raw or memory) of a conversation that no other
        worker is running a job in.

        A job left `running` by a crashed worker is claimable again once its lease expires.
        `delay_s` is the claiming worker's own summary delay: a job never tried is due that long
        after it was queued, whatever delay the process that queued it had (a retry keeps its
        backoff)."""
        j = s.jobs.c
        queued_due = j.run_after <= now
        if delay_s is not None:
            fresh_due = and_(j.attempts == 0, j.created_at + delay_s <= now)
            queued_due = or_(fresh_due, and_(j.attempts > 0, j.run_after <= now))
        due = or_(
            and_(j.status == "queued", queued_due),
            and_(j.status == "running", j.lease_until < now),
        )
        skip: set[tuple[str, str]] = set()
        while True:
            with self.atomic() as conn:
                other = s.jobs.alias("other")
                o = other.c
                # another job of the same lane of the conversation runs under a live lease
                busy = exists().where(
                    o.conversation_id == j.conversation_id,
                    o.id != j.id,
                    o.status == "running",
                    o.lease_until >= now,
                    lane(o.kind) == lane(j.kind),
                )
                q = select(s.jobs).where(due, ~busy)
                if conversation_id is not None:
                    q = q.where(j.conversation_id == conversation_id)
                for cid, kind_lane in skip:
                    q = q.where(or_(j.conversation_id != cid, lane(j.kind) != kind_lane))
                q = q.order_by(j.run_after, j.id).limit(1)
                if self.is_postgres:
                    q = q.with_for_update(skip_locked=True, of=s.jobs)
                row = conn.execute(q).first()
                if row is None:
                    return None
                if self.is_postgres and self._conversation_busy(conn, row, now):
                    skip.add((row.conversation_id, _lane_of(row.kind)))
                    continue
                return self._lease(conn, row, worker, now, lease_s)

    def _conversation_busy(self, conn: Connection, row: Any, now: float) -> bool:
        """PostgreSQL: did another worker claim a job of this lane of the conversation
        meanwhile?

        Under READ COMMITTED two workers can both see a lane idle and lock two different jobs of
        it (SKIP LOCKED steers the second past the first). A per-lane advisory lock, held to the
        end of the claiming transaction, makes them take turns; the check after it runs on a
        fresh snapshot and sees the other claim once it committed."""
        kind_lane = _lane_of(row.kind)
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:k)"),
            {"k": lock_key("claim", row.conversation_id, kind_lane)},
        )
        j = s.jobs.c
        other = conn.execute(
            select(j.id)
            .where(
                j.conversation_id == row.conversation_id,
                j.id != row.id,
                j.status == "running",
                j.lease_until >= now,
                lane(j.kind) == kind_lane,
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

    def renew_job(self, job_id: int, worker: str, until: float) -> bool:
        """Extend `worker`'s lease of a running job (its heartbeat); False once the job is no
        longer that worker's (taken over after its lease ran out, or closed)."""
        with self.atomic() as conn:
            r = conn.execute(update(s.jobs).where(*_held(job_id, worker)).values(lease_until=until))
            return bool(r.rowcount)

    def expire_dead_leases(self, now: float, alive: Callable[[str], bool]) -> int:
        """End the leases whose holder `alive` says is gone (a process of this host that was
        killed): their jobs are claimable now, not when the lease runs out. How many."""
        j = s.jobs.c
        live = and_(j.status == "running", j.lease_until >= now)
        with self.reading() as conn:
            holders = [r[0] for r in conn.execute(select(j.leased_by).where(live).distinct())]
        dead = [h for h in holders if h and not alive(h)]
        if not dead:
            return 0
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(live, j.leased_by.in_(dead))
                .values(lease_until=now - 1.0, error="its worker died")
            )
            return int(r.rowcount or 0)

    def finish_job(
        self,
        job_id: int,
        status: JobStatus = "done",
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
            return self.add_item(conversation_id, item) if item is not None else None

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

    def hurry_jobs(self, conversation_id: str, now: float) -> int:
        """Queued summary jobs run now, without their delay (an operator asked for memory
        now); return how many."""
        j = s.jobs.c
        with self.atomic() as conn:
            r = conn.execute(
                update(s.jobs)
                .where(
                    j.conversation_id == conversation_id,
                    j.status == "queued",
                    j.run_after > now,
                )
                .values(run_after=now)
            )
            return int(r.rowcount or 0)

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
