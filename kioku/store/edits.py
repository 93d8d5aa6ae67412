"""Edits of stored messages, in the store: versions kept, memory over them marked stale.

A stateless client may edit, delete or regenerate a message it shows (`kioku.revisions` says why
and what follows). Here is the SQL of it: the old content goes to `message_versions`, the row
keeps its seq with the new content, and in the same transaction the memory items over a changed
message are marked stale (a revision job queued for each) or, not yet in the prompt, retired.
The reads a client's transcript is compared with (`visible_tail`) and the operator's paged log
(`message_page`) live here too: both tell edited and deleted messages apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from kioku.errors import NotFound
from kioku.messages import LogEntry, Message, parts_from_json
from kioku.store import schema as s
from kioku.store.db import Database

ChangeKind = Literal["edit", "delete", "regenerate", "continue"]  # continue: issue 12


# a stateless turn compares the client's transcript with the newest messages: built once
_VISIBLE_TAIL = (
    select(s.messages.c.seq, s.messages.c.role, s.messages.c.text)
    .where(s.messages.c.conversation_id == bindparam("cid"), s.messages.c.superseded == 0)
    .order_by(s.messages.c.seq.desc())
    .limit(bindparam("n"))
)


@dataclass(frozen=True)
class Rewrite:
    """One stored message's new content with its token count; `message` None deletes it."""

    seq: int
    message: Message | None
    tokens: int
    kind: ChangeKind = "edit"
    meta: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Revised:
    entries: tuple[LogEntry, ...]  # the rows as they are now
    stale: tuple[int, ...]  # active items marked stale (a revision job queued for each)
    retired: tuple[int, ...]  # ready items retired (their range will be scheduled again)
    retracted: tuple[int, ...] = ()  # notes ledger entries retracting what they took back


@dataclass(frozen=True)
class PageEntry:
    """A row of the operator's view of the log."""

    entry: LogEntry
    at: str | None  # as stored
    deleted: bool
    edited: bool


class MessageEdits(Database):
    def rewrite_messages(
        self, conversation_id: str, rewrites: Sequence[Rewrite], *, run_after: float, now: float
    ) -> Revised:
        """Apply edits and deletions in one transaction: versions kept, items over them marked
        stale (revision jobs due at `run_after`), ready items over them retired."""
        m = s.messages.c
        out: list[LogEntry] = []
        with self.atomic() as conn:
            for ch in rewrites:
                row = conn.execute(
                    select(s.messages).where(m.conversation_id == conversation_id, m.seq == ch.seq)
                ).first()
                if row is None:
                    raise NotFound(f"conversation {conversation_id!r} has no message #{ch.seq}")
                conn.execute(
                    insert(s.message_versions).values(
                        conversation_id=conversation_id,
                        seq=ch.seq,
                        role=row.role,
                        author=row.author,
                        parts=row.parts,
                        text=row.text,
                        content_hash=row.content_hash,
                        change=ch.kind if ch.message is not None else "delete",
                        replaced_at=time.time(),
                    )
                )
                new = ch.message or Message(role=row.role, parts=(), author=row.author)
                conn.execute(
                    update(s.messages)
                    .where(m.conversation_id == conversation_id, m.seq == ch.seq)
                    .values(
                        role=new.role,
                        author=new.author,
                        parts=new.parts_json(),
                        text=new.text,
                        tokens=ch.tokens,
                        content_hash=new.content_hash(),
                        superseded=0 if ch.message is not None else 1,
                        meta=dict(ch.meta) if ch.meta else None,
                    )
                )
                out.append(LogEntry(ch.seq, new, ch.tokens, ch.meta or {}))
            stale, retired = self._mark_stale(
                conn, conversation_id, {c.seq for c in rewrites}, run_after, now
            )
            if rewrites:
                self._forget_index(conn, conversation_id, min(c.seq for c in rewrites))
        return Revised(tuple(out), stale, retired)

    def _forget_index(self, conn: Connection, conversation_id: str, first: int) -> None:
        """The recall index no longer knows the old text from `first` on: its segments from
        there are dropped (the log rebuilds them), and the conversation's revision bumps, so a
        process that cached the log or the index reads it again."""
        g = s.recall_segments.c
        conn.execute(
            delete(s.recall_segments).where(
                g.conversation_id == conversation_id, g.last_seq >= first
            )
        )
        c = s.conversations.c
        conn.execute(
            update(s.conversations).where(c.id == conversation_id).values(revision=c.revision + 1)
        )

    def _mark_stale(
        self, conn: Connection, conversation_id: str, seqs: set[int], run_after: float, now: float
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        mi = s.memory_items.c
        rows = conn.execute(
            select(s.memory_items).where(
                mi.conversation_id == conversation_id, mi.status.in_(("active", "ready"))
            )
        ).all()
        hit = [r for r in rows if any(r.first_seq <= q <= r.last_seq for q in seqs)]
        retired = tuple(r.id for r in hit if r.status == "ready")
        if retired:
            conn.execute(update(s.memory_items).where(mi.id.in_(retired)).values(status="retired"))
        j = s.jobs.c
        waiting = {
            (r.payload or {}).get("item_id")
            for r in conn.execute(
                select(s.jobs).where(
                    j.conversation_id == conversation_id,
                    j.kind == "revision",
                    j.status == "queued",  # a running one may have read the old text
                )
            )
        }
        stale: list[int] = []
        for r in hit:
            if r.status != "active":
                continue
            stale.append(r.id)
            conn.execute(update(s.memory_items).where(mi.id == r.id).values(stale=1))
            if r.id in waiting:
                continue  # its queued revision will read the corrected log
            conn.execute(
                insert(s.jobs).values(
                    conversation_id=conversation_id,
                    kind="revision",
                    first_seq=r.first_seq,
                    last_seq=r.last_seq,
                    payload={"item_id": r.id},
                    status="queued",
                    attempts=0,
                    run_after=run_after,
                    created_at=now,
                )
            )
        if stale:
            # a queued major GC would fold the stale text into the synopsis: the policy plans it
            # again once the revisions are in
            conn.execute(
                update(s.jobs)
                .where(
                    j.conversation_id == conversation_id,
                    j.kind == "synopsis",
                    j.status == "queued",
                )
                .values(status="cancelled", finished_at=time.time(), error="stale input")
            )
        return tuple(stale), retired

    def resummarize(self, conversation_id: str, seq: int, now: float) -> tuple[int, ...]:
        """Mark the active item over `seq` stale and queue its re-summary, due now (an
        operator asked for it); return the items marked."""
        with self.atomic() as conn:
            stale, _ = self._mark_stale(conn, conversation_id, {seq}, now, now)
        return stale

    def metas_from(self, conversation_id: str, first: int) -> list[tuple[int, dict[str, Any]]]:
        """(seq, meta) of the messages from `first` on that carry metadata (what kioku showed
        beside them), oldest first."""
        m = s.messages.c
        q = (
            select(m.seq, m.meta)
            .where(m.conversation_id == conversation_id, m.seq >= first, m.meta.is_not(None))
            .order_by(m.seq)
        )
        with self.reading() as conn:
            return [(int(r.seq), dict(r.meta)) for r in conn.execute(q) if r.meta]

    def positions(self, conversation_id: str, seqs: Sequence[int]) -> dict[int, int]:
        """Each seq's number among the messages a client shows (deleted ones not counted):
        the client renumbers after a delete, kioku's seqs never move."""
        if not seqs:
            return {}
        m = s.messages.c
        with self.reading() as conn:
            gone = [
                int(r.seq)
                for r in conn.execute(
                    select(m.seq).where(
                        m.conversation_id == conversation_id,
                        m.superseded == 1,
                        m.seq < max(seqs),
                    )
                )
            ]
        return {q: q - sum(1 for g in gone if g < q) for q in seqs}

    def changed_seqs(self, conversation_id: str, first: int, last: int) -> list[int]:
        """Seqs in [first, last] that have an older version (edited, deleted or regenerated)."""
        v = s.message_versions.c
        with self.reading() as conn:
            rows = conn.execute(
                select(v.seq)
                .where(v.conversation_id == conversation_id, v.seq >= first, v.seq <= last)
                .distinct()
                .order_by(v.seq)
            )
            return [int(r.seq) for r in rows]

    def message_versions(self, conversation_id: str, seq: int) -> list[dict[str, Any]]:
        """Earlier contents of one message, oldest first."""
        v = s.message_versions.c
        with self.reading() as conn:
            rows = conn.execute(
                select(s.message_versions)
                .where(v.conversation_id == conversation_id, v.seq == seq)
                .order_by(v.id)
            )
            return [dict(r._mapping) for r in rows]

    def visible_tail(self, conversation_id: str, n: int) -> list[tuple[int, str, str]]:
        """(seq, role, text) of the newest `n` messages a client can see (deleted ones are not),
        oldest first."""
        with self.reading() as conn:
            rows = list(conn.execute(_VISIBLE_TAIL, {"cid": conversation_id, "n": n}))
        return [(int(r.seq), str(r.role), str(r.text)) for r in reversed(rows)]

    def message_page(
        self, conversation_id: str, after: int, limit: int
    ) -> tuple[list[PageEntry], bool]:
        """Up to `limit` messages after seq `after`, deleted ones included and edited ones marked;
        and whether more follow."""
        m, v = s.messages.c, s.message_versions.c
        with self.reading() as conn:
            rows = list(
                conn.execute(
                    select(s.messages)
                    .where(m.conversation_id == conversation_id, m.seq > after)
                    .order_by(m.seq)
                    .limit(limit + 1)
                )
            )
            page = rows[:limit]
            edited = set()
            if page:
                edited = {
                    r.seq
                    for r in conn.execute(
                        select(v.seq)
                        .where(
                            v.conversation_id == conversation_id,
                            v.seq >= page[0].seq,
                            v.seq <= page[-1].seq,
                        )
                        .distinct()
                    )
                }
        out = []
        for r in page:
            at = datetime.fromisoformat(r.at) if r.at else None
            msg = Message(role=r.role, parts=parts_from_json(r.parts), author=r.author, at=at)
            entry = LogEntry(seq=r.seq, message=msg, tokens=r.tokens, meta=r.meta or {})
            out.append(PageEntry(entry, r.at, bool(r.superseded), r.seq in edited))
        return out, len(rows) > limit
