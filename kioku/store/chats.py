"""A client's chats, in the store: a rename, and a branch's start.

A rename gives a conversation another name (`public_id`) and keeps everything else: its key,
which every other table refers to, does not change (SillyTavern renames a chat file; before
issue 22 the renamed chat started a new conversation and the old one stayed behind, orphaned).
The old name is free from the commit on: a conversation created under it gets another key.

A branch's start: the parent's messages and memory copied into a new conversation in one
transaction (`kioku.branches` decides what; this is the SQL of it).

Copies, not references: every other part of kioku reads a conversation's own rows (the raw
window, the chronicler's input, recall, the console), and a parent may be edited, folded or
deleted later without its branches changing under them. Memory items are copied as written
(text, structure, source, model), so nothing is summarized again; a copied stale item gets a
revision job of its own. Notes taken from the shared messages (and the operator's own) are
copied with their ledger history.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from kioku.errors import FoldRefused, NameTaken, NotFound, StoreError
from kioku.memory import MemoryItem, coverage_gaps
from kioku.store import schema as s
from kioku.store.db import Database, item_values, new_id


class ClientChats(Database):
    def rename_conversation(self, tenant: str, old: str, new: str) -> str:
        """Name the tenant's conversation `old` `new` from now on; return its key. NotFound
        for an unknown `old`, NameTaken when another conversation has the name `new`."""
        c = s.conversations.c
        taken = NameTaken(
            f"there is a conversation {new!r} already; rename or delete it first, or keep the "
            f"name {old!r}"
        )
        try:
            with self.atomic() as conn:
                row = conn.execute(
                    select(c.id).where(c.tenant == tenant, c.public_id == old)
                ).first()
                if row is None:
                    raise NotFound(f"no conversation {old!r}; `kioku memory` lists them")
                if old == new:
                    return str(row.id)
                if conn.execute(select(c.id).where(c.tenant == tenant, c.public_id == new)).first():
                    raise taken
                conn.execute(update(s.conversations).where(c.id == row.id).values(public_id=new))
                return str(row.id)
        except (IntegrityError, StoreError) as e:
            # a first turn under the new name committed while this ran (PostgreSQL: the check
            # above could not see it yet; the unique name index refused the update)
            if isinstance(e, IntegrityError) or isinstance(e.__cause__, IntegrityError):
                raise taken from e
            raise

    def copy_branch(
        self,
        parent_id: str,
        child_id: str,
        *,
        upto: int,
        raw_start: int,
        active: Sequence[MemoryItem],
        ready: Sequence[MemoryItem] = (),
    ) -> int:
        """Give the empty conversation `child_id` the parent's messages below `upto` and the
        memory items `active` (covering [0, raw_start) exactly once) and `ready`; return the
        number of messages copied. Refuses (FoldRefused) memory that would break coverage."""
        problems = coverage_gaps(active, raw_start)
        if problems:
            raise FoldRefused("; ".join(problems))
        now = time.time()
        c, m, v = s.conversations.c, s.messages.c, s.message_versions.c
        with self.atomic() as conn:
            row = conn.execute(select(c.next_seq).where(c.id == child_id)).first()
            if row is None:
                raise NotFound(f"no conversation {child_id!r}")
            if row.next_seq:
                raise FoldRefused(f"conversation {child_id!r} has messages: it cannot branch")
            rows = [
                {**r._mapping, "conversation_id": child_id}
                for r in conn.execute(
                    select(s.messages)
                    .where(m.conversation_id == parent_id, m.seq < upto)
                    .order_by(m.seq)
                )
            ]
            if rows:
                conn.execute(insert(s.messages), rows)
            versions = [
                {k: val for k, val in r._mapping.items() if k != "id"}
                | {"conversation_id": child_id}
                for r in conn.execute(
                    select(s.message_versions)
                    .where(v.conversation_id == parent_id, v.seq < upto)
                    .order_by(v.id)
                )
            ]
            if versions:
                conn.execute(insert(s.message_versions), versions)
            for item in [*active, *ready]:
                new = self._copy_item(conn, child_id, item, now)
                if item.stale and item.status == "active":
                    conn.execute(
                        insert(s.jobs).values(
                            conversation_id=child_id,
                            kind="revision",
                            first_seq=item.first_seq,
                            last_seq=item.last_seq,
                            payload={"item_id": new},
                            status="queued",
                            attempts=0,
                            run_after=now,
                            created_at=now,
                        )
                    )
            self._copy_notes(conn, parent_id, child_id, upto)
            conn.execute(
                update(s.conversations)
                .where(c.id == child_id)
                .values(next_seq=upto if rows else 0, raw_start=raw_start, memory_version=1)
            )
            return len(rows)

    def _copy_item(self, conn: Connection, child_id: str, item: MemoryItem, now: float) -> int:
        # the parent's ids in `replaces` are history the branch does not have
        values = item_values(child_id, item, created_at=now, replaces=None)
        return new_id(conn.execute(insert(s.memory_items).values(**values)))

    def _copy_notes(self, conn: Connection, parent_id: str, child_id: str, upto: int) -> None:
        t, f, mn = s.notes_ledger.c, s.note_facts.c, s.note_mentions.c
        ids: dict[int, int] = {}
        for r in conn.execute(
            select(s.notes_ledger).where(t.conversation_id == parent_id).order_by(t.id)
        ):
            if r.source_seq is not None and r.source_seq >= upto:
                continue
            values: dict[str, Any] = {k: val for k, val in r._mapping.items() if k != "id"}
            values["conversation_id"] = child_id
            values["supersedes"] = ids.get(r.supersedes) if r.supersedes is not None else None
            ids[r.id] = new_id(conn.execute(insert(s.notes_ledger).values(**values)))
        if not ids:
            return
        for r in conn.execute(select(s.note_facts).where(f.conversation_id == parent_id)):
            if r.note_id in ids:
                conn.execute(
                    insert(s.note_facts).values(
                        {**r._mapping, "note_id": ids[r.note_id], "conversation_id": child_id}
                    )
                )
        mentions = [
            {"conversation_id": child_id, "note_id": ids[r.note_id], "seq": r.seq}
            for r in conn.execute(
                select(s.note_mentions).where(mn.conversation_id == parent_id).order_by(mn.id)
            )
            if r.note_id in ids and (r.seq is None or r.seq < upto)
        ]
        if mentions:
            conn.execute(insert(s.note_mentions), mentions)
