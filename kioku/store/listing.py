"""Conversations listed a page at a time, in one query, and which tenants hold conversations.

`GET /v1/conversations` once read every conversation of the tenant one query each (10,000
conversations: 1.15 MB in 0.87 s). A page is one statement here: the conversations with their
last activity (the newest message is the one at `next_seq - 1`: a primary-key lookup), matched,
ordered latest activity first and cut at the page's end, the next page named by a cursor on
(last activity, id). The command line asks `tenants` which tenant a command means when it is
not told (`kioku.terminal.tenant`), and `tenant_counts` which tenant holds the
conversations a command did not find under its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select, union

from kioku.store import schema as s
from kioku.store.db import Database


@dataclass(frozen=True)
class ListedConversation:
    id: str  # the id the tenant named it by
    key: str  # the store's key
    character: str
    messages: int
    raw_start: int
    memory_version: int
    last_activity: float


def _like(text: str) -> str:
    escaped = text.casefold().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class ConversationListing(Database):
    def conversation_page(
        self,
        tenant: str,
        *,
        limit: int,
        query: str | None = None,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[ListedConversation], tuple[float, str] | None]:
        """A tenant's conversations, latest activity first: up to `limit` of those whose id or
        character holds `query` (any case), after the cursor `before` (the last activity and
        key of the previous page's last row). Returns the page and the next page's cursor."""
        c, m = s.conversations.c, s.messages.c
        newest = (m.conversation_id == c.id) & (m.seq == c.next_seq - 1)
        active = func.coalesce(m.created_at, c.created_at)
        public = func.coalesce(c.public_id, c.id)
        q = (
            select(public, c.id, c.character, c.next_seq, c.raw_start, c.memory_version, active)
            .select_from(s.conversations.outerjoin(s.messages, newest))
            .where(c.tenant == tenant)
        )
        if query:
            # PostgreSQL's lower() knows every script; SQLite's only ASCII, so kioku gives it
            # Python's casefold (`kioku.db`)
            fold = func.lower if self.is_postgres else func.kioku_casefold
            pattern = _like(query)
            q = q.where(
                or_(
                    fold(public).like(pattern, escape="\\"),
                    fold(c.character).like(pattern, escape="\\"),
                )
            )
        if before is not None:
            at, key = before
            q = q.where(or_(active < at, and_(active == at, c.id < key)))
        q = q.order_by(active.desc(), c.id.desc()).limit(limit + 1)
        with self.reading() as conn:
            rows = [
                ListedConversation(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), float(r[6]))
                for r in conn.execute(q)
            ]
        page = rows[:limit]
        more = len(rows) > limit
        return page, ((page[-1].last_activity, page[-1].key) if more and page else None)

    def tenant_counts(self, conversation_id: str | None = None) -> dict[str, int]:
        """How many conversations each tenant holds (with `conversation_id`: only those the
        tenant named so)."""
        c = s.conversations.c
        q = select(c.tenant, func.count()).group_by(c.tenant).order_by(c.tenant)
        if conversation_id is not None:
            q = q.where(func.coalesce(c.public_id, c.id) == conversation_id)
        with self.reading() as conn:
            return {str(t): int(n) for t, n in conn.execute(q)}

    def tenants(self) -> list[str]:
        """The tenants of this database: those holding conversations and those with a live API
        key (a key's chats belong to its tenant before the first one is made), sorted."""
        c, k = s.conversations.c, s.api_keys.c
        q = union(
            select(c.tenant).distinct(),
            select(k.tenant).where(k.revoked_at.is_(None)).distinct(),
        )
        with self.reading() as conn:
            return sorted({str(r[0]) for r in conn.execute(q)})
