"""What the user takes back is gone from what any model reads (issue 43).

A user deletes or edits a stored message (a client's sync, `DELETE
/v1/conversations/{id}/messages/{seq}`, `kioku forget`), or a reply is regenerated. The log keeps
the old text as a version for the operator (`kioku.store.edits`); everything a model reads
forgets it, in the same transaction as the change:

- memory items over it are marked stale and written again (`kioku.revisions`); until then the
  prompt shows the corrected messages in their place;
- every note taken from it is retracted in the ledger, with the change as the reason
  (`kioku.notes.retract_sources`), and the notes the memory exchange shows are rendered again
  (`Conversation.revise`);
- a recollection that quoted it, shown with a later message and kept there so later turns show
  it unchanged (`kioku.context.Extras`), is taken off that message;
- the recall index forgets its old text (its segments from the message on are dropped and the
  conversation's revision bumps, so every process loads it again: `kioku.recall.indexes`).

A reply continued (`continue`) keeps what it said: nothing is taken back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kioku.context import EXTRAS_KEY, extras_of
from kioku.messages import LogEntry, Message
from kioku.notes import TAKEN_BACK, retract_sources
from kioku.revisions import Change
from kioku.store import Store


@dataclass(frozen=True)
class TakenBack:
    retracted: tuple[int, ...] = ()  # ledger entries written (one per note retracted)
    unshown: tuple[int, ...] = ()  # messages whose kept recollections were taken off


def taken(changes: Iterable[Change]) -> dict[int, str]:
    """seq → the change that takes its old text back (a deletion, an edit, a regeneration)."""
    out: dict[int, str] = {}
    for ch in changes:
        kind = "delete" if ch.message is None else ch.kind
        if kind in TAKEN_BACK:
            out[ch.seq] = kind
    return out


def quotes(ranges: Sequence[tuple[int, int]], seqs: Iterable[int]) -> bool:
    return any(a <= q <= b for q in seqs for a, b in ranges)


def unshow(store: Store, conversation_id: str, seqs: Sequence[int], since: int) -> list[int]:
    """Take the kept recollections that quote any of `seqs` off the messages from `since` (the
    raw window's start: only those are shown again) on; return those messages' seqs."""
    out: list[int] = []
    first = max(since, min(seqs) + 1) if seqs else since
    for seq, meta in store.metas_from(conversation_id, first):
        extras = extras_of(LogEntry(seq, Message("user", ()), 0, meta))
        if extras is None or not quotes((*extras.recalled, *extras.once_recalled), seqs):
            continue
        store.set_meta(conversation_id, seq, {k: v for k, v in meta.items() if k != EXTRAS_KEY})
        out.append(seq)
    return out


def take_back(
    store: Store, conversation_id: str, changes: Iterable[Change], raw_start: int
) -> TakenBack:
    """Retract the notes taken from changed messages and unshow the recollections that quoted
    them, in the caller's transaction (or one of its own); log what was done."""
    gone = taken(changes)
    if not gone:
        return TakenBack()
    with store.atomic():
        retracted = retract_sources(store, conversation_id, gone)
        unshown = unshow(store, conversation_id, sorted(gone), raw_start)
        if retracted or unshown:
            store.log(
                conversation_id,
                "takeback",
                "ok",
                first_seq=min(gone),
                last_seq=max(gone),
                detail=(
                    ", ".join(f"#{q} {TAKEN_BACK[k]}" for q, k in sorted(gone.items()))
                    + f"; notes retracted: {len(retracted)}; recollections unshown: "
                    f"{len(unshown)}"
                ),
            )
    return TakenBack(tuple(retracted), tuple(unshown))
