"""Conversations, their append-only log of messages and their memory items: the `Store` every
caller holds, made of the tables' classes beside it (`kioku.store`'s docstring lists them).
Messages get a gap-free `seq` per conversation inside the transaction that stores them; nothing
here ever deletes a message. A fold (apply memory, move the raw-window start) is one transaction,
so a crash leaves either the old memory state or the new one, never half of each; `with
store.atomic():` around several methods makes them one transaction.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.sql.elements import BindParameter

from kioku.errors import FoldRefused, NameMoved, NotFound, StoreError
from kioku.ids import check_id
from kioku.memory import ItemStatus, MemoryItem, coverage_gaps
from kioku.messages import LogEntry, Message, parts_from_json
from kioku.store import schema as s
from kioku.store.blobs import Blobs
from kioku.store.chats import ClientChats
from kioku.store.db import item_values, new_id
from kioku.store.edits import MessageEdits
from kioku.store.events import EventLog
from kioku.store.jobs import JobQueue
from kioku.store.keys import ApiKeys
from kioku.store.ledger import NotesLedger
from kioku.store.listing import ConversationListing
from kioku.store.removal import ConversationRemoval
from kioku.store.segments import RecallSegments
from kioku.store.turns import TurnLocks


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
    public_id: str = ""  # the id the tenant named it by; `id` is the store's key
    # when it was made: a conversation deleted and begun again under the same key is another
    created_at: float = 0.0
    revision: int = 0  # bumps at every edit or delete of a stored message


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


# The statements every turn runs, built once: constructing a SQLAlchemy statement costs more
# than SQLite takes to answer it.
_m, _mi = s.messages.c, s.memory_items.c
_CID: BindParameter[str] = bindparam("cid")
_ROLE: BindParameter[str] = bindparam("role")
_N: BindParameter[int] = bindparam("n")
_CONVERSATION = select(s.conversations).where(s.conversations.c.id == _CID)
_BY_NAME = select(s.conversations).where(
    s.conversations.c.tenant == bindparam("tenant"),
    s.conversations.c.public_id == bindparam("name"),
)
_ENTRIES_FROM = (
    select(s.messages)
    .where(_m.conversation_id == _CID, _m.seq >= bindparam("first"))
    .order_by(_m.seq)
)
_ENTRIES_BETWEEN = _ENTRIES_FROM.where(_m.seq <= bindparam("last"))
_ENTRIES_AT = (
    select(s.messages)
    .where(_m.conversation_id == _CID, _m.seq.in_(bindparam("seqs", expanding=True)))
    .order_by(_m.seq)
)
_TAIL = select(s.messages).where(_m.conversation_id == _CID).order_by(_m.seq.desc()).limit(_N)
_TAIL_OF_ROLE = _TAIL.where(_m.role == _ROLE)
_TAIL_HASHES = (
    select(_m.seq, _m.content_hash)
    .where(_m.conversation_id == _CID)
    .order_by(_m.seq.desc())
    .limit(_N)
)
_TAIL_HASHES_OF_ROLE = _TAIL_HASHES.where(_m.role == _ROLE)
_NOTES_SNAPSHOT = select(s.notes_snapshots.c.text).where(
    s.notes_snapshots.c.conversation_id == _CID
)
_ALL_ITEMS = (
    select(s.memory_items).where(_mi.conversation_id == _CID).order_by(_mi.first_seq, _mi.id)
)
_ITEMS = _ALL_ITEMS.where(_mi.status.in_(bindparam("statuses", expanding=True)))
_NEXT_SEQ = select(s.conversations.c.next_seq).where(s.conversations.c.id == _CID)
_NEXT_SEQ_LOCKED = _NEXT_SEQ.with_for_update()  # PostgreSQL: one writer of next_seq at a time
_SET_NEXT_SEQ = (
    update(s.conversations)
    .where(s.conversations.c.id == _CID)
    .values(next_seq=bindparam("next_seq"))
)
_INSERT_MESSAGE = insert(s.messages)  # the values come as parameters: compiled once
_DERIVED_KEYS = 4  # keys derived from tenant and name before a random one


def _message_values(
    conversation_id: str, seq: int, message: Message, tokens: int, meta: Any, now: float
) -> dict[str, Any]:
    parts = message.parts_json()  # once: the hash is of it too
    return dict(
        conversation_id=conversation_id,
        seq=seq,
        role=message.role,
        author=message.author,
        at=message.at.isoformat() if message.at else None,
        parts=parts,
        text=message.text,
        tokens=tokens,
        content_hash=message.content_hash(parts),
        created_at=now,
        superseded=0,
        meta=meta,
    )


class Store(
    TurnLocks,
    JobQueue,
    EventLog,
    MessageEdits,
    NotesLedger,
    RecallSegments,
    ApiKeys,
    Blobs,
    ConversationListing,
    ClientChats,
    ConversationRemoval,
):
    """The log and memory items (the rest: the bases; turn locks and idempotency keys:
    `TurnLocks`)."""

    @property
    def _next_seq(self) -> Any:
        return _NEXT_SEQ_LOCKED if self.is_postgres else _NEXT_SEQ

    # conversations -----------------------------------------------------------------------

    def ensure_conversation(
        self,
        conversation_id: str,
        *,
        tenant: str = "default",
        system_prompt: str | None = None,
        character: str = "",
        profile: str = "local-64k",
        key: str | None = None,
    ) -> ConversationInfo:
        """The tenant's conversation named `conversation_id`, created if it is new. Ids are per
        tenant: the row's key (what every other table refers to) is `planned_key`, so a tenant
        can neither take nor detect another tenant's id. Read it back as `ConversationInfo.id`.
        With `key` (the key whose turn lock the caller holds) a new conversation gets exactly
        that key: `NameMoved` when the name belongs to another key, or the key was taken."""
        name = {"tenant": tenant, "name": conversation_id}
        with self.atomic() as conn:
            row = conn.execute(_BY_NAME, name).first()
            if row is None:
                check_id(conversation_id)  # only new ids: ones stored before the rule stay
                # ON CONFLICT DO NOTHING: another tenant may hold the key, or (without `key`)
                # two first turns of one conversation may race here
                conn.execute(
                    self._insert_ignore(s.conversations).values(
                        id=key or self.planned_key(tenant, conversation_id),
                        public_id=conversation_id,
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
                row = conn.execute(_BY_NAME, name).first()
                if row is None:
                    raise NameMoved(f"the key {key!r} was taken while {conversation_id!r} waited")
            elif system_prompt is not None and system_prompt != row.system_prompt:
                conn.execute(
                    update(s.conversations)
                    .where(s.conversations.c.id == row.id)
                    .values(system_prompt=system_prompt)
                )
            if key is not None and row.id != key:
                raise NameMoved(f"{conversation_id!r} is kept under another key now")
        return self.conversation(row.id, tenant=tenant)

    def planned_key(self, tenant: str, conversation_id: str) -> str:
        """The key a new conversation named `conversation_id` gets: the name itself while no
        conversation of any tenant has it as its key, else one derived from tenant and name (the
        same for two first requests that race, so they take the same turn lock); random only
        when a renamed conversation still holds every derived one."""
        seed = f"{tenant}\0{conversation_id}"
        derived = [
            "~" + hashlib.sha256(f"{seed}\0{n}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
            for n in range(_DERIVED_KEYS)
        ]
        candidates = [conversation_id, *derived]
        c = s.conversations.c
        with self.reading() as conn:
            taken = set(conn.execute(select(c.id).where(c.id.in_(candidates))).scalars())
        return next((k for k in candidates if k not in taken), f"~{uuid.uuid4().hex}")

    def conversation_key(self, tenant: str, conversation_id: str) -> str | None:
        """The key of the tenant's conversation named `conversation_id`, None if it has none."""
        with self.reading() as conn:
            row = conn.execute(_BY_NAME, {"tenant": tenant, "name": conversation_id}).first()
        return None if row is None else str(row.id)

    def find_conversation(self, tenant: str, conversation_id: str) -> ConversationInfo:
        """The tenant's conversation by the id the tenant named it (NotFound if none)."""
        with self.reading() as conn:
            row = conn.execute(_BY_NAME, {"tenant": tenant, "name": conversation_id}).first()
        if row is None:
            raise NotFound(f"no conversation {conversation_id!r}; `kioku memory` lists them")
        return self.conversation(row.id, tenant=tenant)

    def conversation(self, conversation_id: str, tenant: str | None = None) -> ConversationInfo:
        with self.reading() as conn:
            row = conn.execute(_CONVERSATION, {"cid": conversation_id}).first()
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFound(f"no conversation {conversation_id!r}; `kioku memory` lists them")
        return ConversationInfo(
            id=row.id,
            tenant=row.tenant,
            character=row.character,
            system_prompt=row.system_prompt,
            profile=row.profile,
            next_seq=row.next_seq,
            raw_start=row.raw_start,
            memory_version=row.memory_version,
            public_id=row.public_id or row.id,
            created_at=row.created_at,
            revision=row.revision,
        )

    def conversations(self, tenant: str | None = None) -> list[ConversationInfo]:
        q = select(s.conversations.c.id).order_by(s.conversations.c.created_at)
        if tenant is not None:
            q = q.where(s.conversations.c.tenant == tenant)
        with self.reading() as conn:
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
        row = conn.execute(self._next_seq, {"cid": conversation_id}).first()
        if row is None:
            raise NotFound(f"no conversation {conversation_id!r}")
        seq = int(row.next_seq)
        conn.execute(_SET_NEXT_SEQ, {"cid": conversation_id, "next_seq": seq + 1})
        values = _message_values(conversation_id, seq, message, tokens, meta, time.time())
        conn.execute(_INSERT_MESSAGE, values)
        return LogEntry(seq=seq, message=message, tokens=tokens, meta=meta or {})

    def entries(
        self, conversation_id: str, first: int = 0, last: int | None = None
    ) -> list[LogEntry]:
        q = _ENTRIES_FROM if last is None else _ENTRIES_BETWEEN
        params = {"cid": conversation_id, "first": first, "last": last}
        with self.reading() as conn:
            return [_message_row(r) for r in conn.execute(q, params)]

    def entries_at(self, conversation_id: str, seqs: Sequence[int]) -> list[LogEntry]:
        """The messages with these seqs (those that exist), in seq order, in one query."""
        if not seqs:
            return []
        params = {"cid": conversation_id, "seqs": list(seqs)}
        with self.reading() as conn:
            return [_message_row(r) for r in conn.execute(_ENTRIES_AT, params)]

    def tail(self, conversation_id: str, n: int, role: str | None = None) -> list[LogEntry]:
        """The newest `n` messages (of one role), oldest first."""
        q = _TAIL if role is None else _TAIL_OF_ROLE
        with self.reading() as conn:
            rows = list(conn.execute(q, {"cid": conversation_id, "role": role, "n": n}))
        return [_message_row(r) for r in reversed(rows)]

    def tail_hashes(
        self, conversation_id: str, n: int, role: str | None = None
    ) -> list[tuple[int, str]]:
        """(seq, content hash) of what `tail` would return: a cheap "has it changed?" key."""
        q = _TAIL_HASHES if role is None else _TAIL_HASHES_OF_ROLE
        with self.reading() as conn:
            rows = list(conn.execute(q, {"cid": conversation_id, "role": role, "n": n}))
        return [(int(r.seq), str(r.content_hash)) for r in reversed(rows)]

    def notes_snapshot(self, conversation_id: str) -> str:
        with self.reading() as conn:
            row = conn.execute(_NOTES_SNAPSHOT, {"cid": conversation_id}).first()
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
        with self.reading() as conn:
            return int(conn.execute(q).scalar_one())

    # memory ------------------------------------------------------------------------------

    def items(self, conversation_id: str, *statuses: ItemStatus) -> list[MemoryItem]:
        q, params = _ITEMS, {"cid": conversation_id, "statuses": list(statuses)}
        if not statuses:
            q = _ALL_ITEMS
        with self.reading() as conn:
            return [_item_row(r) for r in conn.execute(q, params)]

    def add_item(self, conversation_id: str, item: MemoryItem) -> int:
        replaces = list(item.replaces) if item.replaces else None
        values = item_values(conversation_id, item, created_at=time.time(), replaces=replaces)
        with self.atomic() as conn:
            return new_id(conn.execute(insert(s.memory_items).values(**values)))

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
            added = [self.add_item(conversation_id, it) for it in add]
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
                raise FoldRefused("; ".join(problems))
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

    # bulk writes -------------------------------------------------------------------------

    def append_many(
        self, conversation_id: str, messages: Sequence[tuple[Message, int]], batch: int = 5000
    ) -> list[LogEntry]:
        """Store many (message, tokens) at once, in one transaction, under consecutive gap-free
        seqs, oldest first. A stateless client's first request may carry thousands (one
        transaction each took 2 ms per message); benchmarks lay out long histories with it."""
        if not messages:
            return []
        with self.atomic() as conn:
            row = conn.execute(self._next_seq, {"cid": conversation_id}).first()
            if row is None:
                raise NotFound(f"no conversation {conversation_id!r}")
            first, now = int(row.next_seq), time.time()
            rows = [
                _message_values(conversation_id, first + i, m, tokens, None, now)
                for i, (m, tokens) in enumerate(messages)
            ]
            for values in rows:  # NULL, not the JSON text "null" a None would be written as
                del values["meta"]
            if conn.dialect.name == "sqlite":
                # the values are plain strings and numbers already: SQLAlchemy's processing of
                # each row's parameters was a third of a 20,000-message first sync
                names = list(rows[0])
                sql = (
                    f"INSERT INTO messages ({', '.join(names)}) "
                    f"VALUES ({', '.join('?' * len(names))})"
                )
                conn.exec_driver_sql(sql, [tuple(r.values()) for r in rows])
            else:
                for k in range(0, len(rows), batch):
                    conn.execute(_INSERT_MESSAGE, rows[k : k + batch])
            conn.execute(_SET_NEXT_SEQ, {"cid": conversation_id, "next_seq": first + len(rows)})
        return [LogEntry(seq=first + i, message=m, tokens=t) for i, (m, t) in enumerate(messages)]

    # what a turn was shown (issue 9) --------------------------------------------------------

    def set_meta(self, conversation_id: str, seq: int, meta: dict[str, Any]) -> None:
        """Replace a message's metadata (what kioku showed beside it; never its content)."""
        with self.atomic() as conn:
            m = s.messages.c
            conn.execute(
                update(s.messages)
                .where(m.conversation_id == conversation_id, m.seq == seq)
                .values(meta=meta)
            )

    # the command line and the console (issue 15) --------------------------------------------

    def holds_nothing(self) -> bool:
        """No conversation and no API key: a database a failed command may remove again."""
        with self.reading() as conn:
            for t in (s.conversations, s.api_keys):
                if conn.execute(select(func.count()).select_from(t)).scalar_one():
                    return False
        return True

    def last_activity(self, tenant: str | None = None) -> dict[str, float]:
        """When each conversation last got a message (its creation time when it has none)."""
        c, m = s.conversations.c, s.messages.c
        # the newest message is the one at next_seq - 1: a primary-key lookup, not a scan
        newest = (m.conversation_id == c.id) & (m.seq == c.next_seq - 1)
        q = select(c.id, func.coalesce(m.created_at, c.created_at)).select_from(
            s.conversations.outerjoin(s.messages, newest)
        )
        if tenant is not None:
            q = q.where(c.tenant == tenant)
        with self.reading() as conn:
            return {cid: float(at) for cid, at in conn.execute(q)}

    def stored_at(self, conversation_id: str, first: int, last: int) -> dict[int, float]:
        """When each message from `first` to `last` was stored (a client may send no time)."""
        m = s.messages.c
        q = select(m.seq, m.created_at).where(
            m.conversation_id == conversation_id, m.seq >= first, m.seq <= last
        )
        with self.reading() as conn:
            return {int(seq): float(at) for seq, at in conn.execute(q)}
