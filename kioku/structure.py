"""The chronicle's structure: what a summary holds, parsed strictly (rendered: `kioku.rendering`).

Prose memory cannot be checked. The seed's summaries left resolved threads open (10 → 11 after a
prompt fix: instructions alone did not work) and wrote characters' claims as facts. So the
chronicler answers in a fixed JSON shape: events, attributed claims (speaker, listener, what is
backed by narration or thought, what is actually true), threads with ids and statuses, facts the
user told about themself, and key lines kept word for word. Code can then close a thread by data,
keep verbal tics out, check that a "verbatim" line is verbatim, and render two tracks: `story`
(what happened in the fiction, with attribution) and `user` (facts about the real user).

A reply that does not fit the shape raises `BadSummary`: it is retried, never stored.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from kioku.errors import BadSummary
from kioku.messages import LogEntry
from kioku.prompts import resolve_lang

FORMAT = "kioku.chronicle/1"
KEYS = ("events", "claims", "threads", "user_facts", "key_lines")
Support = Literal["narration", "thought", "none"]
Status = Literal["open", "resolved"]
SUPPORT: tuple[str, ...] = ("narration", "thought", "none")
# models say "closed" or "done"; the meaning is not in doubt, so these are accepted
_STATUS_WORDS: Mapping[str, Status] = {
    "open": "open",
    "ongoing": "open",
    "resolved": "resolved",
    "closed": "resolved",
    "done": "resolved",
    "settled": "resolved",
}
# words that describe a speech habit rather than a fact (seed 003: the summarizer wrote "she
# often uses that expression" and the tic became the character)
TIC_WORDS = re.compile(
    r"catch-?phrase|verbal tic|pet phrase|口癖|決め台詞|语癖|口头禅|口頭禪", re.IGNORECASE
)


@dataclass(frozen=True)
class Event:
    seq: int | None
    text: str
    by: str = ""  # who wrote the message it records, when the line says so (the line format)


@dataclass(frozen=True)
class Claim:
    seq: int | None
    speaker: str
    claim: str
    listener: str = ""
    supported_by: Support = "none"
    actual: str | None = None


@dataclass(frozen=True)
class ThreadNote:
    """What one record says about a thread: its state as of `seq`."""

    id: str
    title: str
    status: Status
    seq: int | None = None


@dataclass(frozen=True)
class UserFact:
    seq: int | None
    fact: str
    by: str = ""  # the user's name, when the line says it


@dataclass(frozen=True)
class KeyLine:
    seq: int
    speaker: str
    text: str


@dataclass(frozen=True)
class Thread:
    """A thread's state merged across records, oldest first."""

    id: str
    title: str
    status: Status
    opened_seq: int | None
    changed_seq: int | None


RecordLine = Event | Claim | UserFact | KeyLine


def who_and_what(it: RecordLine) -> tuple[str, str]:
    """(who, what) of one line of a record: a claim's speaker and claim, a fact's user (may be
    "") and fact, a key line's speaker and words, an event's writer (or narration) and text."""
    if isinstance(it, Claim):
        return it.speaker, it.claim
    if isinstance(it, UserFact):
        return it.by, it.fact
    if isinstance(it, KeyLine):
        return it.speaker, it.text
    return it.by or "narration", it.text


@dataclass(frozen=True)
class Record:
    events: tuple[Event, ...] = ()
    claims: tuple[Claim, ...] = ()
    threads: tuple[ThreadNote, ...] = ()
    user_facts: tuple[UserFact, ...] = ()
    key_lines: tuple[KeyLine, ...] = ()

    def is_empty(self) -> bool:
        return not (self.events or self.claims or self.threads or self.user_facts or self.key_lines)

    def to_json(self) -> dict[str, Any]:
        def drop_none(d: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in d.items() if v is not None and v != ""}

        return {
            "events": [drop_none({"seq": e.seq, "text": e.text, "by": e.by}) for e in self.events],
            "claims": [
                drop_none(
                    {
                        "seq": c.seq,
                        "speaker": c.speaker,
                        "listener": c.listener,
                        "claim": c.claim,
                        "supported_by": c.supported_by,
                        "actual": c.actual,
                    }
                )
                for c in self.claims
            ],
            "threads": [
                drop_none({"id": t.id, "title": t.title, "status": t.status, "seq": t.seq})
                for t in self.threads
            ],
            "user_facts": [
                drop_none({"seq": f.seq, "fact": f.fact, "by": f.by}) for f in self.user_facts
            ],
            "key_lines": [
                {"seq": k.seq, "speaker": k.speaker, "text": k.text} for k in self.key_lines
            ],
        }

    def to_data(self, lang: str) -> dict[str, Any]:
        """What `Summary.data` / `MemoryItem.data` holds."""
        return {"format": FORMAT, "lang": resolve_lang(lang), **self.to_json()}


def is_structured(data: Mapping[str, Any] | None) -> bool:
    return data is not None and data.get("format") == FORMAT


def record_from_data(data: Mapping[str, Any]) -> Record:
    """A stored record back as values (trusted input: it passed `parse_record` once)."""
    return _build(dict(data), span=None, stored=True)


# parsing --------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON object of a reply: the first fenced block, else the outermost braces.

    Lenient about the wrapping (models add a sentence before the block), strict about the
    content: it must be valid JSON, no trailing commas or comments."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        candidates.append(text[start : end + 1])
    if not candidates:
        raise BadSummary("unparseable: no JSON object in the reply", text)
    error = ""
    for c in candidates:
        try:
            return json.loads(c)
        except json.JSONDecodeError as e:
            error = error or f"unparseable: invalid JSON ({e.msg} at line {e.lineno})"
    raise BadSummary(error, text)


def parse_record(text: str, span: tuple[int, int]) -> Record:
    """Parse a chronicler reply strictly; every seq must lie within `span`."""
    obj = extract_json(text)
    if not isinstance(obj, dict):
        raise BadSummary("unparseable: the JSON is not an object", text)
    try:
        record = _build(obj, span=span, stored=False)
    except BadSummary as e:
        raise BadSummary(e.reason, text) from None
    if record.is_empty():
        raise BadSummary("unparseable: the record is empty", text)
    return record


def _invalid(problem: str) -> BadSummary:
    return BadSummary(f"unparseable: {problem}")


_SUPPORT_OF: Mapping[str, Support] = {s: s for s in get_args(Support)}


def _build(obj: dict[str, Any], span: tuple[int, int] | None, stored: bool) -> Record:
    """A record from its JSON, checked field by field (`BadSummary` names the first problem);
    every seq within `span` when one is given. Stored data skips the unknown-keys check."""
    if not stored:
        unknown = sorted(set(obj) - set(KEYS))
        if unknown:
            raise _invalid(f"unknown keys {unknown}; use only {', '.join(KEYS)}")
    read = _Reader(obj, span)
    return Record(
        tuple(_events(read)),
        tuple(_claims(read)),
        tuple(_threads(read)),
        tuple(_facts(read)),
        tuple(_key_lines(read)),
    )


class _Reader:
    """Typed access to a record's JSON; each method names where a problem is."""

    def __init__(self, obj: Mapping[str, Any], span: tuple[int, int] | None) -> None:
        self.obj = obj
        self.span = span

    def items(self, key: str) -> list[Any]:
        v = self.obj.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise _invalid(f'"{key}" must be a list')
        return v

    def seq(self, d: Mapping[str, Any], where: str, required: bool = False) -> int | None:
        v = d.get("seq")
        if v is None or v == "":
            if required:
                raise _invalid(f"{where}.seq is required")
            return None
        if isinstance(v, str) and re.fullmatch(r"#?\d+", v.strip()):
            v = int(v.strip().lstrip("#"))
        if not isinstance(v, int) or isinstance(v, bool):
            raise _invalid(f"{where}.seq must be a message number")
        if self.span is not None and not self.span[0] <= v <= self.span[1]:
            raise _invalid(f"{where}.seq {v} is outside #{self.span[0]}–#{self.span[1]}")
        return v

    def text(self, d: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
        v = d.get(key)
        if v is None and not required:
            return ""
        if not isinstance(v, str) or (required and not v.strip()):
            raise _invalid(f"{where}.{key} must be a non-empty string")
        return v.strip()

    def obj_at(self, v: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(v, dict):
            raise _invalid(f"{where} must be an object")
        return v


def _events(read: _Reader) -> list[Event]:
    events: list[Event] = []
    for i, v in enumerate(read.items("events")):
        if isinstance(v, str) and v.strip():  # a bare sentence is an event without a seq
            events.append(Event(None, v.strip()))
            continue
        w = f"events[{i}]"
        d = read.obj_at(v, w)
        by = read.text(d, "by", w, required=False) if isinstance(d.get("by"), str) else ""
        events.append(Event(read.seq(d, w), read.text(d, "text", w), by))
    return events


def _claims(read: _Reader) -> list[Claim]:
    claims: list[Claim] = []
    for i, v in enumerate(read.items("claims")):
        w = f"claims[{i}]"
        d = read.obj_at(v, w)
        support = _SUPPORT_OF.get(str(d.get("supported_by") or "none").strip().lower())
        if support is None:
            raise _invalid(f"{w}.supported_by must be one of {', '.join(SUPPORT)}")
        actual = d.get("actual")
        if actual is not None and not isinstance(actual, str):
            raise _invalid(f"{w}.actual must be a string or null")
        claims.append(
            Claim(
                seq=read.seq(d, w),
                speaker=read.text(d, "speaker", w),
                claim=read.text(d, "claim", w),
                listener=read.text(d, "listener", w, required=False),
                supported_by=support,
                actual=(actual or "").strip() or None,
            )
        )
    return claims


def _threads(read: _Reader) -> list[ThreadNote]:
    threads: list[ThreadNote] = []
    for i, v in enumerate(read.items("threads")):
        w = f"threads[{i}]"
        d = read.obj_at(v, w)
        tid = thread_id(read.text(d, "id", w))
        if not tid:
            raise _invalid(f"{w}.id must contain letters or digits")
        status = _STATUS_WORDS.get(str(d.get("status") or "").strip().lower())
        if status is None:
            raise _invalid(f"{w}.status must be open or resolved")
        try:
            tseq = read.seq(d, w)
        except BadSummary:
            # a thread's seq often points at where it opened, before this range: keep the note
            tseq = None
        title = read.text(d, "title", w, required=False) or tid
        threads.append(ThreadNote(tid, title, status, tseq))
    return threads


def _facts(read: _Reader) -> list[UserFact]:
    facts: list[UserFact] = []
    for i, v in enumerate(read.items("user_facts")):
        w = f"user_facts[{i}]"
        if isinstance(v, str) and v.strip():
            facts.append(UserFact(None, v.strip()))
            continue
        d = read.obj_at(v, w)
        by = read.text(d, "by", w, required=False) if isinstance(d.get("by"), str) else ""
        facts.append(UserFact(read.seq(d, w), read.text(d, "fact", w), by))
    return facts


def _key_lines(read: _Reader) -> list[KeyLine]:
    lines: list[KeyLine] = []
    for i, v in enumerate(read.items("key_lines")):
        w = f"key_lines[{i}]"
        d = read.obj_at(v, w)
        s = read.seq(d, w, required=True)
        assert s is not None
        lines.append(KeyLine(s, read.text(d, "speaker", w), read.text(d, "text", w)))
    return lines


def thread_id(raw: str) -> str:
    """Ids compare loosely: case, spaces and punctuation do not make a new thread."""
    s = unicodedata.normalize("NFKC", raw).strip().lower()
    s = re.sub(r"[^\w]+", "-", s).strip("-")
    return s[:64]


# guards ---------------------------------------------------------------------------------------


def norm_text(s: str) -> str:
    """Text compared loosely: NFKC, one space, no quotes around it."""
    s = unicodedata.normalize("NFKC", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s.strip("\"'「」『』“”‘’ ")


def remove_phrases(record: Record, phrases: Sequence[str]) -> tuple[Record, int]:
    """Keep verbal tics out of memory: key lines holding one are dropped (a verbatim line cannot
    be edited), the phrase is cut from any other text, and items that describe a speech habit
    are dropped. Returns the cleaned record and how many items were touched."""
    pats = [re.compile(re.escape(p.strip()), re.IGNORECASE) for p in phrases if p.strip()]
    touched = 0

    def has_tic(s: str) -> bool:
        return any(p.search(s) for p in pats)

    def clean(s: str) -> str:
        for p in pats:
            s = p.sub("", s)
        return re.sub(r"\s{2,}", " ", s).strip()

    def keep(s: str) -> bool:
        return bool(re.search(r"\w", s))

    events: list[Event] = []
    for e in record.events:
        if TIC_WORDS.search(e.text) or has_tic(e.text):
            touched += 1
            if TIC_WORDS.search(e.text) or not keep(clean(e.text)):
                continue
            e = replace(e, text=clean(e.text))
        events.append(e)
    claims: list[Claim] = []
    for c in record.claims:
        joined = f"{c.claim} {c.actual or ''}"
        if TIC_WORDS.search(joined) or has_tic(joined):
            touched += 1
            if TIC_WORDS.search(joined) or not keep(clean(c.claim)):
                continue
            c = replace(c, claim=clean(c.claim), actual=clean(c.actual) if c.actual else None)
        claims.append(c)
    facts: list[UserFact] = []
    for f in record.user_facts:
        if has_tic(f.fact):
            touched += 1
            if not keep(clean(f.fact)):
                continue
            f = replace(f, fact=clean(f.fact))
        facts.append(f)
    lines = [k for k in record.key_lines if not has_tic(k.text)]
    touched += len(record.key_lines) - len(lines)
    threads = [replace(t, title=clean(t.title) or t.id) for t in record.threads]
    cleaned = Record(tuple(events), tuple(claims), tuple(threads), tuple(facts), tuple(lines))
    return cleaned, touched


def verify_key_lines(record: Record, sources: Mapping[int, Sequence[str]]) -> tuple[Record, int]:
    """Keep only key lines whose text really occurs at their seq (`sources`: seq → texts).

    "Verbatim" is checked, not trusted: a paraphrase presented as a quotation would put words in
    a character's mouth. Returns the record and how many lines were dropped."""
    kept = []
    for k in record.key_lines:
        needle = norm_text(k.text)
        if needle and any(needle in norm_text(t) for t in sources.get(k.seq, ())):
            kept.append(k)
    return replace(record, key_lines=tuple(kept)), len(record.key_lines) - len(kept)


def entry_sources(entries: Iterable[LogEntry]) -> dict[int, list[str]]:
    return {e.seq: [p.text for p in e.message.parts] for e in entries}


def record_sources(records: Iterable[Record]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for r in records:
        for k in r.key_lines:
            out.setdefault(k.seq, []).append(k.text)
    return out


# threads --------------------------------------------------------------------------------------


def _notes_of(item: Any) -> Iterable[tuple[ThreadNote, int | None]]:
    data = getattr(item, "data", item)
    if not is_structured(data):
        return []
    default = getattr(item, "last_seq", None)
    return [(t, t.seq if t.seq is not None else default) for t in record_from_data(data).threads]


def merge_threads(items: Iterable[Any]) -> list[Thread]:
    """Fold the thread notes of memory items (or their `data`), oldest first, into one state.

    The note with the later seq wins; at the same seq "resolved" wins. So a thread resolved in
    chapter 3 is closed however chapter 1 or an older synopsis described it: closed by data."""
    state: dict[str, Thread] = {}
    for item in items:
        for note, seq in _notes_of(item):
            cur = state.get(note.id)
            if cur is None:
                state[note.id] = Thread(note.id, note.title, note.status, seq, seq)
                continue
            if seq is not None and cur.changed_seq is not None:
                if seq < cur.changed_seq:
                    continue
                if seq == cur.changed_seq and cur.status == "resolved":
                    continue
            state[note.id] = replace(cur, status=note.status, changed_seq=seq)
    return list(state.values())


def carry_threads(record: Record, before: Sequence[Thread], drop_resolved: bool = True) -> Record:
    """A rewrite (synopsis, compress) cannot change what happened to a thread: every open
    thread it was given stays, with its status from the data; a resolved one stays resolved.
    A synopsis may drop a resolved thread (nothing older is left to reopen it); a compressed
    chapter may not (its note is what closes the thread opened in an earlier chapter).
    New ids the rewrite invents are kept as given."""
    given = {t.id: t for t in record.threads}
    out: list[ThreadNote] = []
    for t in before:
        mine = given.pop(t.id, None)
        if t.status == "resolved" and mine is None and drop_resolved:
            continue
        title = mine.title if mine and mine.title != mine.id else t.title
        out.append(ThreadNote(t.id, title, t.status, t.changed_seq))
    out.extend(given.values())
    return replace(record, threads=tuple(out))
