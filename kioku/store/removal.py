"""Deleting a conversation: every row of it, in every table, in one transaction.

"Your chats are yours" (issue 42): a user who deletes a conversation expects its log, versions,
memory, notes, ledger, jobs, recall index, events and media gone, not hidden. The tables are
found from the schema rather than listed here, so a table added later is covered without
anyone remembering this module: a row belongs to a conversation when its `conversation_id` is
the conversation's key, or (the turn lock and idempotency records, kept by the id a client
sent) its `tenant` and `conversation` name it. Media blobs are shared by content: a blob goes
when no message, version or choice left in the database refers to it.

What takes the turn lock around this (a turn in flight finishes first) is the caller's:
`kioku.service.deletion`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, delete, func, select

from kioku.messages import MEDIA_KINDS, parts_from_json
from kioku.store import schema as s
from kioku.store.db import Database

CONVERSATION_COLUMN = "conversation_id"
BY_NAME_COLUMNS = ("tenant", "conversation")  # rows kept by the id a client sent
PARTS_COLUMN = "parts"  # message-shaped rows: their media parts name blobs


def _owned(table: Table, key: str, tenant: str, names: Iterable[str]) -> Any:
    """The WHERE clause of `table`'s rows of the conversation, None if it holds none."""
    cols = table.c
    if table is s.conversations:
        return cols.id == key
    if CONVERSATION_COLUMN in cols:
        return cols[CONVERSATION_COLUMN] == key
    if all(c in cols for c in BY_NAME_COLUMNS):
        return (cols.tenant == tenant) & cols.conversation.in_(sorted(set(names)))
    return None


class ConversationRemoval(Database):
    """`delete_conversation` (a base of `Store`)."""

    def delete_conversation(self, key: str) -> dict[str, int]:
        """Delete every row of the conversation whose store key is `key`, in one transaction;
        return the rows deleted per table (tables with none left out). NotFound-free: a key
        with no conversation deletes whatever rows still name it."""
        with self.atomic() as conn:
            # locked first: a late write (`Database._still_there`) waits, then finds it gone
            row = conn.execute(
                select(s.conversations.c.tenant, s.conversations.c.public_id)
                .where(s.conversations.c.id == key)
                .with_for_update()
            ).first()
            tenant = row.tenant if row is not None else ""
            names = {key, row.public_id or key} if row is not None else {key}
            refs = self._media_refs(conn, key)
            deleted: dict[str, int] = {}
            # dependents first (a fact names its ledger entry), the conversation's row last
            for table in reversed(s.metadata.sorted_tables):
                where = _owned(table, key, tenant, names)
                if where is None:
                    continue
                n = conn.execute(delete(table).where(where)).rowcount
                if n:
                    deleted[table.name] = int(n)
            gone = self._unreferenced(conn, refs)
            if gone:
                n = conn.execute(delete(s.blobs).where(s.blobs.c.sha256.in_(gone))).rowcount
                deleted[s.blobs.name] = int(n or 0)
        return deleted

    def _media_refs(self, conn: Connection, key: str) -> set[str]:
        """The blobs the conversation's messages, versions and choices name."""
        refs: set[str] = set()
        for table in _message_tables():
            q = select(table.c[PARTS_COLUMN]).where(table.c[CONVERSATION_COLUMN] == key)
            for (parts,) in conn.execute(q):
                refs.update(
                    p.ref for p in parts_from_json(parts) if p.kind in MEDIA_KINDS and p.ref
                )
        return refs

    def _unreferenced(self, conn: Connection, refs: set[str]) -> list[str]:
        """Of `refs`, the blobs no row left names (a picture two chats sent is kept once)."""
        gone = []
        for sha in sorted(refs):
            named = [
                select(func.count())
                .select_from(t)
                .where(t.c[PARTS_COLUMN].contains(sha, autoescape=True))
                for t in _message_tables()
            ]
            if not any(conn.execute(q).scalar_one() for q in named):
                gone.append(sha)
        return gone


def _message_tables() -> list[Table]:
    return [
        t for t in s.metadata.sorted_tables if PARTS_COLUMN in t.c and CONVERSATION_COLUMN in t.c
    ]
