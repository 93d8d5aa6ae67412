"""What the chat-completions protocol adds to the store: media blobs and a reply's other choices.

`kioku.chat_messages` says why (issue 13): a media part (an image) is kept whole in `blobs`,
named by the sha256 of its canonical JSON, so the message rows read at every turn hold only the name and
a picture sent twice is stored once; a reply asked for with n > 1 stores choice 0 in the log and
the others in `reply_choices`, offered beside it as swipes. This is the SQL of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import delete, insert, select

from kioku.messages import Message, parts_from_json
from kioku.store import schema as s
from kioku.store.db import Database


class Blobs(Database):
    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Keep media parts by their sha256 (one already stored is left as it is)."""
        if not blobs:
            return
        now = time.time()
        with self.atomic() as conn:
            for sha, data in blobs.items():
                conn.execute(
                    self._insert_ignore(s.blobs).values(
                        sha256=sha, data=data, size=len(data), created_at=now
                    )
                )

    def blobs(self, shas: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among `shas`, in one query."""
        wanted = sorted(set(shas))
        if not wanted:
            return {}
        b = s.blobs.c
        with self.reading() as conn:
            rows = conn.execute(select(b.sha256, b.data).where(b.sha256.in_(wanted)))
            return {r.sha256: bytes(r.data) for r in rows}

    def set_choices(self, conversation_id: str, seq: int, messages: Sequence[Message]) -> None:
        """The other choices (1, 2, …) of the reply stored at `seq`, in place of any a reply
        that was there before (a regeneration) had."""
        now = time.time()
        c = s.reply_choices.c
        with self.atomic() as conn:
            conn.execute(
                delete(s.reply_choices).where(c.conversation_id == conversation_id, c.seq == seq)
            )
            for n, m in enumerate(messages, start=1):
                conn.execute(
                    insert(s.reply_choices).values(
                        conversation_id=conversation_id,
                        seq=seq,
                        choice=n,
                        role=m.role,
                        author=m.author,
                        parts=m.parts_json(),
                        text=m.text,
                        created_at=now,
                    )
                )

    def choices(self, conversation_id: str, seq: int) -> list[Message]:
        """The other choices of the reply at `seq`, choice 1 first."""
        c = s.reply_choices.c
        q = (
            select(s.reply_choices)
            .where(c.conversation_id == conversation_id, c.seq == seq)
            .order_by(c.choice)
        )
        with self.reading() as conn:
            return [
                Message(role=r.role, parts=parts_from_json(r.parts), author=r.author)
                for r in conn.execute(q)
            ]
