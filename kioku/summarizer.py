"""The summarizer boundary and the extractive chronicler that needs no model.

`Summarizer.summarize(task) -> Summary` is the one method a summarizer implements. A task is a
chapter (one contiguous range of messages), a synopsis (a major GC: the previous synopsis plus
the older chapters), or a cut. The LLM chronicler lives in `chronicler.py`; here is the
deterministic extractive one: it keeps attributed sentences ("[seq] Name: …") chosen for their
content within the token target. It is the embedded default when no model is configured, the
fallback when the model keeps failing, and what the benchmarks run. A tool exchange is kept as an
action and its result ("Mika (tool use): get_weather …", "get_weather (tool result): sunny"),
never as speech; a shared image is always kept, with its caption ("Ren (image): shared an image:
…").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from kioku.memory import ItemSource, MemoryItem
from kioku.messages import MEDIA_KINDS, LogEntry, canonical_json, render_parts
from kioku.tokens import TokenCounter

TaskKind = Literal["chapter", "synopsis", "cut"]
EXTRACTIVE_VERSION = "extractive-1"


@dataclass(frozen=True)
class SummaryTask:
    kind: TaskKind
    target_tokens: int
    # chapter / cut: the range to summarize; synopsis: new messages a rolling rewrite folds in
    entries: tuple[LogEntry, ...] = ()
    previous: MemoryItem | None = None  # synopsis: the synopsis being replaced
    chapters: tuple[MemoryItem, ...] = ()  # synopsis: the chapters folded in
    ceiling_tokens: int = 4096
    lang: str = "en"
    character: str = ""
    user_name: str = "user"
    avoid_phrases: tuple[str, ...] = ()  # verbal tics that must not enter memory

    @property
    def span(self) -> tuple[int, int]:
        if self.kind == "synopsis":
            items = ([self.previous] if self.previous else []) + list(self.chapters)
            first = items[0].first_seq if items else self.entries[0].seq
            last = self.entries[-1].seq if self.entries else items[-1].last_seq
            return (first, last)
        return (self.entries[0].seq, self.entries[-1].seq)


@dataclass(frozen=True)
class Summary:
    text: str
    tokens: int
    source: ItemSource
    model: str = ""
    prompt_version: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    input_tokens: int = 0
    attempts: int = 1
    events: tuple[str, ...] = ()  # what happened on the way: "refusal", "retry", "fallback", ...


@runtime_checkable
class Summarizer(Protocol):
    def summarize(self, task: SummaryTask) -> Summary: ...


_SPLIT = re.compile(r"(?<=[。！？])|(?<=[.!?])\s+")
_WORD = re.compile(
    r"[A-Za-z][A-Za-z'\-]+|\d[\d,.:/]*|[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]{2,}"
)
_STOP = frozenset(
    [
        "the",
        "and",
        "that",
        "this",
        "with",
        "have",
        "from",
        "they",
        "were",
        "what",
        "when",
        "your",
        "about",
        "would",
        "there",
        "their",
        "just",
        "like",
        "really",
        "know",
        "think",
        "been",
        "will",
        "some",
        "them",
        "then",
        "than",
        "into",
        "also",
        "very",
        "much",
        "more",
        "well",
        "yeah",
        "okay",
        "oh",
        "that's",
        "it's",
        "i'm",
        "you're",
        "don't",
        "can't",
    ]
)


def _sentences(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        for piece in _SPLIT.split(line):
            sent = piece.strip()
            if len(sent) >= 2:
                out.append(sent)
    return out


def _content_words(sentence: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(sentence) if w.lower() not in _STOP}


@dataclass(frozen=True)
class Line:
    seq: int
    speaker: str
    text: str
    must: bool = False  # an event a chapter never leaves out (an image was shared)

    def render(self) -> str:
        return f"[{self.seq}] {self.speaker}: {self.text}"


_LINE = re.compile(r"^\[(\d+)\] ([^:]{0,80}): (.*)$")
# a further line of the same message: indented under the first, without repeating its seq
_MORE = re.compile(r"^\s+([^:\[\s][^:]{0,79}): (.*)$")


def render_lines(lines: Sequence[Line]) -> str:
    """One message's lines under one `[seq]`: a message with narration and speech reads as one
    entry, not as the same seq twice."""
    out: list[str] = []
    prev: int | None = None
    for ln in lines:
        if ln.seq == prev:
            out.append(f"{' ' * (len(str(ln.seq)) + 3)}{ln.speaker}: {ln.text}")
        else:
            out.append(ln.render())
        prev = ln.seq
    return "\n".join(out)


def parse_lines(text: str) -> list[Line]:
    out: list[Line] = []
    for raw in text.splitlines():
        more = _MORE.match(raw) if out and raw[:1].isspace() else None
        if more:
            out.append(Line(out[-1].seq, more.group(1), more.group(2)))
            continue
        m = _LINE.match(raw.strip())
        if m:
            out.append(Line(int(m.group(1)), m.group(2), m.group(3)))
    return out


def attributed_lines(entries: Iterable[LogEntry]) -> list[Line]:
    """Every sentence of every message, with who said it. Narration is attributed to the
    narrator, speech to its speaker, thought marked as unspoken."""
    out: list[Line] = []
    for e in entries:
        author = e.message.author or e.message.role
        caption = " ".join(p.text for p in e.message.parts if p.kind == "text" and p.text.strip())
        for part in e.message.parts:
            if part.kind in MEDIA_KINDS:
                what = "an image" if part.kind == "image" else f"a file ({part.name})"
                shown = f"shared {what}: {caption[:200]}" if caption else f"shared {what}"
                tag = "image" if part.kind == "image" else "file"
                out.append(Line(e.seq, f"{author} ({tag})", shown, must=True))
                continue
            if part.kind == "tool_call":
                call = f"{part.name} {canonical_json(part.text)}"
                out.append(Line(e.seq, f"{author} (tool use)", call))
                continue
            if part.kind == "tool_result":
                who = f"{part.name or author} (tool result)"
                out.extend(Line(e.seq, who, sent) for sent in _sentences(part.text))
                continue
            if part.kind == "speech":
                who = part.speaker or author
            elif part.kind == "narration":
                who = "narration"
            elif part.kind == "thought":
                who = f"{part.speaker or author} (thought)"
            else:
                who = author
            text = part.text if part.kind != "text" else render_parts((part,), author)
            out.extend(Line(e.seq, who, sent) for sent in _sentences(text))
    return out


def select_lines(
    lines: Sequence[Line], budget: int, counter: TokenCounter, avoid: Sequence[str] = ()
) -> list[Line]:
    """Pick the most informative lines within `budget` tokens, returned in their original order.

    Informative = brings content words not yet picked (names, numbers, rare words), so a
    chapter covers many facts rather than one fact many times."""
    candidates = [
        (i, ln) for i, ln in enumerate(lines) if not any(p and p in ln.text for p in avoid)
    ]
    cost = {i: counter.count(ln.render()) + 1 for i, ln in candidates}
    words = {i: _content_words(ln.text) for i, ln in candidates}
    chosen: list[int] = []
    seen: set[str] = set()
    used = 0
    remaining = dict(candidates)
    for i, ln in candidates:  # what must be recorded goes first, while it fits
        if ln.must and used + cost[i] <= budget:
            chosen.append(i)
            used += cost[i]
            seen |= words[i]
            del remaining[i]
    while remaining:
        best, best_score = -1, 0.0
        for i in remaining:
            if used + cost[i] > budget:
                continue
            new = len(words[i] - seen)
            score = new / (cost[i] ** 0.5) if new else 0.0
            if score > best_score:
                best, best_score = i, score
        if best < 0:
            break
        chosen.append(best)
        used += cost[best]
        seen |= words[best]
        del remaining[best]
    return [lines[i] for i in sorted(chosen)]


class ExtractiveSummarizer:
    """Deterministic, model-free chronicler: attributed sentences within the token target."""

    def __init__(self, counter: TokenCounter, name: str = "extractive") -> None:
        self.counter = counter
        self.name = name

    def summarize(self, task: SummaryTask) -> Summary:
        if task.kind == "synopsis":
            pool: list[Line] = []
            for item in ([task.previous] if task.previous else []) + list(task.chapters):
                parsed = parse_lines(item.text)
                pool.extend(
                    parsed or [Line(item.first_seq, "memory", t) for t in _sentences(item.text)]
                )
            pool.extend(attributed_lines(task.entries))
            input_tokens = (
                sum(i.tokens for i in task.chapters)
                + (task.previous.tokens if task.previous else 0)
                + sum(e.tokens for e in task.entries)
            )
        else:
            pool = attributed_lines(task.entries)
            input_tokens = sum(e.tokens for e in task.entries)
        picked = select_lines(pool, task.target_tokens, self.counter, task.avoid_phrases)
        if not picked and pool:
            # a range whose every line is longer than the target still leaves a trace
            first = pool[0]
            picked = [Line(first.seq, first.speaker, first.text[: max(8, task.target_tokens)])]
        text = render_lines(picked)
        return Summary(
            text=text,
            tokens=self.counter.count(text),
            source="extractive",
            model=self.name,
            prompt_version=EXTRACTIVE_VERSION,
            data={
                "lines": [{"seq": ln.seq, "speaker": ln.speaker, "text": ln.text} for ln in picked]
            },
            input_tokens=input_tokens,
        )
