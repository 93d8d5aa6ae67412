"""The archive index's persisted segments, in the store.

`kioku.recall` keeps one BM25 index per conversation as immutable segments; the messages table
stays the source of truth, so a segment lost or written by another tokenizer only costs a
rebuild. The store keeps them as bytes and knows nothing of their format.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, insert, select

from kioku.store import schema as s
from kioku.store.db import Database


@dataclass(frozen=True)
class StoredSegment:
    first_seq: int
    last_seq: int
    tokenizer: str
    data: bytes


class RecallSegments(Database):
    def recall_segments(self, conversation_id: str) -> list[StoredSegment]:
        """The conversation's segments, in seq order."""
        t = s.recall_segments.c
        q = (
            select(s.recall_segments)
            .where(t.conversation_id == conversation_id)
            .order_by(t.first_seq)
        )
        with self.reading() as conn:
            rows = list(conn.execute(q))
        return [StoredSegment(r.first_seq, r.last_seq, r.tokenizer, r.data) for r in rows]

    def drop_recall_segments(self, conversation_id: str) -> None:
        with self.atomic() as conn:
            conn.execute(
                delete(s.recall_segments).where(
                    s.recall_segments.c.conversation_id == conversation_id
                )
            )

    def save_recall_segments(
        self, conversation_id: str, segments: Iterable[StoredSegment], replace: bool = False
    ) -> None:
        """Persist segments (with `replace`, instead of all the conversation's segments). One
        another process persisted first for the same range is kept: same postings."""
        t = s.recall_segments.c
        with self.atomic() as conn:
            if not self._still_there(conn, conversation_id):
                return  # deleted meanwhile
            if replace:
                conn.execute(delete(s.recall_segments).where(t.conversation_id == conversation_id))
            for seg in segments:
                clash = conn.execute(
                    select(t.first_seq).where(
                        t.conversation_id == conversation_id, t.first_seq == seg.first_seq
                    )
                ).first()
                if clash:
                    continue
                conn.execute(
                    insert(s.recall_segments).values(
                        conversation_id=conversation_id,
                        first_seq=seg.first_seq,
                        last_seq=seg.last_seq,
                        tokenizer=seg.tokenizer,
                        data=seg.data,
                        created_at=time.time(),
                    )
                )
