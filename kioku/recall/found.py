"""What a search found, as a person reads it: the messages that match, each with its neighbours
as context.

The archive scores windows (`ArchiveIndex.search`: each message with `reach` neighbours each
side, weighted down): a message that matches lifts the windows centred on its neighbours too, so
the hits of one match were the message and those around it, each listed with a score as if it
matched (issue 42). Here each hit is the message of its window that holds the most of the
query's terms (the nearest the centre on a tie), a message found twice is listed once (at its
best score), and the messages beside it are context, shown and never scored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kioku.messages import LogEntry
from kioku.recall.archive import DEFAULT_REACH, Hit, index_text

NEIGHBOURS = 1  # messages on each side of a hit shown as its context


@dataclass(frozen=True)
class Found:
    seq: int  # the message that matches
    score: float  # its window's score
    context: tuple[int, ...]  # the seqs around it, shown, not scored


def around(hits: Sequence[Hit], reach: int = DEFAULT_REACH) -> list[int]:
    """Every seq a hit's match or its context may be: read these before `found`."""
    far = reach + NEIGHBOURS  # a match at the window's edge, and the context beyond it
    return sorted({h.seq + d for h in hits for d in range(-far, far + 1) if h.seq + d >= 0})


def found(
    hits: Sequence[Hit],
    entries: Mapping[int, LogEntry],
    query: str,
    terms: Callable[[str], Sequence[str]],
    reach: int = DEFAULT_REACH,
) -> list[Found]:
    """The messages `hits` (best first) found, best first, each once, with their context.
    `reach`: the index's, how far from its centre a window reads."""
    wanted = set(terms(query))

    def weight(seq: int) -> int:
        return len(wanted & set(terms(index_text(entries[seq]))))

    out: list[Found] = []
    listed: set[int] = set()
    for h in hits:
        window = [q for q in range(h.seq - reach, h.seq + reach + 1) if q in entries]
        if not window:
            continue
        best = max(window, key=lambda q: (weight(q), -abs(q - h.seq)))
        if best in listed:
            continue
        listed.add(best)
        near = range(best - NEIGHBOURS, best + NEIGHBOURS + 1)
        out.append(Found(best, h.score, tuple(q for q in near if q != best and q in entries)))
    return out
