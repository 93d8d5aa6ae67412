"""Grounding: every line a model writes into memory is checked, in code, against what it cites.

A model, asked for a chronicle, copied the prompt's example into memory (its seqs happened
to fall inside the span), renamed a speaker after the example's character, stored another
speaker's marriage as a fact about the user and cited a "thought at #13" in a conversation
without thoughts. Every one of those lines parsed; a parser cannot tell. So before a line is
stored (an event, a claim, a user fact, a thread, a key line, a synopsis line, a note) it is
read against the messages it cites:

- `seq`: it cites messages inside the span (a line without a seq is looked for: the one message
  that supports it becomes its citation, or it is dropped);
- `prompt`: it holds no run of the prompt's own words (instructions, placeholders) that the
  conversation does not also use;
- `name`: every name it uses occurs in the span or in memory;
- `author`: whom it names as the writer (a claim's speaker, a key line's speaker, the user of a
  user fact) wrote a cited message; whom it is about, if a person of the conversation, wrote
  or is named in one;
- `empty`: it says nothing a later reader could use (only names and framing words: "Samantha
  asked Mika how she was"); dropped, but not counted against the record as invented;
- `unsupported`: its content stands in the cited messages, as the evidence's `judge` reads it
  (`Judge`); the default, the word reader (`WORD_READER`, `Evidence.read`), finds its content
  terms, numbers and negation there (`kioku.grounding.terms`: stemmed English, SudachiPy's
  dictionary forms for Japanese, bigrams for Chinese) — at least `min_support` of its terms,
  all of its numbers.

The first check that fails is the line's reason. `Evidence` holds what lines are checked
against — the span's messages (`from_entries`), or for a synopsis the records it folds
(`from_items`) — and `check(statement)` is pure. `records` applies it to whole records.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from functools import cached_property
from typing import Protocol

from kioku.dates import MONTHS, WEEKDAYS
from kioku.grounding.terms import (
    EMPTY_PROMPT,
    PLACEHOLDER,
    PromptText,
    Reading,
    asks,
    first_person,
    fold,
    name_key,
    phrases,
    quoted_share,
    read,
)
from kioku.lang import WORDS
from kioku.prompts import resolve_lang
from kioku.salience import carries_nothing
from kioku.sentences import SENTENCE_END
from kioku.structure import norm_text

REASONS: tuple[str, ...] = ("seq", "prompt", "name", "author", "empty", "unsupported")
QUOTED = 0.85  # of a first-person line's words that must stand, in order, in its message
NEAR = 3  # messages either side of a cited one whose words a line may have borrowed
# share of a line's content terms its cited messages must hold, per language (a paraphrase in
# Japanese swaps more words than one in English; Chinese bigrams split words)
MIN_SUPPORT = {"en": 0.75, "ja": 0.7, "zh": 0.6}
# a thread's title names a question or a plan in a few words of its own ("what Hana hides about
# the town"): half of them must be in its message, or anywhere in the span when it cites none
THREAD_SUPPORT = 0.5
USER_WORDS = frozenset(w for x in WORDS.values() for w in x.user_words)
CHARACTER_WORDS = frozenset(w for x in WORDS.values() for w in x.character_words)
# parts whose words are evidence of what happened (not only of what someone said)
WITNESS = ("narration", "thought")


@dataclass(frozen=True)
class Piece:
    """One part of a cited message (or of a record a synopsis folds)."""

    kind: str  # narration, speech, thought, text, tool, image, memory
    speaker: str
    text: str  # as the chronicler read it ("yesterday (7 May 2023)")
    raw: str = ""  # as it was written, when that differs


@dataclass(frozen=True)
class Source:
    """What one seq holds: who wrote it, on which side, its parts and its day."""

    seq: int
    author: str
    role: str  # user, assistant, system, tool; "memory" when only a record of it is left
    pieces: tuple[Piece, ...]
    day: date | None = None

    @cached_property
    def text(self) -> str:
        return "\n".join(p.text for p in self.pieces)

    @cached_property
    def speakers(self) -> frozenset[str]:
        return frozenset(name_key(p.speaker) for p in self.pieces if p.speaker)


@dataclass(frozen=True)
class Statement:
    """A line as the model wrote it, with what it cites and whom it names."""

    kind: str  # event, claim, fact, thread, key_line, actual, note, line
    text: str
    seqs: tuple[int, ...] = ()
    author: str | None = None  # who wrote (or said) the cited message, as the line says
    subject: str | None = None  # whom it is about, as the line says (a note's subject)
    verbatim: bool = False  # a key line: its words must occur as written
    span_wide: bool = False  # a thread: checked against the whole span when it cites nothing


@dataclass(frozen=True)
class Verdict:
    reason: str | None  # None: grounded; else one of REASONS
    support: float = 0.0
    detail: str = ""
    kind: str = ""  # the kind of part that bears it out best (narration, speech, thought, text)
    seqs: tuple[int, ...] = ()  # what it is grounded on (a line without a seq: where found)
    seq: int | None = None  # of those, the message that bears it out best

    @property
    def ok(self) -> bool:
        return self.reason is None


class Judge(Protocol):
    """Whether a line's content stands in the messages it cites: the one question the rules
    before it (`seq`, `prompt`, `name`, `author`, `empty`) leave to the evidence's judge.

    A line (its text, whom it is by or about, the seqs it cites) and its sources (the cited
    messages) → a `Verdict`: ok, or a reason with a short detail; `ev` is what the line is read
    within (its language, the span's people and messages). The word reader (`WORD_READER`) is
    the default and the only judge kioku uses; others were measured against it on the case
    corpus by `kioku bench judge` (`kioku.grounding.ngrams`, `kioku.grounding.asked`; figures
    in docs/chronicler.md). A judge that says only whether leaves `kind` empty, and the word
    reader then names the part that bears the line out, as records need."""

    @property
    def name(self) -> str: ...

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict: ...


class WordReader:
    """The word reader (`Evidence.read`): the line's content terms, numbers and negation read
    in the cited messages, per language (`kioku.grounding.terms`), with the rules that read
    them (a question told as an answer, a writer's reworded first person, a neighbour's words)."""

    name = "words"

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        return ev.read(line, sources)


WORD_READER = WordReader()


def _day_terms(day: date | None, lang: str) -> frozenset[str]:
    if day is None:
        return frozenset()
    names = (MONTHS[day.month - 1], WEEKDAYS["en"][day.weekday()])
    return read(f"{day.day} {day.year} {' '.join(names)}", "en").terms | {
        str(day.day),
        str(day.month),
        str(day.year),
    }


def same_person(a: str, b: str) -> bool:
    """Names compare loosely: case, and a short form of a longer name ("Kat", "Katherine")."""
    if not a or not b:
        return False
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 3 and (long_.startswith(short) or long_.split(" ")[0] == short)


@dataclass
class Evidence:
    """What lines are checked against. Built once per task; `check` is pure."""

    sources: Mapping[int, Source]
    lang: str = "en"
    user_names: tuple[str, ...] = ()
    character_names: tuple[str, ...] = ()
    memory_text: str = ""  # memory so far: names it holds may be used again
    prompt: PromptText = EMPTY_PROMPT
    min_support: float | None = None
    span: tuple[int, int] | None = None
    judge: Judge = WORD_READER  # whether a line's content stands in its sources (`judge`)
    _cache: dict[int, frozenset[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.lang = resolve_lang(self.lang)
        if self.span is None and self.sources:
            self.span = (min(self.sources), max(self.sources))

    # who is who ----------------------------------------------------------------------------

    @cached_property
    def people(self) -> dict[str, str]:
        """Every person of the span by name key: authors, speakers, the user, the character."""
        out: dict[str, str] = {}
        for s in self.sources.values():
            for n in (s.author, *(p.speaker for p in s.pieces)):
                if n and n not in ("narration",):
                    out.setdefault(name_key(n), n)
        for n in (*self.user_names, *self.character_names):
            if n:
                out.setdefault(name_key(n), n)
        return out

    @cached_property
    def _user_keys(self) -> frozenset[str]:
        return USER_WORDS | {name_key(n) for n in self.user_names if n}

    @cached_property
    def _character_keys(self) -> frozenset[str]:
        return CHARACTER_WORDS | {name_key(n) for n in self.character_names if n}

    def wrote(self, who: str, src: Source) -> bool:
        """Whether `who` wrote message `src` (or speaks in it)."""
        k = (
            re.sub(r"\s*[(（][^)）]*[)）]\s*$", "", name_key(who)) if who else ""
        )  # "Hana (thought)"
        if k not in USER_WORDS and k not in CHARACTER_WORDS:
            k = k.removeprefix("the ").strip()
        if not k:
            return False
        if k in self._user_keys and src.role == "user":
            return True
        if k in self._character_keys and src.role == "assistant":
            return True
        if same_person(k, name_key(src.author)) or any(same_person(k, s) for s in src.speakers):
            return True
        # a record of the message (a synopsis input) without its author: named in it
        return src.role == "memory" and not src.author and self._named_in(who, src.text)

    def told_of(self, who: str, src: Source) -> bool:
        """Whether narration or a thought in `src` (or a record a synopsis folds) speaks of
        `who`. Words someone says to a person do not count: "Thanks, Samantha!" is Mika's,
        and a line that has Samantha thanking is the two turned around."""
        pieces = (
            src.pieces if src.role == "memory" else [p for p in src.pieces if p.kind in WITNESS]
        )
        return any(self._named_in(who, p.text) for p in pieces)

    def _named_in(self, who: str, text: str) -> bool:
        k = name_key(who)
        if not k:
            return False
        folded = fold(text).casefold()
        if re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", k):
            return k in folded
        return re.search(rf"(?<![a-z0-9]){re.escape(k)}", folded) is not None

    def subject(self, text: str) -> str | None:
        """The person of the conversation a line names first (its subject, in the languages
        kioku speaks), "the user" included."""
        folded = fold(text).casefold()
        best: tuple[int, str] | None = None
        names = [*self.people.values(), *USER_WORDS]
        for n in names:
            k = name_key(n)
            if not k or len(k) < 2:
                continue
            if re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", k):
                i = folded.find(k)
            else:
                m = re.search(rf"(?<![a-z0-9]){re.escape(k)}(?![a-z0-9])", folded)
                i = m.start() if m else -1
            if i >= 0 and (best is None or i < best[0]):
                best = (i, n)
        return best[1] if best else None

    # what the span and memory know -------------------------------------------------------

    @cached_property
    def _known_text(self) -> str:
        texts = [s.text for s in self.sources.values()]
        texts += [s.author for s in self.sources.values()]
        texts += list(self.people.values()) + [self.memory_text]
        return fold("\n".join(texts)).casefold()

    def known_name(self, name: str) -> bool:
        k = name_key(name)
        if k in USER_WORDS or k in CHARACTER_WORDS or k in self.people:
            return True
        if re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", k):
            return k in self._known_text
        return re.search(rf"(?<![a-z0-9]){re.escape(k)}(?![a-z0-9])", self._known_text) is not None

    # support -------------------------------------------------------------------------------

    @cached_property
    def _people_terms(self) -> frozenset[str]:
        words = " ".join([*self.people.values(), *USER_WORDS, *CHARACTER_WORDS])
        return read(words, "en").terms | read(words, self.lang).terms

    def _source_terms(self, src: Source) -> frozenset[str]:
        got = self._cache.get(src.seq)
        if got is None:
            terms: set[str] = set(_day_terms(src.day, self.lang))
            for p in src.pieces:
                for text in (p.text, p.raw):
                    r = read(text, self.lang)
                    terms |= r.terms | r.numbers
            got = self._cache[src.seq] = frozenset(terms) | self._people_terms
        return got

    def _support(self, line: Reading, srcs: Sequence[Source]) -> tuple[float, str]:
        """Share of the line's content terms the sources hold, and what is missing."""
        want = line.terms - self._people_terms - self._short_names(line)
        if not want:
            return 1.0, ""
        have: set[str] = set()
        for s in srcs:
            have |= self._source_terms(s)
        missing = sorted(want - have)
        numbers = sorted(line.numbers - have)
        if numbers:
            return 0.0, f"the number {numbers[0]} is not in the cited message"
        if line.negated and not any(read(s.text, self.lang).negated for s in srcs):
            return 0.0, "it negates what the cited message says"
        said = [read(t, self.lang) for s in srcs for p in s.pieces for t in (p.text, p.raw)]
        foreign = sorted(line.foreign - {ch for r in said for ch in r.foreign})
        if foreign:
            return 0.0, f"{foreign[0]} is not Japanese"
        done = frozenset().union(*(r.done for r in said))
        undone = frozenset().union(*(r.undone for r in said))
        planned = sorted((line.done & undone) - done)
        if planned:  # "DONE フェス: 行きました" from 行きたいです
            return 0.0, f"it tells {planned[0]} as done, the cited message does not"
        share = 1 - len(missing) / len(want)
        if len(want) < 2 and line.soft:  # one content word: what is done with it counts too
            light = {w for w in line.soft if not any(w in self._light_of(s) for s in srcs)}
            if light:
                return 0.0, ", ".join(sorted(light)[:4])
        return share, (", ".join(missing[:4]) if missing else "")

    def _misquoted(self, line: str, speaker: str, cited: Sequence[Source]) -> str:
        """A line in its writer's first person gives itself out as their words, so it must be
        them, cut but not reworded: "#31 Mika: I'm doing my best to make a family for kids"
        stood for "I'm thrilled to make a family for kids" (a model's line)."""
        text = line.removeprefix(speaker).lstrip(" :：")
        best = max(
            (quoted_share(text, t) for s in cited for p in s.pieces for t in (p.text, p.raw) if t),
            default=0.0,
        )
        if best >= QUOTED:
            return ""
        return f"it gives itself out as #{cited[0].seq}'s words, which it rewords"

    def _borrowed(self, line: str, cited: Sequence[Source], who: str | None) -> str:
        """Words of the line that its messages lack and a neighbour's message by someone else
        holds: the line has put that person's words in another mouth. A model wrote
        "ミカ 週3回水泳を通っています" citing ミカ's "水泳を週3回もやってたら、身体も引き締まりそう"
        (if you swim three times a week…), from アキ's "週に3回通っています" just before."""
        have: set[str] = set()
        for s in cited:
            for p in s.pieces:
                have |= phrases(p.text) | phrases(p.raw)
        missing = phrases(line) - have
        if not missing:
            return ""
        seqs = {s.seq for s in cited}
        authors = {s.author for s in cited}
        for seq in sorted({n for s in seqs for n in range(s - NEAR, s + NEAR + 1)} - seqs):
            src = self.sources.get(seq)
            if src is None or src.author in authors or (who and self.wrote(who, src)):
                continue
            theirs = set().union(*(phrases(p.text) | phrases(p.raw) for p in src.pieces))
            if taken := sorted(missing & theirs):
                return f'"{taken[0]}" is what {src.author} said at #{seq}'
        return ""

    def _asked(self, text: str, srcs: Sequence[Source]) -> int | None:
        """The seq whose question the line turns into a statement, or None: a sentence of the
        line that neither asks nor says someone asked is best borne out by a question
        ("ケン 晩御飯は食べました" from "晩御飯はもう食べましたか？", "釣るやつです。" from
        "水風船って、釣るやつですか？": a model's lines)."""
        for mine in SENTENCE_END.split(text):
            line = read(mine, self.lang)
            if asks(mine) or not line.terms:
                continue
            best, seq, question = 0, None, False
            for s in srcs:
                for p in s.pieces:
                    for sentence in SENTENCE_END.split(p.text):
                        n = len(line.terms & read(sentence, self.lang).terms)
                        if n > best:
                            # "?" only: "チョコバナナでしょうか。", "攻めようかな" answer or muse
                            best, seq, question = n, s.seq, "?" in fold(sentence)[-3:]
            if question:
                return seq
        return None

    def _light_of(self, src: Source) -> frozenset[str]:
        return frozenset().union(
            *(read(t, self.lang).soft for p in src.pieces for t in (p.text, p.raw))
        )

    def _short_names(self, line: Reading) -> frozenset[str]:
        """Terms of the names a line calls people of the conversation by ("Kat")."""
        short = [n for n in line.names if any(same_person(name_key(n), k) for k in self.people)]
        return read(" ".join(short), "en").terms if short else frozenset()

    @property
    def threshold(self) -> float:
        return self.min_support if self.min_support is not None else MIN_SUPPORT[self.lang]

    def _best_part(self, line: Reading, src: Sequence[Source]) -> tuple[str, int | None]:
        """The kind of part that bears the line out best, and its message's seq."""
        best, kind, seq = -1.0, "", None
        order = {"narration": 3, "thought": 2, "speech": 1}
        for s in src:
            for p in s.pieces:
                one = Source(s.seq, s.author, s.role, (p,), s.day)
                share, _ = self._support(line, [one])
                if (share, order.get(p.kind, 0)) > (best, order.get(kind, 0)):
                    best, kind, seq = share, p.kind, s.seq
        return kind, seq

    def supported_by_witness(self, text: str) -> str | None:
        """Narration or a thought anywhere in the span that bears `text` out ("narration",
        "thought"), or None: a claim is confirmed only so. Stricter than a line's support: two
        terms at least, and the same polarity (a thought saying "he must not find out" does
        not confirm "I have never been here" for sharing the word "here")."""
        line = read(text, self.lang)
        want = line.terms - self._people_terms
        if len(want) < 2:
            return None
        for s in self.sources.values():
            for p in s.pieces:
                if p.kind not in WITNESS:
                    continue
                for sentence in SENTENCE_END.split(p.text):
                    r = read(sentence, self.lang)
                    have = r.terms | r.numbers
                    if r.negated != line.negated or len(want & have) < 2:
                        continue
                    if len(want & have) / len(want) >= self.threshold:
                        return p.kind
        return None

    # the check -----------------------------------------------------------------------------

    def check(self, st: Statement) -> Verdict:
        if not st.seqs and not st.span_wide:
            return self._locate(st)
        cited = [self.sources[s] for s in st.seqs if s in self.sources]
        if st.seqs and len(cited) < len(st.seqs):
            outside = [s for s in st.seqs if s not in self.sources]
            where = f"#{self.span[0]}–#{self.span[1]}" if self.span else "the span"
            return Verdict("seq", detail=f"#{outside[0]} is not a message of {where}")
        if not cited:  # a thread citing nothing: read against the whole span
            cited = list(self.sources.values())
        copied = self.prompt.copied(st.text) or (
            m.group(0) if (m := PLACEHOLDER.search(st.text)) else None
        )
        if copied:
            return Verdict("prompt", detail=f'"{copied}" is the prompt\'s text')
        line = read(st.text, self.lang)
        names = sorted(n for n in line.names if not self.known_name(n))
        if st.subject:
            names[:0] = sorted(
                n for n in read(st.subject, self.lang).names if not self.known_name(n)
            )
        if st.author and not self.known_name(st.author):
            names.insert(0, st.author)
        if names:
            return Verdict("name", detail=f"{names[0]} is not in the conversation")
        if st.author is not None and not any(self.wrote(st.author, s) for s in cited):
            return Verdict(
                "author", detail=f"{st.author} did not write #{cited[0].seq}", seqs=st.seqs
            )
        subject = self.about(st)
        if (
            subject
            and not st.span_wide
            and not any(self.wrote(subject, s) or self.told_of(subject, s) for s in cited)
        ):
            return Verdict("author", detail=f"#{cited[0].seq} is not by or about {subject}")
        if st.verbatim:
            needle = norm_text(st.text)
            if needle and any(needle in norm_text(p.text) for s in cited for p in s.pieces):
                return Verdict(None, 1.0, kind="speech", seqs=st.seqs)
            return Verdict("unsupported", detail="the words are not in the cited message")
        content = line.terms - self._people_terms - self._short_names(line)
        if (not content and not line.numbers) or carries_nothing(
            st.text, self.lang
        ):  # "Hey Kat! Good to see you!": true, and nothing a later reader could use
            return Verdict("empty", detail="it says nothing a later reader could use")
        v = self.judge(st, cited, self)
        if v.ok and not v.kind:  # a judge that says only whether: the part that bears it out
            kind, best = self._best_part(line, cited)
            v = replace(v, kind=kind, seqs=st.seqs, seq=best)
        return v

    def about(self, st: Statement) -> str | None:
        """Whom a line is about: the person of the conversation its subject (or, when it
        names no writer, the line itself) names first."""
        subject = self.subject(st.subject) if st.subject else None
        if subject is None and st.author is None:
            subject = self.subject(st.text)
        return subject

    def read(self, st: Statement, cited: Sequence[Source]) -> Verdict:
        """The word reader (`WORD_READER`): whether the line's content terms, numbers and
        negation stand in the cited messages, and what else words tell of it."""
        line = read(st.text, self.lang)
        subject = self.about(st)
        share, missing = self._support(line, cited)
        need = min(self.threshold, THREAD_SUPPORT) if st.kind == "thread" else self.threshold
        if share < need:
            why = f"#{cited[0].seq} does not say that ({missing})" if missing else ""
            return Verdict("unsupported", share, why or f"#{cited[0].seq} does not say that")
        # a thread may name what a question left open; any other line must not answer it
        if st.kind != "thread" and (asked := self._asked(st.text, cited)) is not None:
            return Verdict("unsupported", share, f"it tells as said what #{asked} asks")
        # words from a neighbour by someone else first: that says more than "reworded"
        if taken := self._borrowed(st.text, cited, st.author or subject):
            return Verdict("author", share, taken)
        speaker = st.author or st.subject  # "- Ken: Thanks, …": a heading's name, a bullet's
        if (
            speaker
            and first_person(st.text, speaker)
            and any(self.wrote(speaker, s) for s in cited)
            and (said := self._misquoted(st.text, speaker, cited))
        ):
            return Verdict("unsupported", share, said)
        kind, best = self._best_part(line, cited)
        if len(cited) > 1 and not st.span_wide and best is not None:
            # the line is stored citing that one message, so that one must bear it out: two
            # neighbours together bore out "Mika asked what kind of counseling she wanted
            # to pursue" from Samantha's question and Mika's answer
            alone, missing = self._support(line, [self.sources[best]])
            if alone < need:
                return Verdict("unsupported", alone, f"#{best} alone does not say that ({missing})")
            # several messages cited: whom the line names must be the one whose message
            # says it, not a neighbour ("Samantha shared a photo" borne out by Mika's)
            src = self.sources[best]
            who = st.author or subject
            if who and not (self.wrote(who, src) or (not st.author and self.told_of(who, src))):
                return Verdict("author", share, f"#{best} is not by or about {who}")
        return Verdict(None, share, kind=kind, seqs=st.seqs, seq=best)

    def _locate(self, st: Statement) -> Verdict:
        """A line that cites nothing is grounded only where one message of the span bears it
        out (the best three candidates are tried), and it cites that message from then on.
        The other checks still apply to what it then cites. Never two neighbours together:
        the line is stored citing one message, and Samantha's question beside Mika's answer
        bore out "Mika asked what kind of counseling she wanted to pursue"."""
        line = read(st.text, self.lang)
        found = []
        for i, seq in enumerate(sorted(self.sources)):
            share, _ = self._support(line, [self.sources[seq]])
            if share >= self.threshold:
                found.append((share, -i, seq))
        failed: Verdict | None = None
        for _, _, seq in sorted(found, reverse=True)[:3]:
            v = self.check(replace(st, seqs=(seq,)))
            if v.ok:
                return v
            failed = failed or v
        return failed or Verdict("seq", detail="it cites no message, and none says it")
