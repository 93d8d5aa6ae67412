"""The summarizer boundary and the extractive chronicler that needs no model.

`Summarizer.summarize(task) -> Summary` is the one method a summarizer implements. A task is a
chapter (one contiguous range of messages), a synopsis (a major GC: the previous synopsis plus
the older chapters), or a cut. The LLM chronicler lives in `chronicler.py`; here is the
deterministic extractive one: it keeps attributed, dated sentences ("[seq] Name: …") chosen for
their content within the token target, scene by scene (`kioku.scenes`), and drops what carries
nothing out of context (`kioku.salience`). It is the embedded default when no model is
configured, the stand-in at a forced cut, the fallback when the model keeps failing, and what
the benchmarks run. A tool exchange is kept as an action and its result ("Mika (tool use):
get_weather …", "get_weather (tool result): sunny"), never as speech; a shared image is always
kept, with its caption ("Ren (image): shared an image: …").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any, Literal, Protocol, runtime_checkable

from kioku.cast import as_recorded
from kioku.facts import Speech, facts_in_speech
from kioku.inert import inert, one_line
from kioku.memory import ItemSource, MemoryItem
from kioku.messages import MEDIA_KINDS, LogEntry, canonical_json, render_parts
from kioku.relative_dates import resolve
from kioku.salience import carries_nothing, content_words, is_fragment, is_question
from kioku.scenes import MARK, Scene, marker, scene_of, scenes, scenes_in
from kioku.sensitive import looks_secret, opened_by_earlier, withheld
from kioku.sentences import split_sentences
from kioku.tokens import TokenCounter
from kioku.worth import Usage, local_usage, said_key

TaskKind = Literal["chapter", "synopsis", "cut"]
EXTRACTIVE_VERSION = "extractive-3"


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
    # the summarizer model's window, when known: prompt + max_tokens must fit in it
    window_tokens: int | None = None
    # how the conversation so far says its sentences and words (`kioku.worth`); None: the
    # task's own lines stand for it
    usage: Usage | None = None

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


_DEICTIC = re.compile(
    r"アレ|あれ|ソレ|\bthat thing\b|\bthat stuff\b|\bthose things\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Line:
    seq: int
    speaker: str
    text: str
    on: date | None = None  # the day it was said
    scene: int | None = None  # first seq of the scene (dialogue) it belongs to
    must: bool = False  # an event a chapter never leaves out (an image was shared)
    fact: bool | None = None  # known to state a fact (a model's grounded line); None: read it

    def render(self) -> str:
        return f"[{self.seq}] {self.speaker}: {self.text}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "speaker": self.speaker, "text": self.text}
        if self.on is not None:
            out["date"] = self.on.isoformat()
        if self.scene is not None:
            out["scene"] = self.scene
        if self.must:
            out["must"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Line:
        on = date.fromisoformat(d["date"]) if d.get("date") else None
        scene = d.get("scene")
        must = bool(d.get("must", False))
        return cls(int(d["seq"]), str(d["speaker"]), str(d["text"]), on, scene, must)


_LINE = re.compile(rf"^(?:{MARK} [^\n]*? {MARK} )?\[(\d+)\] ([^:]{{0,80}}): (.*)$")
# a further line of the same message: indented under the first, without repeating its seq
_MORE = re.compile(r"^\s+([^:\[\s][^:]{0,79}): (.*)$")


def parse_lines(text: str) -> list[Line]:
    """The `[seq] speaker: text` lines of an extractive item (a scene marker in front of the
    first line of a scene is not part of it; a further line of the same message is indented
    under the first)."""
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


UNSAID = (*MEDIA_KINDS, "tool_call")  # parts whose text nobody typed as chat


def attributed_lines(entries: Iterable[LogEntry], lang: str = "en") -> list[Line]:
    """Every sentence of every message, with who said it, the day and the scene. Narration is
    attributed to the narrator, speech to its speaker, thought marked as unspoken; a relative
    date is followed by the date it means ("yesterday (7 May 2023)"). Memory is made of these
    lines, so their text is inert and their names one line (`kioku.inert`); a user message is
    the user's, whatever its name (`kioku.cast.as_recorded`)."""
    entries = as_recorded(list(entries))
    starts = [sc.first_seq for sc in scenes(entries)]
    out: list[Line] = []
    # a value its author typed as the message after "my password is"
    opened = opened_by_earlier([(e.message.role, e.message.text) for e in entries])
    for e, value in zip(entries, opened, strict=True):
        author = one_line(e.message.author) or e.message.role
        at = e.message.at
        on = at.date() if at else None
        scene = scene_of(e.seq, starts)
        # a secret's lines leave nothing (`kioku.sensitive`): split into sentences, a value
        # typed on the line after its keyword would read as an ordinary sentence
        texts = [p for p in e.message.parts if p.kind not in UNSAID and p.text.strip()]
        first = texts[0] if value and texts else None  # the part the value is in
        caption = inert(
            " ".join(withheld(p.text, "", opened=p is first) for p in texts if p.kind == "text")
        )
        for part in e.message.parts:
            if part.kind in MEDIA_KINDS:
                what = "an image" if part.kind == "image" else f"a file ({part.name})"
                shown = f"shared {what}: {caption[:200]}" if caption else f"shared {what}"
                tag = "image" if part.kind == "image" else "file"
                out.append(Line(e.seq, f"{author} ({tag})", shown, on, scene, must=True))
                continue
            if part.kind == "tool_call":
                call = inert(f"{one_line(part.name or '')} {withheld(canonical_json(part.text))}")
                out.append(Line(e.seq, f"{author} (tool use)", call, on, scene))
                continue
            if part.kind == "tool_result":
                who = f"{one_line(part.name or '') or author} (tool result)"
                sents = split_sentences(inert(withheld(part.text, "", opened=part is first)))
                out.extend(Line(e.seq, who, sent, on, scene) for sent in sents)
                continue
            speaker = one_line(part.speaker or "") or author
            if part.kind == "speech":
                who = speaker
            elif part.kind == "narration":
                who = "narration"
            elif part.kind == "thought":
                who = f"{speaker} (thought)"
            else:
                who = author
            text = part.text if part.kind != "text" else render_parts((part,), author)
            for sent in split_sentences(inert(withheld(text, "", opened=part is first))):
                out.append(Line(e.seq, who, resolve(sent, at, lang), on, scene))
    return out


def _is_fact(ln: Line, lang: str) -> bool:
    if ln.fact is not None:
        return ln.fact
    speaker = ln.speaker.removesuffix(" (thought)")
    return bool(facts_in_speech(Speech(ln.text, speaker), lang))


def select_lines(
    lines: Sequence[Line],
    budget: int,
    counter: TokenCounter,
    avoid: Sequence[str] = (),
    lang: str = "en",
    marker_cost: Mapping[int, int] | None = None,
    facts_first: bool = True,
    usage: Usage | None = None,
) -> list[Line]:
    """Pick the lines worth the most within `budget` tokens, returned in their original order.

    Lines that carry nothing out of context (greetings, fillers, questions without content,
    pointers like あれ) are never picked, nor a habit (a line the conversation says word for
    word `HABIT_TIMES` times or more) nor a line whose text memory already holds (`usage`,
    `kioku.worth`; without it the lines at hand stand for the conversation); a line is picked
    once. Lines that state a fact the notes would keep (a name, a date, a promise, a
    preference) are picked first (`facts_first`; otherwise they only count double), so a
    chapter written under pressure keeps what the ledger would have kept. Then a line is
    worth the content words it brings that are not picked yet, over how often the
    conversation says it (`Usage.worth`), per square root of its cost, so a chapter covers
    many facts rather than one fact many times; a question counts for less. Opening a scene
    costs its marker line (`marker_cost`, by the scene's first seq)."""
    marker_cost = marker_cost or {}
    usage = usage or local_usage(ln.text for ln in lines)
    cands = [
        i
        for i, ln in enumerate(lines)
        if not any(p and p in ln.text for p in avoid)
        and (ln.must or not (carries_nothing(ln.text, lang) or usage.worthless(ln.text)))
        and not looks_secret(ln.text)  # stays in the log, never in memory
    ]
    cost = {i: counter.count(lines[i].render()) + 1 for i in cands}
    words = {i: content_words(lines[i].text, lang) for i in cands}
    fact = {i for i in cands if _is_fact(lines[i], lang)}
    weight = {
        i: (0.3 if is_question(lines[i].text) else 1.0)
        * (2.0 if i in fact and not facts_first else 1.0)
        * (0.5 if _DEICTIC.search(lines[i].text) else 1.0)
        * (0.4 if is_fragment(lines[i].text) else 1.0)
        for i in cands
    }
    chosen: list[int] = []
    seen: set[str] = set()
    said: set[str] = set()  # the folded text of the lines picked: none twice
    opened: set[int] = set()
    used = 0

    def opening(i: int) -> int:
        scene = lines[i].scene
        return marker_cost.get(scene, 0) if scene is not None and scene not in opened else 0

    must = [i for i in cands if lines[i].must]  # what must be recorded goes first, if it fits
    rest = [i for i in cands if not lines[i].must]
    if facts_first:
        tiers = [must, [i for i in rest if i in fact], [i for i in rest if i not in fact]]
    else:
        tiers = [must, rest]
    for tier in tiers:
        remaining = set(tier)
        while remaining:
            best, best_score = -1, 0.0
            for i in remaining:
                c = cost[i] + opening(i)
                if used + c > budget or (not lines[i].must and said_key(lines[i].text) in said):
                    continue
                new = usage.worth(lines[i].text, words[i] - seen) or float(lines[i].must)
                score = weight[i] * new / (c**0.5) if new else 0.0
                if score > best_score or (score == best_score > 0 and i < best):
                    best, best_score = i, score
            if best < 0:
                break
            used += cost[best] + opening(best)
            if (opened_scene := lines[best].scene) is not None:
                opened.add(opened_scene)
            chosen.append(best)
            seen |= words[best]
            said.add(said_key(lines[best].text))
            remaining.discard(best)
    return [lines[i] for i in sorted(chosen)]


def render_lines(
    lines: Sequence[Line], known: Mapping[int, Scene] | None = None, lang: str = "en"
) -> str:
    """Lines in order; the first line of each scene opens with the scene's marker (`known`:
    scenes by first seq), and a message's further lines sit under its first without repeating
    the seq. The marker shares the line so every line still starts with who said it and where
    it came from."""
    known = known or {}
    out: list[str] = []
    before: Scene | None = None
    current: int | None = None
    prev: int | None = None
    for ln in lines:
        if ln.seq == prev:  # one message's lines under one [seq]
            out.append(f"{' ' * (len(str(ln.seq)) + 3)}{ln.speaker}: {ln.text}")
        elif ln.scene is not None and ln.scene != current and ln.scene in known:
            sc = known[ln.scene]
            out.append(f"{marker(sc, before, lang)} {ln.render()}")
            before, current = sc, ln.scene
        else:
            out.append(ln.render())
        prev = ln.seq
    return "\n".join(out)


def stored_lines(item: MemoryItem) -> list[Line]:
    """A stored item's lines: the extractive chronicler's as it kept them, an LLM record's one
    per line it holds (who it is about, what it says), anything else by sentence."""
    from kioku.structure import is_structured, record_from_data

    if is_structured(item.data):
        return _record_lines(record_from_data(item.data), scenes_in(item.data))
    rows = item.data.get("lines") if isinstance(item.data, Mapping) else None
    if isinstance(rows, list) and rows and all(isinstance(r, Mapping) for r in rows):
        try:
            return [Line.from_json(r) for r in rows]
        except (KeyError, TypeError, ValueError):
            pass
    parsed = parse_lines(item.text)
    return parsed or [Line(item.first_seq, "memory", t) for t in split_sentences(item.text)]


def _record_lines(record: Any, known: Mapping[int, Scene]) -> list[Line]:
    from kioku.structure import who_and_what

    rows = []
    for it in (*record.events, *record.claims, *record.user_facts, *record.key_lines):
        who, text = who_and_what(it)
        rows.append((it.seq, who or "user", text))  # a fact about the user may not name them
    starts = sorted(known)
    lines = [
        Line(q, who, text, None, scene_of(q, starts)) for q, who, text in rows if q is not None
    ]
    return sorted(lines, key=lambda ln: ln.seq)


def select_balanced(
    groups: Sequence[tuple[int, Sequence[Line]]],
    budget: int,
    counter: TokenCounter,
    avoid: Sequence[str] = (),
    lang: str = "en",
    marker_cost: Mapping[int, int] | None = None,
    usage: Usage | None = None,
) -> list[Line]:
    """A synopsis: each group (the previous synopsis, each chapter folded in) gets a share of
    the budget in proportion to the messages it covers, so the oldest part of a long
    conversation keeps its share instead of halving at every major GC; what a share leaves
    unused goes to the best lines left anywhere. A line one group kept is not kept again from
    another, and a habit formed since a chapter was written leaves with the fold."""
    usage = usage or local_usage(ln.text for _, lines in groups for ln in lines)
    total = sum(max(1, span) for span, _ in groups) or 1
    picked: list[Line] = []
    used = 0
    now = usage  # and what the groups before kept
    for span, lines in groups:
        share = budget * max(1, span) // total
        got = select_lines(lines, share, counter, avoid, lang, marker_cost, False, now)
        picked.extend(got)
        now = now.keeping(ln.text for ln in got if not ln.must)
        used += sum(counter.count(ln.render()) + 1 for ln in got)
    taken = {(ln.seq, ln.text) for ln in picked}
    rest = [ln for _, lines in groups for ln in lines if (ln.seq, ln.text) not in taken]
    if budget - used > 0 and rest:
        left = budget - used
        picked.extend(select_lines(rest, left, counter, avoid, lang, marker_cost, False, now))
    return sorted(picked, key=lambda ln: ln.seq)


class ExtractiveSummarizer:
    """Deterministic, model-free chronicler: attributed, dated sentences within the token
    target, scene by scene."""

    def __init__(self, counter: TokenCounter, name: str = "extractive") -> None:
        self.counter = counter
        self.name = name

    def summarize(self, task: SummaryTask) -> Summary:
        lang = task.lang
        known: dict[int, Scene] = {}
        if task.kind == "synopsis":
            groups: list[tuple[int, Sequence[Line]]] = []
            for item in ([task.previous] if task.previous else []) + list(task.chapters):
                groups.append((item.last_seq - item.first_seq + 1, stored_lines(item)))
                known.update(scenes_in(item.data))
            if task.entries:
                groups.append((len(task.entries), attributed_lines(task.entries, lang)))
                known.update({sc.first_seq: sc for sc in scenes(task.entries)})
            input_tokens = (
                sum(i.tokens for i in task.chapters)
                + (task.previous.tokens if task.previous else 0)
                + sum(e.tokens for e in task.entries)
            )
        else:
            groups = [(len(task.entries), attributed_lines(task.entries, lang))]
            known = {sc.first_seq: sc for sc in scenes(task.entries)}
            input_tokens = sum(e.tokens for e in task.entries)
        cost = {k: self.counter.count(marker(sc, None, lang)) for k, sc in known.items()}
        usage = _usage(task, groups)
        avoid, target = task.avoid_phrases, task.target_tokens
        if len(groups) == 1:
            picked = select_lines(
                groups[0][1], target, self.counter, avoid, lang, cost, True, usage
            )
        else:
            picked = select_balanced(groups, target, self.counter, avoid, lang, cost, usage)
        pool = [
            ln
            for _, lines in groups
            for ln in lines
            if not looks_secret(ln.text)
            and not usage.worthless(ln.text)
            and not carries_nothing(ln.text, lang)
        ]
        if not picked and pool:
            # a range whose every line worth keeping is longer than the target still leaves a
            # trace; one of greetings, habits and lines memory holds leaves none (the chapter
            # covers its range and shows nothing)
            first = pool[0]
            picked = [replace(first, text=first.text[: max(8, task.target_tokens)])]
        text = render_lines(picked, known, lang)
        scenes_used = sorted({ln.scene for ln in picked if ln.scene in known})
        return Summary(
            text=text,
            tokens=self.counter.count(text),
            source="extractive",
            model=self.name,
            prompt_version=EXTRACTIVE_VERSION,
            data={
                "lines": [ln.to_json() for ln in picked],
                "scenes": [known[k].to_json() for k in scenes_used if k is not None],
            },
            input_tokens=input_tokens,
        )


def _usage(task: SummaryTask, groups: Sequence[tuple[int, Sequence[Line]]]) -> Usage:
    """How the conversation says things (the task's, or its own lines'), and for a chapter
    what memory already holds: the synopsis and chapters the task carries."""
    usage = task.usage or local_usage(ln.text for _, g in groups for ln in g)
    if task.kind == "synopsis":
        return usage  # what it folds is what it chooses from
    held = ([task.previous] if task.previous else []) + list(task.chapters)
    return usage.keeping(ln.text for item in held for ln in stored_lines(item) if not ln.must)
