"""What a line tells that the rest of the conversation does not: the one measure memory keeps by.

A line the conversation says word for word again and again ("I like the fog.", "Time to go.",
a gesture narrated in every scene) is a habit, not a memory: a later reader learns nothing from
it that the raw window will not show again. So a line's worth is the number of content words it
brings that memory does not hold yet, divided by how many times the conversation says that very
line; a line said `HABIT_TIMES` times or more, or whose text memory already holds, is worth
nothing. The extractive chronicler ranks by it (`kioku.summarizer.select_lines`).

A word's rarity is not part of it: weighing words by an IDF over the conversation ranked "we
took regular walks together" below lines of rarer words, and a real model then answered fewer
questions from memory (docs/chronicler.md, "What a line is worth").

The counts come from the whole log so far (`usage_of`). The worker keeps them per conversation
(`SaidCounts`) and reads only the messages added since its last job, the whole log again only
after an edit, a delete, or the conversation begun again under its id: a fold over a long
conversation pays for its new messages only.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from kioku.messages import MEDIA_KINDS, LogEntry
from kioku.sentences import split_sentences

# said this many times word for word, a line is a habit: never kept (the third time shows it
# was no one-off; twice is still a callback worth remembering)
HABIT_TIMES = 3
_UNSAID = (*MEDIA_KINDS, "tool_call")  # parts whose text nobody typed as chat
_FOLD = re.compile(r"[\W_]+")


@lru_cache(maxsize=65536)
def said_key(text: str) -> str:
    """A sentence as the same sentence: case, width, whitespace and punctuation folded."""
    return _FOLD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


@dataclass(frozen=True)
class Usage:
    """How often a conversation says each of its sentences, and what memory already holds."""

    said: Mapping[str, int] = field(default_factory=dict)  # folded sentence -> times said
    kept: frozenset[str] = frozenset()  # folded text of the lines memory holds

    def times(self, text: str) -> int:
        return self.said.get(said_key(text), 0)

    def worthless(self, text: str) -> bool:
        """A habit, or a line memory already holds: it tells a reader nothing new."""
        key = said_key(text)
        return key in self.kept or self.said.get(key, 0) >= HABIT_TIMES

    def worth(self, text: str, words: Collection[str]) -> float:
        """What the line tells: the content words it brings that are not picked yet (`words`),
        over how many times the conversation says it."""
        return len(words) / max(1, self.times(text))

    def keeping(self, texts: Iterable[str]) -> Usage:
        """The same conversation, with these lines in memory too."""
        return Usage(self.said, self.kept | _keys(texts))


def _keys(texts: Iterable[str]) -> frozenset[str]:
    return frozenset(k for k in map(said_key, texts) if k)


def _times_said(entries: Iterable[LogEntry]) -> Counter[str]:
    """How many times these messages say each sentence (folded)."""
    said: Counter[str] = Counter()
    for e in entries:
        for p in e.message.parts:
            if p.kind not in _UNSAID and p.text:
                said.update(k for s in split_sentences(p.text) if (k := said_key(s)))
    return said


def usage_of(entries: Iterable[LogEntry], kept: Iterable[str] = ()) -> Usage:
    """Count the sentences of these messages (the conversation so far)."""
    return Usage(_times_said(entries), _keys(kept))


class SaidCounts:
    """`usage_of` each conversation's whole log, kept between jobs: only the messages after
    those counted are read, and the whole log again once its `version` changed (an edit or a
    delete moves it, and so does the conversation being deleted and begun again under the
    same id). The `limit` conversations used last are kept."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._by: OrderedDict[str, tuple[Hashable, int, Counter[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def usage(
        self, conversation_id: str, version: Hashable, read: Callable[[int], Sequence[LogEntry]]
    ) -> Usage:
        """`read(first)`: the log from seq `first` on, read after `version` was."""
        with self._lock:
            at, upto, said = self._by.pop(conversation_id, (version, 0, Counter()))
            if at != version:
                upto, said = 0, Counter()
            new = read(upto)
            said.update(_times_said(new))
            self._by[conversation_id] = (version, new[-1].seq + 1 if new else upto, said)
            while len(self._by) > self.limit:
                self._by.popitem(last=False)
            return Usage(Counter(said))  # a copy: the next job goes on counting in `said`


def local_usage(texts: Iterable[str]) -> Usage:
    """The lines at hand as the whole conversation, where no log was given (a test, a tool)."""
    return Usage(Counter(k for k in map(said_key, texts) if k))
