"""What a line tells that the rest of the conversation does not: the one measure memory keeps by.

A line the conversation says word for word again and again ("I like the fog.", "Time to go.",
a gesture narrated in every scene) is a habit, not a memory: a later reader learns nothing from
it that the raw window will not show again. A word most lines carry tells less than a name said
once. So a line's worth is the rarity (an IDF over the conversation's lines) of the content
words it brings that memory does not hold yet, divided by how many times the conversation says
that very line; a line said `HABIT_TIMES` times or more, or whose text memory already holds,
is worth nothing. The extractive chronicler ranks by it (`kioku.summarizer.select_lines`).

The counts come from the whole log so far (`usage_of`), each message read once and cached by
its text, so a fold over a long conversation pays for its new messages only.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from kioku.messages import MEDIA_KINDS, LogEntry
from kioku.salience import content_words
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
    """How a conversation uses its sentences and words, and what memory already holds."""

    said: Mapping[str, int] = field(default_factory=dict)  # folded sentence -> times said
    lines_with: Mapping[str, int] = field(default_factory=dict)  # content word -> its lines
    lines: int = 0
    kept: frozenset[str] = frozenset()  # folded text of the lines memory holds

    def times(self, text: str) -> int:
        return self.said.get(said_key(text), 0)

    def worthless(self, text: str) -> bool:
        """A habit, or a line memory already holds: it tells a reader nothing new."""
        key = said_key(text)
        return key in self.kept or self.said.get(key, 0) >= HABIT_TIMES

    def rarity(self, word: str) -> float:
        # smoothed so a word every line carries still counts a little: a short range has few
        # lines, and its one topic word must not weigh nothing
        return math.log(1.0 + self.lines / max(1, self.lines_with.get(word, 0)))

    def worth(self, text: str, words: Iterable[str]) -> float:
        """What the line tells: the rarity of `words` (those it brings that are not picked
        yet), over how many times the conversation says it."""
        return sum(self.rarity(w) for w in words) / max(1, self.times(text))

    def keeping(self, texts: Iterable[str]) -> Usage:
        """The same conversation, with these lines in memory too."""
        return Usage(self.said, self.lines_with, self.lines, self.kept | _keys(texts))


def _keys(texts: Iterable[str]) -> frozenset[str]:
    return frozenset(k for k in map(said_key, texts) if k)


@lru_cache(maxsize=16384)
def _message(texts: tuple[str, ...], lang: str) -> tuple[tuple[str, frozenset[str]], ...]:
    # one message's sentences (folded) and their content words: the log is read again at
    # every fold, and only a new or edited message costs anything
    return tuple((said_key(s), content_words(s, lang)) for t in texts for s in split_sentences(t))


def usage_of(entries: Iterable[LogEntry], lang: str = "en", kept: Iterable[str] = ()) -> Usage:
    """Count the sentences and words of these messages (the conversation so far)."""
    said: Counter[str] = Counter()
    lines_with: Counter[str] = Counter()
    n = 0
    for e in entries:
        texts = tuple(p.text for p in e.message.parts if p.kind not in _UNSAID and p.text)
        for key, words in _message(texts, lang):
            if key:
                said[key] += 1
            lines_with.update(words)
            n += 1
    return Usage(said, lines_with, n, _keys(kept))


def local_usage(texts: Iterable[str], lang: str = "en") -> Usage:
    """The lines at hand as the whole conversation, where no log was given (a test, a tool)."""
    said: Counter[str] = Counter()
    lines_with: Counter[str] = Counter()
    n = 0
    for t in texts:
        said[said_key(t)] += 1
        lines_with.update(content_words(t, lang))
        n += 1
    return Usage(said, lines_with, n)
