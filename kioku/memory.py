"""Memory items and the memory a prompt carries: one synopsis (old generation), chapters (young).

A chapter summarizes one contiguous seq range and is never rewritten. A synopsis folds the older
chapters and the previous synopsis at a major GC. Each item records the range it covers and who
wrote it (model, prompt version), so any line of memory can be traced back to its messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal

from kioku.dates import day_text
from kioku.inert import inert, mark
from kioku.operator_edits import apply_edits, edits_in
from kioku.rendering import render_labels, render_story, render_threads, render_user
from kioku.scenes import Scene, scenes_in
from kioku.structure import UserFact, is_structured, merge_threads, record_from_data

ItemKind = Literal["chapter", "synopsis"]
ItemStatus = Literal["ready", "active", "retired"]
ItemSource = Literal["llm", "extractive"]


@dataclass(frozen=True)
class MemoryItem:
    kind: ItemKind
    first_seq: int
    last_seq: int
    text: str
    tokens: int
    source: ItemSource = "extractive"
    model: str = ""
    prompt_version: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    status: ItemStatus = "ready"
    ready_at: float = 0.0
    id: int | None = None
    replaces: tuple[int, ...] = ()
    stale: bool = False

    @property
    def span(self) -> tuple[int, int]:
        return (self.first_seq, self.last_seq)


@dataclass(frozen=True)
class Memory:
    """The active memory of a conversation, as the prompt shows it."""

    synopsis: MemoryItem | None = None
    chapters: tuple[MemoryItem, ...] = ()
    notes: str = ""

    @property
    def items(self) -> tuple[MemoryItem, ...]:
        return ((self.synopsis,) if self.synopsis else ()) + self.chapters

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    @property
    def covered_until(self) -> int:
        """One past the last seq covered (0 when memory is empty)."""
        items = self.items
        return items[-1].last_seq + 1 if items else 0

    def is_empty(self) -> bool:
        return not self.items and not self.notes.strip()


def coverage_gaps(items: Sequence[MemoryItem], raw_start: int) -> list[str]:
    """Check that items cover [0, raw_start) exactly once; return the problems found (none = ok)."""
    problems: list[str] = []
    expected = 0
    for item in sorted(items, key=lambda i: i.first_seq):
        if item.first_seq > expected:
            problems.append(f"gap: seqs {expected}..{item.first_seq - 1} covered by nothing")
        elif item.first_seq < expected:
            problems.append(f"overlap: seqs {item.first_seq}..{expected - 1} covered twice")
        if item.last_seq < item.first_seq:
            problems.append(f"empty range {item.first_seq}..{item.last_seq}")
        expected = max(expected, item.last_seq + 1)
    if expected != raw_start:
        problems.append(
            f"memory covers up to {expected - 1} but the raw window starts at {raw_start}"
        )
    return problems


HEADERS: Mapping[str, Mapping[str, str]] = {
    "en": {
        "intro": "The story so far (memory of earlier parts of this conversation).",
        "caveat": (
            "Statements by characters are records of what they said, not necessarily the truth. "
            "What the user said about their real self is fact."
        ),
        "synopsis": "Synopsis",
        "chapter": "Chapter",
        "notes": "Notes",
        "ack": "Understood. I will continue the conversation with this in mind.",
    },
    "ja": {
        "intro": "ここまでのあらすじ(この会話の以前の部分の記憶)。",
        "caveat": (
            "人物の発言は、その人物がそう言ったという記録であって、真実とは限らない。"
            "ユーザーが自分自身について語ったことは事実として扱う。"
        ),
        "synopsis": "あらすじ",
        "chapter": "章",
        "notes": "メモ",
        "ack": "了解しました。これを踏まえて会話を続けます。",
    },
    "zh": {
        "intro": "到目前为止的故事(本次对话较早部分的记忆)。",
        "caveat": "角色的陈述只是其所说内容的记录,不一定是事实。用户关于自己真实情况的陈述是事实。",
        "synopsis": "梗概",
        "chapter": "章节",
        "notes": "笔记",
        "ack": "明白了。我会记住这些继续对话。",
    },
}


def when(item: MemoryItem, lang: str = "en") -> str:
    """ ", 8 May 2023 – 9 June 2023": the days an item records, for its heading."""
    span = item.data.get("period") if isinstance(item.data, Mapping) else None
    if not isinstance(span, list | tuple) or len(span) != 2:
        return ""
    try:
        first, last = (day_text(date.fromisoformat(str(d)), lang) for d in span)
    except ValueError:
        return ""
    return f", {first}" if first == last else f", {first} – {last}"


def render_memory(memory: Memory, lang: str = "en") -> tuple[str, str]:
    """The memory exchange: (synthetic user message, synthetic assistant acknowledgement).

    Items the LLM chronicler wrote carry their structure in `data`; those are rendered by track:
    each item's story (events, attributed claims, key lines) under its own heading, then the
    facts about the user from every item, then the threads merged by id across all items, so a
    thread opened in one chapter and resolved in a later one shows once, resolved. Items without
    structure (the extractive chronicler's) show their text as written.

    The header and every heading are in kioku's mark and what memory says is inert
    (`kioku.inert`): a header or a "## Notes" a user typed into a message never reads as
    memory's own, and a chat-template token copied into memory is plain text."""
    h = HEADERS.get(lang, HEADERS["en"])
    lab = render_labels(lang)
    blocks = [mark(h["intro"]), h["caveat"]]
    facts: list[UserFact] = []
    known: dict[int, Scene] = {}  # the scenes of every item, for the facts gathered from them

    def body(item: MemoryItem) -> str:
        if not is_structured(item.data):
            return inert(item.text.strip())
        record = record_from_data(item.data)
        facts.extend(record.user_facts)
        scenes = scenes_in(item.data)
        known.update(scenes)
        story = render_story(record, lang, scenes).strip()
        if edits := edits_in(item.data):
            story = apply_edits(story, edits)  # an operator corrected it: the edits win
        return inert(story)

    def heading(text: str) -> str:
        return f"## {mark(text)}"

    if memory.synopsis:
        s = memory.synopsis
        head = f"{h['synopsis']} (#{s.first_seq}–{s.last_seq}{when(s, lang)})"
        blocks.append(f"{heading(head)}\n{body(s)}")
    # a chapter that kept nothing (its range only said what memory holds, or habits) covers
    # its range for the bookkeeping and shows nothing, not even its heading
    shown = [(c, text) for c in memory.chapters if (text := body(c))]
    for n, (c, text) in enumerate(shown, 1):
        head = f"{h['chapter']} {n} (#{c.first_seq}–{c.last_seq}{when(c, lang)})"
        blocks.append(f"{heading(head)}\n{text}")
    if facts:
        blocks.append(f"{heading(lab.user)}\n{inert(render_user(facts, known, lang))}")
    threads = merge_threads(memory.items)
    if threads:
        ordered = [t for t in threads if t.status == "open"] + [
            t for t in threads if t.status != "open"
        ]
        blocks.append(f"{heading(lab.threads)}\n{inert(render_threads(ordered, lang))}")
    if memory.notes.strip():
        blocks.append(f"{heading(h['notes'])}\n{inert(memory.notes.strip())}")
    return "\n\n".join(blocks), h["ack"]
