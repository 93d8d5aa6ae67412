"""Whole records through the grounding check: what stays, what goes, what replaces it.

`ground_record` reads every line of a parsed record (`kioku.structure.Record`) against the
evidence (`check.Evidence`) and keeps the grounded ones; `record_from_reply` does the
same for a reply in the line format (`kioku.reply_format`), deciding what each grounded line is
from the message that bears it out (narration: an event; a character's words: a claim, confirmed
only when narration or a thought says so too; the user's words: a user fact). A claim's
"supported_by" and "actual" are checked the same way and removed when nothing in the span bears
them out.

What is dropped is listed with its reason (`Grounding.dropped`), and each drop is a guard event.
A dropped line that was about its cited message (a garbled paraphrase, the wrong speaker) is
replaced by its extractive counterpart: that message's own sentence, verbatim, with who said it
(`replace_dropped`). What a grounded record then keeps, within its target, is chosen in
`kioku.grounding.choice`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kioku.grounding.attribution import said_in
from kioku.grounding.check import REASONS, Evidence, Statement, Verdict
from kioku.grounding.terms import name_key, read, with_captions
from kioku.messages import LogEntry
from kioku.relative_dates import resolve
from kioku.reply_format import LineReply
from kioku.salience import carries_nothing
from kioku.structure import Claim, Event, KeyLine, Record, ThreadNote, UserFact, norm_text
from kioku.summarizer import Line, attributed_lines

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
        if name_key(n.id) in t.ev.people:
            # memory shows a thread as "id: title", so a person's name for an id makes the
            # title read as their words ("mika: 何が爆弾というケーキですね？", which Mika never said:
            # a model's reply)
            detail = f"a thread named {n.id!r}, a person of the span, reads as their words"
            t.drop(f"{where}[{i}]", n.title, "author", detail)
            continue
        seqs = _seqs(n.seq) if n.seq in t.ev.sources else ()
        v = t.check(f"{where}[{i}]", Statement("thread", n.title, seqs, span_wide=True))
        if v.ok:
            kept.append(replace(n, seq=n.seq if seqs else None))
    return kept


def as_stored(item: Event | Claim | UserFact) -> Statement:
    """The statement a stored item makes: its words, under whom memory shows as its writer."""
    if isinstance(item, Event):
        return Statement("event", item.text, _seqs(item.seq), item.by or None)
    if isinstance(item, Claim):
        return Statement("claim", item.claim, _seqs(item.seq), item.speaker)
    return Statement("fact", item.fact, _seqs(item.seq), item.by or "user")


def ground_record(
    record: Record, ev: Evidence, known_threads: Mapping[str, str] | None = None
) -> tuple[Record, Grounding]:
    """The record with only its grounded lines, and what happened to the rest. A line without
    a seq is grounded where one message supports it, and cites that message from then on."""
    t = _Tally(ev)
    known = known_threads or {}
    events = []
    for i, e in enumerate(record.events):
        v = t.check(f"events[{i}]", as_stored(e))
        if v.ok:
            events.append(replace(e, seq=v.seqs[0] if v.seqs else e.seq))
    claims = []
    for i, c in enumerate(record.claims):
        if c.listener and not ev.known_name(c.listener):
            t.drop(f"claims[{i}]", c.claim, "name", f"{c.listener} is not in the conversation")
            continue
        v = t.check(f"claims[{i}]", as_stored(c))
        if v.ok:
            claims.append(_checked_claim(replace(c, seq=v.seqs[0] if v.seqs else c.seq), t))
    facts = []
    for i, f in enumerate(record.user_facts):
        v = t.check(f"user_facts[{i}]", as_stored(f))
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


_AFTER_NAME = re.compile(
    r"\s*[:：]\s*"
    # "ミカ は、…", "ミカ は金閣寺を…": the topic particle; "ミカ はい。" and "ミカ はじめまして" are words
    r"|\s*は(?:[、,]\s*|\s+|(?=[\u3400-\u9fff\u30a0-\u30ff]))"
    # "Mika went…", "ユウ 暗くなる…", "ミカ 1年たったら…": a name before what is no name
    r"|\s+(?=[^\x00-\x7f]|[a-z0-9])"
)


def _without_name(text: str, who: str) -> str:
    """ "Mika went to a support group", stored under Mika: "went to a support group";
    "ユウ 暗くなるのが…", "ユウ: 暗くなるのが…", "ミカ は、家事を…" and "ミカ 1年たったら…" under their
    writer: "暗くなるのが…", "家事を…", "1年たったら…" (a model
    put the writer's name before their words: it was shown twice, or "は、" was left in front of
    them)."""
    if who and text.startswith(who) and (m := _AFTER_NAME.match(text, len(who))):
        rest = text[m.end() :]
        return rest if rest.strip() else text
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
        if key in seen:  # the same line again (a model repeats itself): kept once
            t.kept -= 1
            t.written -= 1
            continue
        src = ev.sources[v.seq if v.seq is not None else v.seqs[0]]
        who = ln.name or ln.about or src.author
        # "yesterday" kept with the day it meant, as the transcript showed it; what is stored
        # is grounded as stored: "昨年の同級生" from "昔私の同級生" passed as written, and was
        # stored as "昨年(2021年)の同級生", a year the message never named (a model's line)
        stored = with_captions(resolve(ln.text, src.day, ev.lang), src.text)
        text = _without_name(stored, who)
        item: Event | UserFact | Claim
        if v.kind == "narration" or src.role not in ("user", "assistant"):
            item = Event(src.seq, text, ln.name or ln.about)
        elif v.kind == "thought":
            item = Event(src.seq, text, f"{who} (thought)")
        elif src.role == "user":
            item = UserFact(src.seq, text, who)
        else:  # a character's words: a claim; what confirms it is a line of its own
            item = Claim(src.seq, who, text, listener)
        # checked again as the item it is stored as: its day resolved, under its writer.
        # "ユウ え！そんなことあるんですか！…" passed as a line of no one's, and was stored as
        # ユウ's words, which it rewords
        if not (w := ev.check(as_stored(item))).ok:
            t.kept -= 1
            t.dropped.append(Dropped(f"line {i}", text, w.reason or "", w.detail, (src.seq,)))
            continue
        seen.add(key)
        if isinstance(item, Event):
            events.append(item)
        elif isinstance(item, UserFact):
            facts.append(item)
        else:
            claims.append(item)
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
    from kioku.grounding.evidence import evidence_for

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
