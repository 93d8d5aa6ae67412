"""The LLM-free thread check: a question kept in memory whose answer was lost, a promise kept in
memory that was kept in the story too but memory never says so.

Seed 000 §4 saw resolved threads stay open in memory. An LLM chronicler writes threads as data
(`audit._threads` checks those); memory written without a model quotes lines instead, and then
the same failure looks like this: memory shows "[306] AC: what do you like?" and not the answer
that followed, or "I promise I'll take you to the festival" and not the evening they went.

Read from the log, without a model:
- a **question** is a sentence ending in "?" (or "？") with at least `MIN_TERMS` content terms;
  it is **answered** by a message from someone else among the next `ANSWER_WITHIN` messages
  that shares a content term with it and is not itself only a question;
- a **promise** is a sentence with a promise marker ("I promise", "I'll", "let's", 約束, 〜ね…);
  it is **kept** by a later message (at least two on, anyone's) that shares `KEPT_TERMS`
  content terms with it and says something was done ("went", "finally", 行った, できた…).

A thread is **in memory** when its sentence's first words are in the memory text (quoted lines
are; a paraphrase is not, and is left to the structured check). One in memory whose answer or
keeping is in the log but not in memory is resolved but left open. When memory holds no
question and no promise there is nothing to judge, and the check says so (`judged` = 0) instead
of reporting a clean zero.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kioku.messages import LogEntry

from .answers import index_of, normalize

MIN_TERMS = 2
ANSWER_WITHIN = 3
KEPT_TERMS = 2
HEAD_WORDS = 6  # a sentence is "in" a text when its first words are
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
_ASIDE = re.compile(r"\[[^\]]*\]")
PROMISE = re.compile(
    r"\b(?:I promise|I'll|I will|I'm going to|I am going to|let's|we'll|we will|next time)\b"
    r"|約束|しようね|するね|行こうね|やるね|つもり|今度",
    re.IGNORECASE,
)
DONE = re.compile(
    r"\b(?:did|went|finally|kept|done|finished|made it|as promised|yesterday|last (?:week|night))\b"
    r"|した|行った|やった|できた|約束通り|守った",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Thread:
    kind: str  # "question" | "promise"
    seq: int
    speaker: str
    text: str
    resolved_at: int | None  # the seq of the answer / the keeping, None when still open
    resolution: str = ""


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(_ASIDE.sub(" ", text)) if s.strip()]


def _is_question(sentence: str) -> bool:
    return sentence.rstrip().endswith(("?", "？"))


_KANA_ONLY = re.compile(r"^[\u3040-\u309f]+$")


def strong(terms: Callable[[str], set[str]]) -> Callable[[str], set[str]]:
    """Content terms without all-hiragana bigrams ("ます", "です" join everything)."""
    return lambda text: {t for t in terms(text) if not _KANA_ONLY.match(t)}


def find_threads(entries: Sequence[LogEntry], terms: Callable[[str], set[str]]) -> list[Thread]:
    """Every question and promise in the log, with where it was answered or kept."""
    terms = strong(terms)
    out: list[Thread] = []
    for i, e in enumerate(entries):
        if e.role not in ("user", "assistant"):
            continue
        who = e.message.author or e.role
        for s in sentences(e.text):
            mine = terms(s)
            if len(mine) < MIN_TERMS:
                continue
            if _is_question(s):
                hit = _answer(entries, i, who, mine, terms)
                out.append(Thread("question", e.seq, who, s, *hit))
            elif PROMISE.search(s):
                hit = _kept(entries, i, mine, terms)
                out.append(Thread("promise", e.seq, who, s, *hit))
    return out


def _answer(
    entries: Sequence[LogEntry], i: int, who: str, mine: set[str], terms: Callable[[str], set[str]]
) -> tuple[int | None, str]:
    for later in entries[i + 1 : i + 1 + ANSWER_WITHIN]:
        if (later.message.author or later.role) == who:
            continue
        statements = [s for s in sentences(later.text) if not _is_question(s)]
        for s in statements:
            if mine & terms(s):
                return later.seq, s
    return None, ""


def _kept(
    entries: Sequence[LogEntry], i: int, mine: set[str], terms: Callable[[str], set[str]]
) -> tuple[int | None, str]:
    for later in entries[i + 2 :]:
        for s in sentences(later.text):
            if DONE.search(s) and len(mine & terms(s)) >= KEPT_TERMS:
                return later.seq, s
    return None, ""


def shown(sentence: str, memory_text: str) -> bool:
    head = " ".join(normalize(sentence).split()[:HEAD_WORDS])
    return bool(head) and index_of(memory_text).phrase(head)


def check_threads(
    entries: Sequence[LogEntry], memory_text: str, terms: Callable[[str], set[str]]
) -> dict[str, Any]:
    """Questions and promises memory shows, and those among them whose resolution it lost."""
    in_memory = [t for t in find_threads(entries, terms) if shown(t.text, memory_text)]
    left = [
        t for t in in_memory if t.resolved_at is not None and not shown(t.resolution, memory_text)
    ]
    return {
        "judged": len(in_memory),
        "questions": sum(1 for t in in_memory if t.kind == "question"),
        "promises": sum(1 for t in in_memory if t.kind == "promise"),
        "open": sum(1 for t in in_memory if t.resolved_at is None),
        "resolved_left_open": len(left),
        "examples": [
            {
                "kind": t.kind,
                "seq": t.seq,
                "speaker": t.speaker,
                "text": t.text,
                "resolved_at": t.resolved_at,
                "resolution": t.resolution,
            }
            for t in left[:10]
        ],
    }
