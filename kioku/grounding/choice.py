"""What a grounded record keeps within its target: the model's lines and the lines it could
have kept instead, chosen together.

`choose` weighs a record's grounded lines (`drafted`: each at the cost of its rendering) with a
chapter's messages (`span_candidates`) or a synopsis's folded items, by the extractive
selector (`summarizer.select_lines`); a model's copy of a message gives way to the message, a
thread that copies a message is left out, and one note stands per thread. `trim` leaves out
the least informative whole lines of a record over its target.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from difflib import SequenceMatcher
from typing import Any

from kioku.grounding.records import item_of_line
from kioku.grounding.terms import read
from kioku.messages import LogEntry
from kioku.scenes import Scene, marker, scene_of
from kioku.structure import (
    Claim,
    Event,
    KeyLine,
    Record,
    RecordLine,
    ThreadNote,
    UserFact,
    norm_text,
    who_and_what,
)
from kioku.summarizer import Line, attributed_lines, select_balanced, select_lines, split_sentences
from kioku.tokens import TokenCounter


@dataclass(frozen=True)
class _Drafted(Line):
    """A record's line as the selection weighs it: its words, at the cost of its rendering."""

    shown: str = ""

    def render(self) -> str:
        return self.shown


Item = RecordLine
_TRACKS = ("events", "claims", "user_facts", "key_lines")


def item_text(it: Item) -> str:
    return who_and_what(it)[1]


def drafted(
    record: Record, lang: str, scenes: Mapping[int, Scene] | None = None
) -> list[tuple[Item, Line]]:
    """Every line of a record, each as a `Line` that costs what its rendering costs."""
    from kioku.rendering import quote, render_claim, render_labels

    lab = render_labels(lang)
    starts = sorted(scenes or {})
    out: list[tuple[Item, Line]] = []
    for kind in _TRACKS:
        for it in getattr(record, kind):
            seq = it.seq if it.seq is not None else -1
            at = f"- #{seq} " if seq >= 0 else "- "
            who, text = who_and_what(it)
            if isinstance(it, Claim):
                shown = at + render_claim(it, lab)
            elif isinstance(it, KeyLine):
                shown = quote(it.seq, who, text)
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
    `select_balanced`). A model's line that restates a message in more words, or says
    less than the message it cites, loses its place to that message; a short line that sums
    up many is picked before any of them. Measured with a local model on an English chat, its lines
    alone answered fewer questions than the extractive chapter in the same room
    (`docs/chronicler.md`). Threads that name a storyline stay. Returns the record, the items added,
    and how many of the model's lines were left out."""
    from kioku.rendering import render_labels, render_threads

    known = scenes or {}
    drafts = drafted(record, lang, known)
    mine, theirs = _unrepeated(drafts, candidates, lang, stored=bool(groups))
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
    """A sentence without the writer's name put in front of their words ("アキ マルタイ！")."""
    if who and sentence.startswith(who):
        return sentence[len(who) :].lstrip(" 　:：、,は")
    return sentence


def _unrepeated(
    mine: Sequence[tuple[Item, Line]],
    theirs: Sequence[tuple[Item, Line]],
    lang: str,
    stored: bool = False,
) -> tuple[list[tuple[Item, Line]], list[tuple[Item, Line]]]:
    """The model's lines and the candidates with each thing said once. A model line each of
    whose sentences is a line of its message copied (a model may copy whole messages as
    "facts") gives way to those lines, which the selection then weighs one by one; a
    candidate the model's kept line of the same message mostly says is left out. A model's
    story line that mostly says what its message's lines say gives way to them as well, and
    in a synopsis (`stored`: the candidates are memory's lines) any model line does: in
    one English chat a model's synopsis restated lines and so pushed out "Been busy
    volunteering at the homeless shelter", which the extractive synopsis of the same
    chapters kept, and in another its retelling of #72 in a chapter pushed out #70's "They
    talked about different therapeutic methods". So does a claim the story neither bears out
    nor belies: a speaker's words are as much their claim, in less room. In a chapter, a line
    gives way only where the fewest of its message's lines that say as much are no longer
    (`_cover`): a short line that sums up a long message stays. A fact about the user stays:
    it says in the third person what the message says in the first ("Ren starts a new job")."""
    from kioku.salience import content_words

    said: dict[int, list[str]] = {}
    for _, ln in theirs:
        said.setdefault(ln.seq, []).append(ln.text)
    kept: list[tuple[Item, Line]] = []
    for it, ln in mine:
        lines = said.get(ln.seq, [])
        sentences = [_unnamed(x, ln.speaker) for x in split_sentences(ln.text)]
        copy = sentences and all(any(_copied(x, y) for y in lines) for x in sentences)
        mostly = stored or isinstance(it, (Event, Claim))
        if mostly and not copy and (words := content_words(ln.text, lang)):
            cover = _cover(words, lines, lang)
            # a short line that sums up a long message says it in less room: it stays
            copy = cover is not None and (stored or len(ln.render()) >= sum(map(len, cover)))
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


def _cover(words: frozenset[str], lines: Sequence[str], lang: str) -> list[str] | None:
    """The fewest of `lines` that hold `_COPIED` of `words`, the most telling first; None
    when all of them together do not."""
    from kioku.salience import content_words

    held = {y: words & content_words(y, lang) for y in lines}
    cover: list[str] = []
    got: frozenset[str] = frozenset()
    while len(got) < _COPIED * len(words):
        best = max(held, key=lambda y: (len(held[y] - got), -len(y)), default=None)
        if best is None or not held[best] - got:
            return None
        cover.append(best)
        got |= held.pop(best)
    return cover


def _storylines(
    threads: Sequence[ThreadNote], candidates: Sequence[tuple[Item, Line]]
) -> tuple[ThreadNote, ...]:
    """The threads that name a storyline: one whose title is a line of its message copied (a
    model wrote eight such "threads" for one chapter, and threads always stay) is left
    for that line to compete with the others. A title in the message's words is no copy."""
    said: dict[int, list[str]] = {}
    for _, ln in candidates:
        said.setdefault(ln.seq, []).append(ln.text)
    everything = [x for xs in said.values() for x in xs]

    def copy(t: ThreadNote) -> bool:
        lines = said.get(t.seq, []) if t.seq is not None else everything
        sentences = [_SAID_BY.sub("", x) for x in split_sentences(t.title)]
        return bool(sentences) and all(any(_copied(x, y) for y in lines) for x in sentences)

    return tuple(t for t in threads if not copy(t))


_SAID_BY = re.compile(r"^[^:：\s]{1,24}\s*[:：]\s*")  # "Rosa: It's a wild ride": her words


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
    titles: set[str] = set()
    kept = []
    for t in out.values():  # two ids, one note ("DONE 2: …", "DONE 5: …"): one storyline
        if (title := norm_text(t.title).casefold()) not in titles:
            titles.add(title)
            kept.append(t)
    return tuple(kept)


def _with_items(record: Record, items: Sequence[Item]) -> Record:
    """The record's threads with these lines, each in its track, once."""
    tracks: dict[type, list[Any]] = {Event: [], Claim: [], UserFact: [], KeyLine: []}
    seen: set[tuple[type, int | None, str]] = set()
    for it in items:
        key = (type(it), it.seq, norm_text(who_and_what(it)[1]))
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
    a model wrote; asking it to compress them again costs a request and came back worse
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
