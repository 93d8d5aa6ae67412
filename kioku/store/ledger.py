"""The notes ledger in the store: entries are appended, never updated or deleted.

`kioku.notes` decides what to write (an extracted fact, an operator's edit, a retraction) and
replays the ledger into the notes in force; this is the SQL of it. Read and write inside one
`with store.atomic():` to decide on what is there and append in the same transaction.

Beside each extracted entry the fact ledger (issue 14) keeps who said it, the date of what it
records and the slot it fills (`note_facts`), and every message that stated it again
(`note_mentions`), so facts are ranked by how often they come up across the whole conversation.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, insert, select

from kioku.errors import NotFound
from kioku.note import Author, Note, NoteDraft
from kioku.store import schema as s
from kioku.store.db import Database, new_id


def _note(r: Any, facts: Any = None, mentions: tuple[int, int | None] | None = None) -> Note:
    return Note(
        id=r.id,
        subject=r.subject,
        kind=r.kind,
        text=r.text,
        author=r.author,
        source_seq=r.source_seq,
        supersedes=r.supersedes,
        retracted=bool(r.retracted),
        origin=r.origin,
        created_at=r.created_at,
        said_by=facts.said_by if facts is not None else "",
        on_date=facts.on_date if facts is not None else None,
        slot=facts.slot if facts is not None else "",
        mentions=mentions[0] if mentions else 1,
    )


class NotesLedger(Database):
    def note_ledger(self, conversation_id: str) -> list[Note]:
        """Every entry ever written for the conversation, superseded and retracted ones
        included, oldest first."""
        t, f, m = s.notes_ledger.c, s.note_facts.c, s.note_mentions.c
        q = select(s.notes_ledger).where(t.conversation_id == conversation_id).order_by(t.id)
        facts_q = select(s.note_facts).where(f.conversation_id == conversation_id)
        mentions_q = (
            select(m.note_id, func.count(), func.max(m.seq))
            .where(m.conversation_id == conversation_id)
            .group_by(m.note_id)
        )
        with self.reading() as conn:
            facts = {int(r.note_id): r for r in conn.execute(facts_q)}
            counts = {int(r[0]): (int(r[1]), r[2]) for r in conn.execute(mentions_q)}
            return [_note(r, facts.get(r.id), counts.get(r.id)) for r in conn.execute(q)]

    def add_note(
        self,
        conversation_id: str,
        draft: NoteDraft,
        *,
        author: Author,
        origin: str,
        retracted: bool = False,
    ) -> int:
        """Append one entry as written; return its id (NotFound when the conversation was
        deleted meanwhile: notes from a late reply are not kept)."""
        with self.atomic() as conn:
            if not self._still_there(conn, conversation_id):
                raise NotFound(f"conversation {conversation_id!r} was deleted")
            r = conn.execute(
                insert(s.notes_ledger).values(
                    conversation_id=conversation_id,
                    subject=draft.subject,
                    kind=draft.kind,
                    text=draft.text,
                    source_seq=draft.source_seq,
                    author=author,
                    supersedes=draft.supersedes,
                    retracted=int(retracted),
                    origin=origin,
                    created_at=time.time(),
                )
            )
            return new_id(r)

    # the fact ledger (issue 14) -------------------------------------------------------------

    def add_note_facts(
        self,
        conversation_id: str,
        note_id: int,
        *,
        said_by: str,
        on_date: str | None,
        slot: str,
        seq: int | None,
    ) -> None:
        """Record who said a new extracted entry, the date of what it records and its slot,
        and count the message it came from as its first mention."""
        with self.atomic() as conn:
            conn.execute(
                insert(s.note_facts).values(
                    note_id=note_id,
                    conversation_id=conversation_id,
                    said_by=said_by,
                    on_date=on_date,
                    slot=slot,
                )
            )
            self.add_note_mention(conversation_id, note_id, seq)

    def add_note_mention(self, conversation_id: str, note_id: int, seq: int | None) -> None:
        """A message stated a note in force again."""
        with self.atomic() as conn:
            if not self._still_there(conn, conversation_id):
                return
            conn.execute(
                insert(s.note_mentions).values(
                    conversation_id=conversation_id, note_id=note_id, seq=seq
                )
            )

    def note_mention_seqs(self, conversation_id: str) -> dict[int, list[int]]:
        """Every message each note was taken from (its first statement and its mentions)."""
        m = s.note_mentions.c
        q = select(m.note_id, m.seq).where(m.conversation_id == conversation_id).order_by(m.id)
        out: dict[int, list[int]] = {}
        with self.reading() as conn:
            for note_id, seq in conn.execute(q):
                if seq is not None:
                    out.setdefault(int(note_id), []).append(int(seq))
        return out
