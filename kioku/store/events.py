"""The compaction log and the counters, in the store: what happened to a conversation, how often.

Every fold, summary, fallback and refusal leaves a line in the compaction log (the console and
`kioku log` read it); counters add up events by name per conversation. A tenant's totals across
its conversations are what `/metrics` exports, read in one connection so they belong together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, func, insert, select

from kioku.store import schema as s
from kioku.store.db import Database

_INSERT_LOG = insert(s.compaction_log)  # the values come as parameters: compiled once


@dataclass(frozen=True)
class TenantTotals:
    counters: dict[str, int] = field(default_factory=dict)
    # event → (how many with a duration, their total seconds)
    durations: dict[str, tuple[int, float]] = field(default_factory=dict)
    queue: dict[str, int] = field(default_factory=dict)  # queued | running → jobs
    conversations: int = 0


class EventLog(Database):
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
            if not self._still_there(conn, conversation_id):
                return  # deleted meanwhile: what happened to it goes with it
            conn.execute(
                _INSERT_LOG,
                dict(
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
                ),
            )

    def log_entries(self, conversation_id: str | None = None) -> list[dict[str, Any]]:
        cl = s.compaction_log.c
        q = select(s.compaction_log).order_by(cl.id)
        if conversation_id is not None:
            q = q.where(cl.conversation_id == conversation_id)
        with self.reading() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def incr(self, conversation_id: str, name: str, by: int = 1) -> None:
        def build() -> Any:
            t = s.counters.c
            return self._upsert(s.counters).on_conflict_do_update(
                index_elements=[t.conversation_id, t.name],
                set_={"value": t.value + bindparam("by")},
            )

        with self.atomic() as conn:
            if not self._still_there(conn, conversation_id):
                return
            # one statement, so two first increments racing on PostgreSQL cannot both insert
            conn.execute(
                self._built("incr", build),
                {"conversation_id": conversation_id, "name": name, "value": by, "by": by},
            )

    def counters(self, conversation_id: str | None = None) -> dict[str, int]:
        t = s.counters.c
        q = select(t.name, func.sum(t.value)).group_by(t.name)
        if conversation_id is not None:
            q = q.where(t.conversation_id == conversation_id)
        with self.reading() as conn:
            return {name: int(v) for name, v in conn.execute(q)}

    def top_counter(self, tenant: str, name: str, limit: int) -> list[tuple[str, int]]:
        """The tenant's conversations with the highest counter `name` (above 0), highest
        first: a bounded set of labelled series for `/metrics` (issue 12)."""
        t, c = s.counters.c, s.conversations.c
        q = (
            select(t.conversation_id, t.value)
            .join(s.conversations, c.id == t.conversation_id)
            .where(c.tenant == tenant, t.name == name, t.value > 0)
            .order_by(t.value.desc(), t.conversation_id)
            .limit(limit)
        )
        with self.reading() as conn:
            return [(str(r.conversation_id), int(r.value)) for r in conn.execute(q)]

    def tenant_totals(self, tenant: str) -> TenantTotals:
        c, cv, cl, j = s.conversations.c, s.counters.c, s.compaction_log.c, s.jobs.c
        mine = select(c.id).where(c.tenant == tenant).scalar_subquery()
        with self.reading() as conn:
            counters = conn.execute(
                select(cv.name, func.sum(cv.value))
                .where(cv.conversation_id.in_(mine))
                .group_by(cv.name)
            ).all()
            durations = conn.execute(
                select(cl.event, func.count(), func.sum(cl.duration_s))
                .where(cl.conversation_id.in_(mine), cl.duration_s.is_not(None))
                .group_by(cl.event)
            ).all()
            queue = conn.execute(
                select(j.status, func.count())
                .where(j.conversation_id.in_(mine), j.status.in_(("queued", "running")))
                .group_by(j.status)
            ).all()
            conversations = conn.execute(
                select(func.count()).where(c.tenant == tenant)
            ).scalar_one()
        return TenantTotals(
            counters={str(name): int(v or 0) for name, v in counters},
            durations={str(e): (int(n), float(total or 0)) for e, n, total in durations},
            queue={str(status): int(n) for status, n in queue},
            conversations=int(conversations),
        )
