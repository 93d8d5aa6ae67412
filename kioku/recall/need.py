"""Recall by need: whether a turn wants the past, and how much of it (SPEC §7).

A recollection costs the turn its tokens: prefilled on that turn, and in a full window the room
a ready chapter must be folded for. Filling whatever room a question finds made every question
pay that, and in companion chat most questions are small talk ("do you watch films?"), not a
request for the past: in a Japanese companion chat at 16k, 133 turns each prefilled 2,000–3,800
tokens of excerpts that shared a word with the message and nothing more. So the past comes when the
turn gives evidence that it is wanted, and in the amount that evidence supports:

- **the message points at the past** (`cue`): "remember", "last week", "when did", 覚えてる,
  この前, っけ, 还记得, 上次, 기억나…, or a name the raw window and memory do not hold. Each
  language's words (cues, vocatives, honorifics and titles) are data (`kioku.lang`).
  - A question that does in words ("when did we…?", "what did you cook last week?", 覚えてる？)
    in what it asks (not in a sentence that tells: "I went hiking last Friday. How about
    you?") asks for the past outright: every window that shares its words is shown, best
    first, up to the room, unless the talk it answers holds as much ("how did they take it?"
    after the story). One that points by a tense alone and names no one, no time and no
    past the user shared ("How was it?", "Did you make it?", `at_hand`) asks about the talk
    it answers.
  - A statement that does ("I went back to that café from last spring"), or a question that
    names what the prompt does not hold, is shown what stands out, on weaker evidence
    (`Profile.recall_cued_relevance`). A name alone is weaker evidence (a capitalized word may
    be new, not old).
  - A statement that does not is shown nothing, whatever it shares with the archive: it asks
    nothing, and what it is shown stays in front of it, in the window, until the next fold
    (in an English chat at 8k, in process, those recollections cost 0.007 of prefix reuse).
- **whom a question asks about** (`about`). One that names someone ("what has Samantha
  painted?", "how's Oliver?", ハナコさんは？), not the one it speaks to ("…, Kat?"), asks what
  the conversation knows of them: it is shown the windows that name them (in what was said, or
  as the speaker: "Kat" is Katherine), best first, up to the room, held back only when the talk
  it answers holds as much as the best of them. A name no window names was never spoken of
  ("Do you watch Netflix?" with no Netflix in the archive had been shown every window sharing
  "watch"): it is no one the conversation knows, and no pointer at the past either. One that
  names no one asks the one it speaks to about the talk at hand ("Got any fav tunes?", ご趣味は？): it
  is shown the few windows that stand out most (`SMALL_TALK_HITS`, none under
  `SMALL_TALK_FALLOFF` of the best one's score) and makes no room for them (`Need.makes_room`).
  Questions written to test a memory name whom they ask about almost always, questions in
  chat seldom (`tests/cases/need*.jsonl`); in an English chat at 8k, questions to the one
  spoken to had taken
  25 windows each ("Did you see that band?") and cost 0.0035 of prefix reuse.
- **retrieval's own evidence**, for a question that does not point at the past ("what books
  do you like?"). The background is the median score of the search's best
  `BACKGROUND_HITS` windows (those that matched nothing count 0): what a window gets for sharing
  the message's common words. Words every window shares (a name, "ですか") lift every window
  alike, so they lift the background too. The best hit must stand `Profile.recall_standout`
  times above it and hold `Profile.recall_relevance` of the message's meaning
  (`archive.Hit.relevance`).
- **what is already visible** is neither evidence nor shown. A hit whose line the raw window
  says again, a carried recollection shows or memory quotes is passed over (`judge`'s `seen`).
  When the raw window's own best match holds `Profile.recall_in_view` of what the archive's
  best holds, the message is about what the window shows. For a question that match is looked
  for among the newest `Profile.recall_present` messages, the talk it answers ("got any
  favourite tunes?" after a talk of music); something said long ago but still in the window
  does not hold a question back, which wants the older mentions too.
- **sized by the evidence.** Recollections are taken best first while they stand above the
  background, and stop where the scores fall into it, not where the room ends (a question
  about the past or about someone excepted: it asked).

`judge` is pure: `kioku.layers.Layers` searches, calls it and builds the recollections it
names; the engine makes room for the best of them (a ready chapter folds: `policy.State.recall`)
and the turn's account keeps its `why` (`Need.note`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

from kioku.lang import EN, WORDS
from kioku.salience import is_question, said_sentences

if TYPE_CHECKING:  # the archive pulls in bm25s (and scipy): not at import
    from kioku.recall.archive import Hit
    from kioku.recall.recollection import Recollection

BACKGROUND_HITS = 50  # the hits a search returns: "the background" is their median score
# A question about the talk at hand is shown the few hits that stand out most, never less than
# this share of the best one's score; it makes no room for them (`Need.makes_room`)
SMALL_TALK_HITS = 3
SMALL_TALK_FALLOFF = 0.5
MAX_LIFT = 99.0  # a hit among windows that match nothing stands out without measure
# a name is a capitalized word inside a sentence: what "I", sentence starts and a message's
# first word would confuse for one is left out
_NAME = re.compile(
    r"(?<![.!?]\s)(?<![.!?][\"'”’)]\s)(?<![.!?]\s[\"'“‘(])(?<!^)(?<!^[\"'“‘(])"
    r"\b(?:[A-Z][a-z]{2,}|[A-Z][a-z]+[A-Z][a-z]+)\b"
)  # McGee too; not a sentence's first word, after a closing quote either
# whom a message speaks to by name ("…, Kat?", "Thanks, Katherine!", "Hey Mika, …"): not
# whom it asks about
_VOCATIVE = re.compile(
    rf"(?:,\s*|\b(?i:{'|'.join(EN.vocatives)})\s+)"
    r"([A-Z][a-z]+(?:[A-Z][a-z]+)?)(?=\s*(?:[,!?.]|$))"
)
# where a script has no capitals, a name is told by its honorific or title (ハナコさん, 王老师):
# each language's patterns, those of a script only it writes in any conversation
_HONORIFIC = re.compile(
    "|".join(p for x in WORDS.values() if x.names_in_any_conversation for p in x.name_patterns)
)
_HONORIFICS_BY_LANG: Mapping[str, re.Pattern[str]] = {
    x.code: re.compile("|".join(x.name_patterns))
    for x in WORDS.values()
    if x.name_patterns and not x.names_in_any_conversation
}
_HONORIFIC_END = re.compile(
    " ?(?:" + "|".join(s for x in WORDS.values() for s in x.name_suffixes) + ")$"
)
_TENSE = re.compile(EN.past_tense, re.IGNORECASE)
# days and months are capitalized, and name no one ("Tues", "last Friday" is a time cue)
_DAY_WORDS = tuple(d.lower() for d in (*EN.months, *EN.weekdays))
_DAYS = frozenset([*_DAY_WORDS, *(d[:3] for d in _DAY_WORDS), *EN.day_abbreviations])
_SHARED = re.compile(rf"\b{EN.shared_past}\b", re.IGNORECASE)  # a past the user shared
_POINTER = re.compile(rf"\b(?:{EN.past_cues})\b", re.IGNORECASE)
# each language's words that point at the past (`kioku.lang`); English's are words, and a
# past tense in a question is one too (`at_hand` tells when it points at the talk at hand)
_CUES: Mapping[str, re.Pattern[str]] = {
    "en": re.compile(rf"\b(?:{EN.past_cues}|{EN.past_tense})\b", re.IGNORECASE),
    **{x.code: re.compile(x.past_cues) for x in WORDS.values() if x.code != "en" and x.past_cues},
}


def cue(text: str, lang: str = "en") -> str:
    """The words of `text` that point at the past ("" when none): every language's patterns
    are tried, the conversation's first (a Japanese chat may quote an English line)."""
    for name in (lang, *(n for n in _CUES if n != lang)):
        pattern = _CUES.get(name)
        if pattern is not None and (m := pattern.search(text.strip())):
            return m.group(0)
    return ""


def names(text: str) -> tuple[str, ...]:
    """Capitalized words inside a sentence: the people and places an English message names."""
    return tuple(n for n in dict.fromkeys(_NAME.findall(text.strip())) if n.lower() not in _DAYS)


@dataclass(frozen=True)
class Need:
    """Whether a turn wants the past, why, and the hits it wants shown (best first)."""

    on: bool
    why: str
    cue: str = ""  # what in the message points at the past
    hits: tuple[Hit, ...] = ()
    background: float = 0.0  # the median score of the search's best hits
    standout: float = 0.0  # the best unseen hit's score ÷ the background (0: none)
    # a ready chapter folds for the best of them when the turn has no room (a cache break): not
    # for a question about the talk at hand, which takes what room there is
    makes_room: bool = True

    @classmethod
    def off(cls, why: str) -> Need:
        return cls(False, why)

    def note(self, got: Iterable[tuple[int, int]] = (), tokens: int = 0) -> dict[str, Any]:
        """The turn's account of recall (kept with the message, shown by the console)."""
        out: dict[str, Any] = {"on": self.on and tokens > 0, "why": self.why}
        if self.cue:
            out["cue"] = self.cue
        if self.standout:
            out["standout"] = round(self.standout, 2)
        ranges = [list(r) for r in got]
        if ranges:
            out["got"] = ranges
            out["tokens"] = tokens
        elif self.on:
            out["why"] = f"{self.why}; nothing shown (no room, or all of it in view)"
        return out


@lru_cache(maxsize=4096)
def _pointing(text: str, lang: str) -> str:
    return cue(text, lang)


STATEMENT = "a statement that does not point at the past: it asks nothing of it"


def _asked(text: str) -> list[str]:
    """The sentences of a message that ask (its last when none does), without role-play
    narration between asterisks or the quotes a sentence opens on."""
    sentences = said_sentences(text)
    return [x for x in sentences if is_question(x)] or sentences[-1:]


def about(text: str, lang: str = "en") -> str:
    """Whom a question asks about by name ("" when no one): the first person its question
    sentences name besides the one it speaks to. "What has Samantha painted?" asks about
    Samantha; "Wow, Kat! Any more paintings coming up?" asks Kat about the talk at hand, and
    "*hugs Rowan* Are you okay?" asks her, the name being in its narration."""
    return next(iter(_named_in(_asked(text), lang)), "")


def _named_in(asked: list[str], lang: str = "en") -> list[str]:
    """Everyone the asking sentences name besides the one they speak to, first named first
    ("Which city in Ireland will Oliver stay in?": Ireland, Oliver)."""
    out: list[str] = []
    for x in asked:
        spoken_to = set(_VOCATIVE.findall(x))
        out += [n for n in names(x) if n not in spoken_to and n not in out]
        out += [m for m in _HONORIFIC.findall(x) if m not in out]
        if own := _HONORIFICS_BY_LANG.get(lang):
            out += [m for m in own.findall(x) if m not in out]
    return out


def at_hand(text: str, said: str) -> bool:
    """Whether a question that points at the past by a tense alone (`said`: its cue, "what
    did", "how was") asks about the talk it answers: it names no one and no time, and the past
    is not one the user shared ("did we", "have I"). "How was it?", "Where did you find it?",
    "What was the best part? Do you do it often with the kids?" are; "What did Mika
    paint?", "When did we fly the kite?", "What did you cook last week?" are not."""
    return _by_tense_alone(text, said) and not about(text)


def _by_tense_alone(text: str, said: str) -> bool:
    """`said` is a tense ("what did"), and nothing else in `text` names a time, a memory or a
    past the user shared."""
    return bool(_TENSE.fullmatch(said)) and not _POINTER.search(text) and not _SHARED.search(text)


def pointer(text: str, lang: str, holds: Callable[[str], bool]) -> str:
    """What in `text` points at the past: its cue, or else the first name `holds` says the
    prompt does not hold ("" when nothing does). A statement without one is shown nothing
    (`STATEMENT`), so the caller may ask this before it searches."""
    return _pointing(text, lang) or _unheld_name(text, holds)


def _unheld_name(text: str, holds: Callable[[str], bool]) -> str:
    spoken_to = set(_VOCATIVE.findall(text))  # whom it speaks to is no pointer at the past
    return next((n for n in names(text) if n not in spoken_to and not holds(n)), "")


def _bare(name: str) -> str:
    """The name as a message says it of someone: ハナコさん is spoken of as ハナコ too."""
    return _HONORIFIC_END.sub("", name)


def _named(hits: Sequence[Hit], who: Sequence[str], names: Callable[[Hit, str], bool]) -> bool:
    """Some window among `hits` names one of `who`."""
    return any(h.score > 0 and any(names(h, n) for n in who) for h in hits)


def judge(
    text: str,
    hits: Sequence[Hit],
    *,
    seen: Callable[[Hit], bool],
    holds: Callable[[str], bool],
    lang: str,
    relevance: float,
    cued_relevance: float,
    standout: float,
    in_view_share: float,
    limit: int,
    in_view: float = 0.0,
    asks: bool = False,
    names: Callable[[Hit, str], bool] | None = None,
) -> Need:
    """Decide from `hits` (the archive's best for the message `text`, best first) whether the
    past is wanted, and which hits to show. `seen(hit)`: the prompt already shows the hit's
    line; `holds(name)`: the raw window or memory names it; `in_view`: the share of the
    message's meaning the raw window's own best match holds (for a question, its newest
    messages'); `asks`: the message is a user's question (`kioku.context.asks_something`);
    `names(hit, name)`: the hit's window names `name` (in what was said, or as who said it).
    What the conversation knows of someone a question names is in the windows that name
    them: a name none of the hits holds ("Do you watch Netflix?", never spoken of) asks about
    the talk at hand, and a named question's matches are the windows that name them."""
    asked = _asked(text) if asks else []
    named = _named_in(asked, lang)
    whom = named[0] if named else ""
    # a window that names any of them holds what the conversation knows of whom it asks
    # about: "Which city in Ireland will Oliver stay in?" is answered where Oliver names the city
    them = [_bare(n) for n in named]
    if whom and names is not None and not _named(hits, them, names):
        whom = ""
    worded = _pointing(text, lang)
    if (
        worded
        and asks
        and (_by_tense_alone(text, worded) and not whom or not _pointing(" ".join(asked), lang))
    ):
        # "How was it?": a tense, not a pointer (`at_hand`); "I went hiking last Friday. How
        # about you?": the past is told, what it asks is about the talk at hand
        worded = ""
    unheld = _unheld_name(text, holds)
    if unheld and names is not None and not _named(hits, [_bare(unheld)], names):
        unheld = ""  # no window names it either: no past the conversation has
    pointed = worded or unheld
    # a question that names no one and points at no past asks whom it speaks to about the
    # talk at hand ("Got any fav tunes?", ご趣味は？): the few hits that stand out most
    chat = asks and not pointed and not whom
    if not asks and not pointed:
        return Need.off(STATEMENT)
    if not hits:
        return Need.off("the archive holds nothing like it")
    scores = [h.score for h in hits[:BACKGROUND_HITS]]
    scores += [0.0] * (BACKGROUND_HITS - len(scores))  # windows that matched nothing
    background = statistics.median(scores)
    floor = cued_relevance if pointed else relevance
    fresh = (h for h in hits if not seen(h))
    best = next(fresh, None)
    if best is None:
        return Need(False, "what it finds is in view already", pointed, background=background)
    lift = min(best.score / background, MAX_LIFT) if background > 0 else MAX_LIFT
    # it asks for the past in words, or what the conversation knows of someone it names: any
    # window that shares its words may hold the answer (of someone named, any that names
    # them), unless the talk it answers holds as much (of someone named, as much as the best
    # of those: "How's Oliver?" after news of him)
    if whom and not worded and names is not None:
        # the unseen hits, from the best on (those before it were all seen)
        theirs = (h for h in chain((best,), fresh) if h.score > 0 and _named([h], them, names))
        first = next(theirs, None)
        if first is None:
            why = f"what it finds of {whom!r} is in view already"
            return Need(False, why, pointed, background=background)
        best, fresh = first, theirs
    if asks and (worded or whom) and in_view < (1.0 if whom else in_view_share) * best.relevance:
        matched = (best, *islice((h for h in fresh if h.score > 0), limit - 1))
        subject = f"the past ({worded!r})" if worded else repr(whom)
        why = f"it asks about {subject}; {len(matched)} match"
        return Need(True, why, pointed, matched, background, lift)
    if best.relevance < floor or lift < standout:
        why = (
            f"nothing stands out: the best holds {best.relevance:.2f} of the message's "
            f"meaning, {lift:.1f}× the background"
        )
        return Need(False, why, pointed, background=background, standout=lift)
    if in_view >= in_view_share * best.relevance:
        why = (
            f"the raw window holds it: {in_view:.2f} of the message's meaning, the archive's "
            f"best {best.relevance:.2f}"
        )
        return Need(False, why, pointed, background=background, standout=lift)
    # sized by the evidence: hits are taken, best first, while they stand above the
    # background; where the scores fall into it, recollections stop (not where room ends)
    most, least = (
        (min(limit, SMALL_TALK_HITS), SMALL_TALK_FALLOFF * best.score) if chat else (limit, 0)
    )
    taken: list[Hit] = [best]
    for h in fresh:
        if len(taken) >= most or h.score <= background or h.score < least:
            break
        taken.append(h)
    why = f"{len(taken)} stand out ({lift:.1f}× the background)"
    if pointed:
        why = f"it points at the past ({pointed!r}); {why}"
    elif chat:
        why = f"it asks about the talk at hand: the {why}"
    return Need(True, why, pointed, tuple(taken), background, lift, makes_room=not chat)


@dataclass(frozen=True)
class Recall:
    """What the recall layer gives a turn: its decision, and the recollections it names (best
    first, each counted: `tokens` is what they take together, before the room is known)."""

    need: Need
    recollections: tuple[Recollection, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.recollections)

    @property
    def least(self) -> int:
        """What the best recollection takes: the room the turn needs for any recall at all."""
        return self.recollections[0].tokens if self.recollections else 0
