"""The notes ledger in the store: entries are appended, never updated or deleted.

`kioku.notes` decides what to write (an extracted fact, an operator's edit, a retraction) and
replays the ledger into the notes in force; this is the SQL of it. Read and write inside one
`with store.atomic():` to decide on what is there and append in the same transaction.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import insert, select

from kioku import schema as s
from kioku.db import Database, new_id
from kioku.notes import Author, Note, NoteDraft


def _note(r: Any) -> Note:
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
    )


class NotesLedger(Database):
    def note_ledger(self, conversation_id: str) -> list[Note]:
        """Every entry ever written for the conversation, superseded and retracted ones
        included, oldest first."""
        t = s.notes_ledger.c
        q = select(s.notes_ledger).where(t.conversation_id == conversation_id).order_by(t.id)
        with self.reading() as conn:
            return [_note(r) for r in conn.execute(q)]

    def add_note(
        self,
        conversation_id: str,
        draft: NoteDraft,
        *,
        author: Author,
        origin: str,
        retracted: bool = False,
    ) -> int:
        """Append one entry as written; return its id."""
        with self.atomic() as conn:
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
