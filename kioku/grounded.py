"""Whole records through the grounding check: what stays, what goes, what replaces it.

`ground_record` reads every line of a parsed record (`kioku.structure.Record`) against the
evidence (`kioku.grounding.Evidence`) and keeps the grounded ones; `record_from_reply` does the
same for a reply in the line format (`kioku.reply_format`), deciding what each grounded line is
from the message that bears it out (narration: an event; a character's words: a claim, confirmed
only when narration or a thought says so too; the user's words: a user fact). A claim's
"supported_by" and "actual" are checked the same way and removed when nothing in the span bears
them out.

What is dropped is listed with its reason (`Grounding.dropped`), and each drop is a guard event.
A dropped line that was about its cited message (a garbled paraphrase, the wrong speaker) is
replaced by its extractive counterpart: that message's own sentence, verbatim, with who said it
(`replace_dropped`). The chapter's budget the model left unused is filled the same way
(`fill`), from the span's most informative lines, so a short model record never means less
memory than the extractive chronicler would have kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

from kioku.attribution import said_in
from kioku.grounding import REASONS, Evidence, Statement, Verdict
from kioku.messages import LogEntry
from kioku.relative_dates import resolve
from kioku.reply_format import LineReply
from kioku.salience import carries_nothing
from kioku.scenes import Scene, marker, scene_of
from kioku.structure import Claim, Event, KeyLine, Record, ThreadNote, UserFact, norm_text
from kioku.summarizer import Line, attributed_lines, select_balanced, select_lines
from kioku.support import read
from kioku.tokens import TokenCounter

if TYPE_CHECKING:
    from kioku.note import Note, NoteDraft

DROP_REASONS: tuple[str, ...] = ("format", *REASONS)
MIN_SHARE = 0.5  # a record with fewer grounded lines than this share is rejected
REPLACEABLE = ("unsupported", "author")  # about its message, but wrong: quote the message


@dataclass(frozen=True)
class Dropped:
    where: str  # "events[2]", "line 3"
    text: str
    reason: str
    detail: str = ""
    seqs: tuple[int, ...] = ()

    def note(self) -> str:
        return f'"{self.text[:80]}": {self.detail or self.reason}'


@dataclass(frozen=True)
class Grounding:
    """What grounding did to one record."""

    written: int = 0  # lines the model wrote
    kept: int = 0
    dropped: tuple[Dropped, ...] = ()
    corrected: int = 0  # a claim's unsupported "supported_by" or "actual" removed
    replaced: int = 0  # dropped lines replaced by their message's own words
    filled: int = 0  # extractive lines added in the room the model left
    trimmed: int = 0  # grounded lines left out of an over-long chapter (the least informative)

    @property
    def share(self) -> float:
        """Grounded lines among those that said something (an empty line is no invention)."""
        judged = self.written - sum(1 for d in self.dropped if d.reason == "empty")
        return self.kept / judged if judged else 1.0

    def by_reason(self) -> dict[str, int]:
        return dict(Counter(d.reason for d in self.dropped))

    def events(self) -> tuple[str, ...]:
        """Guard events: one per drop, correction and replacement (the compaction log)."""
        out = [f"dropped_{d.reason}" for d in self.dropped]
        out += ["corrected"] * self.corrected + ["replaced"] * self.replaced
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.written,
            "grounded": self.kept,
            "share": round(self.share, 3),
            "dropped": self.by_reason(),
            "corrected": self.corrected,
            "replaced": self.replaced,
            "filled": self.filled,
            "trimmed": self.trimmed,
        }

    def rejection(self) -> str:
        """The retry note for a mostly ungrounded record: what was wrong, with examples."""
        examples = "; ".join(d.note() for d in self.dropped[:3])
        return (
            f"only {self.kept} of {self.written} lines are borne out by the messages they cite "
            f"({examples}). Write only facts those messages say, each naming the person it is "
            "about, with the number of its message"
        )


@dataclass
class _Tally:
    ev: Evidence
    written: int = 0
    kept: int = 0
    corrected: int = 0
    dropped: list[Dropped] = field(default_factory=list)

    def check(self, where: str, st: Statement) -> Verdict:
        self.written += 1
        v = self.ev.check(st)
        if v.ok:
            self.kept += 1
        else:
            self.dropped.append(Dropped(where, st.text, v.reason or "", v.detail, st.seqs))
        return v

    def drop(self, where: str, text: str, reason: str, detail: str = "") -> None:
        self.written += 1
        self.dropped.append(Dropped(where, text, reason, detail))

    def result(self) -> Grounding:
        return Grounding(self.written, self.kept, tuple(self.dropped), self.corrected)


def _seqs(seq: int | None) -> tuple[int, ...]:
    return (seq,) if seq is not None else ()


def _checked_claim(c: Claim, t: _Tally) -> Claim:
    """A grounded claim, its confirmation and its "actually" checked too."""
    ev = t.ev
    support = c.supported_by
    if support != "none" and ev.supported_by_witness(c.claim) != support:
        support = "none"  # the model said confirmed; nothing in the span confirms it so
        t.corrected += 1
    actual = c.actual
    if actual:
        names_ok = all(ev.known_name(n) for n in read(actual, ev.lang).names)
        copied = ev.prompt.copied(actual)
        if not names_ok or copied or ev.supported_by_witness(actual) is None:
            actual = None
            t.corrected += 1
    return replace(c, supported_by=support, actual=actual)


def _threads(
    notes: Sequence[ThreadNote], t: _Tally, known: Mapping[str, str], where: str = "threads"
) -> list[ThreadNote]:
    kept: list[ThreadNote] = []
    for i, n in enumerate(notes):
        if known.get(n.id) == n.title or (n.id in known and n.title == n.id):
            kept.append(replace(n, title=known[n.id]))  # memory's own thread, as memory has it
            continue
        seqs = _seqs(n.seq) if n.seq in t.ev.sources else ()
        v = t.check(f"{where}[{i}]", Statement("thread", n.title, seqs, span_wide=True))
        if v.ok:
            kept.append(replace(n, seq=n.seq if seqs else None))
    return kept


def ground_record(
    record: Record, ev: Evidence, known_threads: Mapping[str, str] | None = None
) -> tuple[Record, Grounding]:
    """The record with only its grounded lines, and what happened to the rest. A line without
    a seq is grounded where one message supports it, and cites that message from then on."""
    t = _Tally(ev)
    known = known_threads or {}
    events = []
    for i, e in enumerate(record.events):
        v = t.check(f"events[{i}]", Statement("event", e.text, _seqs(e.seq), e.by or None))
        if v.ok:
            events.append(replace(e, seq=v.seqs[0] if v.seqs else e.seq))
    claims = []
    for i, c in enumerate(record.claims):
        if c.listener and not ev.known_name(c.listener):
            t.drop(f"claims[{i}]", c.claim, "name", f"{c.listener} is not in the conversation")
            continue
        v = t.check(f"claims[{i}]", Statement("claim", c.claim, _seqs(c.seq), c.speaker))
        if v.ok:
            claims.append(_checked_claim(replace(c, seq=v.seqs[0] if v.seqs else c.seq), t))
    facts = []
    for i, f in enumerate(record.user_facts):
        v = t.check(f"user_facts[{i}]", Statement("fact", f.fact, _seqs(f.seq), f.by or "user"))
        if v.ok:
            facts.append(replace(f, seq=v.seqs[0] if v.seqs else f.seq))
    lines = []
    for i, k in enumerate(record.key_lines):
        st = Statement("key_line", k.text, (k.seq,), k.speaker, verbatim=True)
        if t.check(f"key_lines[{i}]", st).ok:
            lines.append(k)
    threads = _threads(record.threads, t, known)
    grounded = Record(tuple(events), tuple(claims), tuple(threads), tuple(facts), tuple(lines))
    return grounded, t.result()


def _without_name(text: str, who: str) -> str:
    """ "Caroline went to a support group", stored under Caroline: "went to a support group"."""
    if who and text.startswith(who + " ") and text[len(who) + 1 : len(who) + 2].islower():
        return text[len(who) + 1 :]
    return text


def record_from_reply(
    reply: LineReply, ev: Evidence, known_threads: Mapping[str, str] | None = None
) -> tuple[Record, Grounding]:
    """A line-format reply as a record of its grounded lines: what each line is (event, claim,
    user fact) is decided by the message that bears it out, not by the model."""
    t = _Tally(ev)
    listener = ev.user_names[0] if ev.user_names else ""
    events: list[Event] = []
    claims: list[Claim] = []
    facts: list[UserFact] = []
    seen: set[tuple[int, str]] = set()
    for i, ln in enumerate(reply.lines):
        st = Statement("line", ln.text, ln.seqs, ln.name or None, ln.about or None)
        v = t.check(f"line {i}", st)
        if not v.ok:
            continue
        key = (v.seq if v.seq is not None else v.seqs[0], norm_text(ln.text).casefold())
        if key in seen:  # the same line again (a small model repeats itself): kept once
            t.kept -= 1
            t.written -= 1
            continue
        seen.add(key)
        src = ev.sources[v.seq if v.seq is not None else v.seqs[0]]
        who = ln.name or ln.about or src.author
        # "yesterday" kept with the day it meant, as the transcript showed it
        text = _without_name(resolve(ln.text, src.day, ev.lang), who)
        if v.kind == "narration" or src.role not in ("user", "assistant"):
            events.append(Event(src.seq, text, ln.name or ln.about))
        elif v.kind == "thought":
            events.append(Event(src.seq, text, f"{who} (thought)"))
        elif src.role == "user":
            facts.append(UserFact(src.seq, text, who))
        else:  # a character's words: a claim; what confirms it is a line of its own
            claims.append(Claim(src.seq, who, text, listener))
    for raw in reply.unread:
        t.drop("unread", raw, "format", "not a line of the form #<number> <name>: <text>")
    notes = [ThreadNote(x.id, x.title, x.status, x.seq) for x in reply.threads]  # type: ignore[arg-type]
    threads = _threads(notes, t, known_threads or {})
    keys = []
    for i, q in enumerate(reply.quotes):
        st = Statement("key_line", q.text, (q.seq,), q.speaker, verbatim=True)
        if t.check(f"quote {i}", st).ok:
            keys.append(KeyLine(q.seq, q.speaker, q.text))
    record = Record(tuple(events), tuple(claims), tuple(threads), tuple(facts), tuple(keys))
    return record, t.result()


def grounded_share(item: Any) -> float | None:
    """The share of a memory item's lines grounded in their sources, as stored with it: 1.0
    for an extractive item (its lines are the messages' own words), None for an LLM item
    written before grounding existed."""
    data = getattr(item, "data", None) or {}
    g = data.get("grounding") if isinstance(data, Mapping) else None
    if isinstance(g, Mapping) and isinstance(g.get("share"), int | float):
        return float(g["share"])
    return 1.0 if getattr(item, "source", "") == "extractive" else None


def ground_notes(
    drafts: Sequence[NoteDraft],
    entries: Sequence[LogEntry],
    current: Sequence[Note] = (),
    lang: str = "en",
    prompt: str = "",
) -> tuple[list[NoteDraft], list[Dropped]]:
    """Each note checked against the message it cites: whom it is about wrote or is named in
    that message, every name it uses is in the messages or the notes, none of the prompt's own
    words, and what it says is borne out by the message."""
    from kioku.evidence import evidence_for

    known = "\n".join(f"{n.subject}: {n.text}" for n in current)
    ev = evidence_for(entries, lang=lang, memory_text=known, prompt=prompt)
    kept: list[NoteDraft] = []
    dropped: list[Dropped] = []
    by_seq = {e.seq: e.message for e in entries}
    for d in drafts:
        seqs = (d.source_seq,) if d.source_seq is not None else ()
        v = ev.check(Statement("note", d.text, seqs, subject=d.subject))
        m = by_seq.get(d.source_seq) if d.source_seq is not None else None
        if (
            v.ok
            and m is not None
            and not said_in(d.text, resolve(m.text, m.at, lang), lang, d.subject)
        ):
            # the words of the fact are not the cited message's: never its author's, even
            # where the grounding's looser reading (stems, neighbours) let it pass
            v = Verdict("unsupported", detail=f"#{d.source_seq} does not say it")
        if v.ok:
            kept.append(d)
        else:
            dropped.append(Dropped(d.subject, d.text, v.reason or "", v.detail, seqs))
    return kept, dropped


# the extractive counterpart -------------------------------------------------------------------


def item_of_line(ln: Line) -> Event | KeyLine:
    """An extractive line as a record item: narration and what someone did (a thought, an
    image shared, a tool used) are events; words someone said are key lines, verbatim."""
    if ln.speaker == "narration":
        return Event(ln.seq, ln.text)
    if ln.speaker.endswith(")"):
        return Event(ln.seq, ln.text, ln.speaker)
    return KeyLine(ln.seq, ln.speaker, ln.text)


Added = list[Event | KeyLine]


def _add(record: Record, items: Sequence[Event | KeyLine]) -> tuple[Record, Added]:
    have: set[tuple[int | None, str]] = {(k.seq, norm_text(k.text)) for k in record.key_lines}
    have |= {(e.seq, norm_text(e.text)) for e in record.events}
    events, keys = list(record.events), list(record.key_lines)
    added: Added = []
    for it in items:
        if (it.seq, norm_text(it.text)) in have:
            continue
        have.add((it.seq, norm_text(it.text)))
        added.append(it)
        (keys if isinstance(it, KeyLine) else events).append(it)  # type: ignore[arg-type]
    return replace(record, events=tuple(events), key_lines=tuple(keys)), added


def cited(record: Record) -> set[int]:
    seqs = {e.seq for e in record.events} | {c.seq for c in record.claims}
    seqs |= {f.seq for f in record.user_facts} | {k.seq for k in record.key_lines}
    return {s for s in seqs if s is not None}


def replace_dropped(
    record: Record,
    grounding: Grounding,
    entries: Sequence[LogEntry],
    lang: str,
    avoid: Sequence[str] = (),
) -> tuple[Record, Added]:
    """Each dropped line that was about its cited message (a third of its terms are there)
    replaced by that message's sentence it shares most with, verbatim and attributed."""
    by_seq: dict[int, list[Line]] = {}
    for ln in attributed_lines(entries, lang):
        if not carries_nothing(ln.text, lang) and not any(p and p in ln.text for p in avoid):
            by_seq.setdefault(ln.seq, []).append(ln)
    picked: list[Event | KeyLine] = []
    for d in grounding.dropped:
        if d.reason not in REPLACEABLE or len(d.seqs) != 1 or d.seqs[0] not in by_seq:
            continue
        want = read(d.text, lang).terms
        best, overlap = None, 0.0
        for ln in by_seq[d.seqs[0]]:
            share = len(want & read(ln.text, lang).terms) / max(1, len(want))
            if share > overlap:
                best, overlap = ln, share
        if best is not None and overlap >= 1 / 3:
            picked.append(item_of_line(best))
    return _add(record, picked)


def fill(
    record: Record,
    entries: Sequence[LogEntry],
    budget: int,
    counter: TokenCounter,
    lang: str,
    avoid: Sequence[str] = (),
) -> tuple[Record, Added]:
    """The room the model left (`budget` tokens), filled with the span's most informative
    lines that no line of the record cites yet, verbatim (`summarizer.select_lines`)."""
    if budget <= 0:
        return record, []
    taken = cited(record)
    pool = [ln for ln in attributed_lines(entries, lang) if ln.seq not in taken]
    picked = select_lines(pool, budget, counter, avoid, lang)
    return _add(record, [item_of_line(ln) for ln in picked])


@dataclass(frozen=True)
class _Drafted(Line):
    """A record's line as the selection weighs it: its words, at the cost of its rendering."""

    shown: str = ""

    def render(self) -> str:
        return self.shown


Item = Event | Claim | UserFact | KeyLine
_TRACKS = ("events", "claims", "user_facts", "key_lines")


def item_text(it: Item) -> str:
    return _words_of(it)[1]


def _words_of(it: Item) -> tuple[str, str]:
    """(who, what) of a record item."""
    if isinstance(it, Claim):
        return it.speaker, it.claim
    if isinstance(it, UserFact):
        return it.by, it.fact
    if isinstance(it, KeyLine):
        return it.speaker, it.text
    return it.by or "narration", it.text


def drafted(
    record: Record, lang: str, scenes: Mapping[int, Scene] | None = None
) -> list[tuple[Item, Line]]:
    """Every line of a record, each as a `Line` that costs what its rendering costs."""
    from kioku.rendering import render_claim, render_labels

    lab = render_labels(lang)
    starts = sorted(scenes or {})
    out: list[tuple[Item, Line]] = []
    for kind in _TRACKS:
        for it in getattr(record, kind):
            seq = it.seq if it.seq is not None else -1
            at = f"- #{seq} " if seq >= 0 else "- "
            who, text = _words_of(it)
            if isinstance(it, Claim):
                shown = at + render_claim(it, lab)
            elif isinstance(it, KeyLine):
                shown = at + lab.quote.format(speaker=who, text=text)
            else:
                by = it.by
                shown = f"{at}{by}: {text}" if by else at + text
            scene = scene_of(seq, starts) if seq >= 0 else None
            # what only a reader of the whole span can say: a claim the story bears out or
            # belies. No line of the span says it, so it goes first
            must = isinstance(it, Claim) and (bool(it.actual) or it.supported_by != "none")
            # a grounded line of the model is a fact the record keeps, like a fact the ledger
            # would keep among the span's lines: both go before the rest
            line = _Drafted(seq, who or lab.story, text, None, scene, must, None, shown=shown)
            out.append((it, line))
    return out


def span_candidates(entries: Sequence[LogEntry], lang: str) -> list[tuple[Item, Line]]:
    """The span's own lines, each with the record item it would become."""
    return [(item_of_line(ln), ln) for ln in attributed_lines(entries, lang)]


def choose(
    record: Record,
    candidates: Sequence[tuple[Item, Line]],
    budget: int,
    counter: TokenCounter,
    lang: str,
    avoid: Sequence[str] = (),
    scenes: Mapping[int, Scene] | None = None,
    groups: Sequence[tuple[int, int]] = (),
) -> tuple[Record, list[Item], int]:
    """A record chosen within `budget` tokens from the model's grounded lines and `candidates`
    (a chapter: the span's own lines; a synopsis: the lines of what it folds, already stored)
    together, by what each brings that the lines picked before it do not
    (`summarizer.select_lines`: facts first, new content words per token; with `groups`, the
    (first, last) seq ranges of the items a synopsis folds, each range keeps its share as in
    `select_balanced`). A small model's line that restates a message in more words, or says
    less than the message it cites, loses its place to that message; a short line that sums
    up many is picked before any of them. Measured with the 1.5B model on LoCoMo, its lines
    alone answered fewer questions than the extractive chapter in the same room
    (`docs/chronicler.md`). Threads stay. Returns the record, the candidates' items added,
    and how many of the model's lines were left out."""
    from kioku.rendering import render_labels, render_threads

    known = scenes or {}
    drafts = drafted(record, lang, known)
    mine, theirs = _unrepeated(drafts, candidates, lang)
    record = replace(record, threads=_one_each(_storylines(record.threads, candidates)))
    pool = [ln for _, ln in mine] + [ln for _, ln in theirs]
    cost = {k: counter.count(marker(sc, None, lang)) for k, sc in known.items()}
    lab = render_labels(lang)
    room = budget - counter.count(f"### {lab.story}\n")  # the rest is trimmed to fit
    if record.threads:
        room -= counter.count(f"### {lab.threads}\n{render_threads(record.threads, lang)}\n\n")
    if groups:
        by_group: list[tuple[int, list[Line]]] = [(last - first + 1, []) for first, last in groups]
        for ln in pool:
            n = next((i for i, (f, la) in enumerate(groups) if f <= ln.seq <= la), 0)
            by_group[n][1].append(ln)
        chosen = select_balanced(by_group, room, counter, avoid, lang, cost)
    else:
        chosen = select_lines(pool, room, counter, avoid, lang, cost)
    picked = {id(ln) for ln in chosen}
    keep = [it for it, ln in mine if id(ln) in picked]
    added = [it for it, ln in theirs if id(ln) in picked]
    out = _with_items(record, keep + added)
    out, _ = trim(out, budget, counter, lang, scenes)  # headings and markers cost too
    left = {id(it) for it in (*out.events, *out.claims, *out.user_facts, *out.key_lines)}
    added = [it for it in added if id(it) in left]
    return out, added, sum(1 for it, _ in drafts if id(it) not in left)


_COPIED = 2 / 3  # of a line's content words that a model's line of its message has
_COPY_RATIO = 0.85  # difflib's ratio of a copied sentence to its message's line


def _copied(a: str, b: str) -> bool:
    """`a` is `b` copied: the same characters but for a few (a name put in front, a word
    dropped). A fact reworded ("I start a new job" → "Ren starts a new job") is not."""
    x, y = norm_text(a).casefold(), norm_text(b).casefold()
    return bool(x and y) and SequenceMatcher(None, x, y, autojunk=False).ratio() >= _COPY_RATIO


def _unnamed(sentence: str, who: str) -> str:
    """A sentence without the writer's name put in front of their words ("CP マルタイ！")."""
    if who and sentence.startswith(who):
        return sentence[len(who) :].lstrip(" 　:：、,は")
    return sentence


def _unrepeated(
    mine: Sequence[tuple[Item, Line]], theirs: Sequence[tuple[Item, Line]], lang: str
) -> tuple[list[tuple[Item, Line]], list[tuple[Item, Line]]]:
    """The model's lines and the candidates with each thing said once. A model line each of
    whose sentences is a line of its message copied (the 1.5B model copies whole messages as
    "facts") gives way to those lines, which the selection then weighs one by one; a
    candidate the model's kept line of the same message mostly says is left out."""
    from kioku.salience import content_words
    from kioku.summarizer import split_sentences

    said: dict[int, list[str]] = {}
    for _, ln in theirs:
        said.setdefault(ln.seq, []).append(ln.text)
    kept: list[tuple[Item, Line]] = []
    for it, ln in mine:
        lines = said.get(ln.seq, [])
        sentences = [_unnamed(x, ln.speaker) for x in split_sentences(ln.text)]
        copy = sentences and all(any(_copied(x, y) for y in lines) for x in sentences)
        if ln.must or not copy:
            kept.append((it, ln))
    by_model: dict[int, list[frozenset[str]]] = {}
    for _, ln in kept:
        by_model.setdefault(ln.seq, []).append(content_words(ln.text, lang))
    rest: list[tuple[Item, Line]] = []
    for it, ln in theirs:
        words = content_words(ln.text, lang)
        if words and any(len(words & m) >= _COPIED * len(words) for m in by_model.get(ln.seq, [])):
            continue
        rest.append((it, ln))
    return kept, rest


def _storylines(
    threads: Sequence[ThreadNote], candidates: Sequence[tuple[Item, Line]]
) -> tuple[ThreadNote, ...]:
    """The threads that name a storyline: one whose title is a line of its message copied (the
    1.5B model wrote eight such "threads" for one chapter, and threads always stay) is left
    for that line to compete with the others. A title in the message's words is no copy."""
    said: dict[int, list[str]] = {}
    for _, ln in candidates:
        said.setdefault(ln.seq, []).append(ln.text)
    from kioku.summarizer import split_sentences

    everything = [x for xs in said.values() for x in xs]

    def copy(t: ThreadNote) -> bool:
        lines = said.get(t.seq, []) if t.seq is not None else everything
        sentences = split_sentences(t.title)
        return bool(sentences) and all(any(_copied(x, y) for y in lines) for x in sentences)

    return tuple(t for t in threads if not copy(t))


def _one_each(threads: Sequence[ThreadNote]) -> tuple[ThreadNote, ...]:
    """One note per thread, as memory shows it (`structure.merge_threads`: its first title, the
    status of its latest note): a thread opened and settled in one chapter costs one line."""
    out: dict[str, ThreadNote] = {}
    for t in threads:
        cur = out.get(t.id)
        if cur is None:
            out[t.id] = t
        elif t.seq is None or cur.seq is None or t.seq > cur.seq or t.status == "resolved":
            out[t.id] = replace(cur, status=t.status, seq=t.seq if t.seq is not None else cur.seq)
    return tuple(out.values())


def _with_items(record: Record, items: Sequence[Item]) -> Record:
    """The record's threads with these lines, each in its track, once."""
    tracks: dict[type, list[Any]] = {Event: [], Claim: [], UserFact: [], KeyLine: []}
    seen: set[tuple[type, int | None, str]] = set()
    for it in items:
        key = (type(it), it.seq, norm_text(_words_of(it)[1]))
        if key not in seen:
            seen.add(key)
            tracks[type(it)].append(it)

    def ordered(kind: type) -> tuple[Any, ...]:  # story order, as memory shows them
        return tuple(sorted(tracks[kind], key=lambda it: -1 if it.seq is None else it.seq))

    return replace(
        record,
        events=ordered(Event),
        claims=ordered(Claim),
        user_facts=ordered(UserFact),
        key_lines=ordered(KeyLine),
    )


def trim(
    record: Record,
    limit: int,
    counter: TokenCounter,
    lang: str,
    scenes: Mapping[int, Scene] | None = None,
) -> tuple[Record, int]:
    """An over-long chapter brought under `limit` tokens by leaving out its least informative
    lines (each line whole: nothing is cut mid-sentence), those that bring the fewest content
    words the lines kept so far do not have. Threads stay. A chapter is many independent lines
    a small model wrote; asking it to compress them again costs a request and came back worse
    (`docs/chronicler.md`). A synopsis is still compressed by the model."""
    from kioku.rendering import render_record

    if counter.count(render_record(record, lang, scenes)) <= limit:
        return record, 0
    items: list[tuple[str, int, Any]] = []
    for kind in ("events", "claims", "user_facts", "key_lines"):
        for n, it in enumerate(getattr(record, kind)):
            text = (
                getattr(it, "text", None) or getattr(it, "claim", None) or getattr(it, "fact", "")
            )
            items.append((kind, n, (it, read(text, lang).terms)))
    seen: set[str] = set()
    order: list[tuple[str, int]] = []
    rest = list(items)
    for kind, n, (it, terms) in items:  # what no line of the span says goes first
        if isinstance(it, Claim) and (it.actual or it.supported_by != "none"):
            order.append((kind, n))
            seen |= terms
    rest = [x for x in rest if (x[0], x[1]) not in order]
    while rest:  # most new content first
        best = max(rest, key=lambda x: (len(x[2][1] - seen), -x[1]))
        rest.remove(best)
        seen |= best[2][1]
        order.append((best[0], best[1]))
    keep: set[tuple[str, int]] = set()
    for key in order:
        trial = keep | {key}
        if counter.count(render_record(_subset(record, trial), lang, scenes)) > limit and keep:
            break
        keep = trial
    out = _subset(record, keep)
    return out, len(items) - len(keep)


def _subset(record: Record, keep: set[tuple[str, int]]) -> Record:
    def pick(kind: str) -> tuple[Any, ...]:
        return tuple(it for n, it in enumerate(getattr(record, kind)) if (kind, n) in keep)

    return replace(
        record,
        events=pick("events"),
        claims=pick("claims"),
        user_facts=pick("user_facts"),
        key_lines=pick("key_lines"),
    )
