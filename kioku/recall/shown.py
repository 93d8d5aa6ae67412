"""What a prompt already shows of the past, so that recall never shows it again (SPEC §7).

Besides the raw window's own messages, two parts of the prompt hold lines of the archive: the
recollections earlier turns were shown and carry in front of their messages (`context.Extras`),
and memory, whose extractive chapters quote lines as they were said. A recollection of a line
one of them shows costs its tokens twice and says nothing new; as evidence that the past is
wanted it is no evidence at all (`kioku.recall.need`). A line counts as shown by memory only when
memory holds all of its words in order (a chapter that quotes one sentence of a message, or
retells it, does not show the rest of it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kioku.context import extras_of, gist
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry

# a line this short ("ok", "haha yes") is in any text: it is not "shown" by being there
MIN_SHOWN_CHARS = 16
_KEPT = 64  # memory states whose rendering is kept (one per conversation served lately)
_cache: OrderedDict[tuple[object, ...], tuple[str, str]] = OrderedDict()
_lock = threading.Lock()


def _memory(memory: Memory, lang: str) -> tuple[str, str]:
    """Memory as the prompt renders it, and its `gist`: rendered once per memory state (it
    changes only at a fold), not every turn."""
    key = (lang, memory.notes, tuple((i.id, i.first_seq, i.stale, i.tokens) for i in memory.items))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    text = render_memory(memory, lang)[0] if not memory.is_empty() else ""
    found = (text, gist(text))
    with _lock:
        _cache[key] = found
        while len(_cache) > _KEPT:
            _cache.popitem(last=False)
    return found


@dataclass(frozen=True)
class Shown:
    """What the prompt shows this turn besides the archive's other lines."""

    memory_text: str  # memory as rendered (for names it holds)
    memory_gist: str
    raw_gists: frozenset[str]  # the raw window's lines, by `gist`
    carried: frozenset[int]  # seqs carried recollections show

    def line(self, entry: LogEntry) -> bool:
        """Whether the prompt already shows this archived message."""
        if entry.seq in self.carried:
            return True
        g = gist(entry.message.text)
        return g in self.raw_gists or (len(g) >= MIN_SHOWN_CHARS and g in self.memory_gist)


def shown(window: Sequence[LogEntry], memory: Memory, lang: str = "en") -> Shown:
    text, memory_gist = _memory(memory, lang)
    carried = {
        q
        for e in window
        if (x := extras_of(e)) is not None
        for lo, hi in x.recalled
        for q in range(lo, hi + 1)
    }
    return Shown(
        text, memory_gist, frozenset(gist(e.message.text) for e in window), frozenset(carried)
    )
