"""Habits out of memory already written: an item stored before one of its lines became a habit.

The extractive chronicler never keeps a habit (a line the conversation says word for word
`HABIT_TIMES` times or more, `kioku.worth`), but the first time a line is said nobody knows it
will be: "I like the fog." may sit in chapter 2 before the conversation says it a third time in
chapter 9. When a chapter is written, every extractive chapter and synopsis in memory that
holds a line which has since become a habit gets a tidied copy: the same range, the same lines
less the habits. It is stored as a revision of that item (`replaces`), and the policy swaps it
in at the next fold (`policy._swap_revisions` holds it until a turn that folds anyway), so the
prefix breaks where it breaks for the fold. The synopsis stands first in memory: its swap
re-reads all of memory once, instead of carrying the habit in every prompt until the next major
GC. A model's item is not tidied: it paraphrases, it does not copy lines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from kioku.generations import TIDIED
from kioku.memory import MemoryItem
from kioku.scenes import scenes_in
from kioku.structure import is_structured
from kioku.summarizer import Line, render_lines, stored_lines
from kioku.worth import HABIT_TIMES, Usage


def tidied(item: MemoryItem, usage: Usage, lang: str = "en") -> MemoryItem | None:
    """`item` without the lines that have become habits, as a ready revision of it; None when
    it holds none (or is not the extractive chronicler's)."""
    if item.kind not in ("chapter", "synopsis") or item.stale or item.id is None:
        return None
    if is_structured(item.data):
        return None
    rows = item.data.get("lines") if isinstance(item.data, Mapping) else None
    if not isinstance(rows, list) or not rows:
        return None
    lines = stored_lines(item)
    kept = [ln for ln in lines if ln.must or usage.times(ln.text) < HABIT_TIMES]
    if len(kept) == len(lines):
        return None
    known = scenes_in(item.data)
    text = render_lines(kept, known, lang)
    # the counter is the chronicler's: scaled from the item's own count, rounded up, so the
    # budget never counts it short
    tokens = math.ceil(item.tokens * len(text) / max(1, len(item.text))) if text else 0
    data = {
        **item.data,
        "lines": [ln.to_json() for ln in kept],
        "scenes": [known[k].to_json() for k in sorted(_scenes(kept)) if k in known],
        TIDIED: True,
    }
    return replace(
        item, text=text, tokens=tokens, data=data, status="ready", id=None, replaces=(item.id,)
    )


def _scenes(lines: Iterable[Line]) -> set[int]:
    return {ln.scene for ln in lines if ln.scene is not None}


def tidy_revisions(
    active: Iterable[MemoryItem],
    ready: Iterable[MemoryItem],
    usage: Usage,
    ready_at: float,
    lang: str = "en",
) -> list[MemoryItem]:
    """A tidied copy of each active chapter or synopsis holding a habit that no ready revision
    rewrites yet (one at a time: the next fold after it is swapped in tidies it again if need
    be)."""
    pending = {r for item in ready for r in item.replaces}
    out = []
    for item in active:
        if item.id in pending:
            continue
        if (t := tidied(item, usage, lang)) is not None:
            out.append(replace(t, ready_at=ready_at))
    return out
