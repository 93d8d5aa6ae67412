"""Scenes: where one dialogue ends and another begins, and the line memory marks it with.

A long timeline is rarely one sitting. A conversation may be sessions weeks apart; a speaker's
timeline may join fifty partners, one after another. Memory that runs
their lines together reads as if everyone talked at once on one day. A new scene starts on a
new day, after a long pause, when someone joins who was not in the current dialogue, or where
the data names a new dialogue (a message's `dialogue_id` or `session` meta); memory
writes a marker there with the date and who is talking (`— 8 May 2023 · Mika,
Samantha —`) in front of the scene's first line, so a reader keeps who, what and when.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kioku.dates import day_text
from kioku.messages import LogEntry

SCENE_GAP_S = 3600.0  # a pause this long starts a new scene even on the same day
DIALOGUE_KEYS = ("dialogue_id", "session")  # message meta that names a dialogue
MARK = "—"
NEW_SCENE = {"en": "new scene", "ja": "場面転換", "zh": "新场景"}
_JOIN = {"en": ", ", "ja": "、", "zh": "、"}
_SEP = {"ja": "・", "zh": "・"}  # between a marker's parts; " · " where a language has none


@dataclass(frozen=True)
class Scene:
    first_seq: int
    at: datetime | None
    who: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.first_seq,
            "at": self.at.isoformat() if self.at else None,
            "who": list(self.who),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Scene | None:
        try:
            at = datetime.fromisoformat(d["at"]) if d.get("at") else None
            return cls(int(d["seq"]), at, tuple(str(w) for w in d.get("who") or ()))
        except (KeyError, TypeError, ValueError):
            return None


def _gap(a: datetime, b: datetime) -> float | None:
    if (a.tzinfo is None) != (b.tzinfo is None):
        return None
    return (b - a).total_seconds()


def scenes(entries: Sequence[LogEntry]) -> list[Scene]:
    """The scenes of a range of messages, in order; each message belongs to the last scene
    that starts at or before its seq."""
    out: list[Scene] = []
    first = -1
    start: datetime | None = None
    who: list[str] = []
    previous: datetime | None = None
    dialogue: Any = None
    for e in entries:
        m = e.message
        if m.role not in ("user", "assistant") or m.is_empty():
            continue
        author = m.author or m.role
        at = m.at
        new = first < 0
        # a dataset names its dialogues (back-to-back chats with new partners, sessions)
        named = next((e.meta[k] for k in DIALOGUE_KEYS if e.meta and k in e.meta), None)
        if not new and named is not None and dialogue is not None and named != dialogue:
            new = True
        dialogue = named if named is not None else dialogue
        if not new and at is not None and previous is not None:
            gap = _gap(previous, at)
            new = previous.date() != at.date() or (gap is not None and gap >= SCENE_GAP_S)
        if not new and author not in who and len(who) >= 2:
            new = True  # someone who was not in this dialogue: another partner
        if new:
            if first >= 0:
                out.append(Scene(first, start, tuple(who)))
            first, start, who = e.seq, at, []
        if author not in who:
            who.append(author)
        previous = at or previous
    if first >= 0:
        out.append(Scene(first, start, tuple(who)))
    return out


def scenes_in(data: Mapping[str, Any] | None) -> dict[int, Scene]:
    """The scenes a memory item's data carries (`data["scenes"]`), by first seq."""
    rows = data.get("scenes") if isinstance(data, Mapping) else None
    out: dict[int, Scene] = {}
    for r in rows if isinstance(rows, list) else ():
        sc = Scene.from_json(r) if isinstance(r, Mapping) else None
        if sc is not None:
            out[sc.first_seq] = sc
    return out


def scenes_of(seqs: Iterable[int | None], known: Mapping[int, Scene]) -> list[Scene]:
    """The scenes of `known` that the seqs fall in, in order: what an item keeps in its data."""
    starts = sorted(known)
    used = {scene_of(s, starts) for s in seqs if s is not None}
    return [known[k] for k in starts if k in used]


def marked(
    rows: Iterable[tuple[int | None, str]], known: Mapping[int, Scene], lang: str = "en"
) -> list[str]:
    """Rows in the order given, the first of each scene preceded by the scene's marker on a line
    of its own (a row without a seq gets none): a model's lines keep their date and who was
    talking the way the extractive chronicler's do."""
    starts = sorted(known)
    out: list[str] = []
    before: Scene | None = None
    current: int | None = None
    for seq, text in rows:
        start = scene_of(seq, starts) if seq is not None else None
        if start is not None and start != current:
            out.append(marker(known[start], before, lang))
            before, current = known[start], start
        out.append(text)
    return out


def scene_of(seq: int, starts: Sequence[int]) -> int | None:
    """The first seq of the scene `seq` belongs to (`starts` ascending)."""
    found = None
    for s in starts:
        if s > seq:
            break
        found = s
    return found


def marker(scene: Scene, before: Scene | None, lang: str = "en") -> str:
    """The line that opens a scene in memory: its date (and time when the scene before was on
    the same day), and who talks when they are not the same people as in the scene before."""
    parts = []
    if scene.at is not None:
        when = day_text(scene.at.date(), lang)
        if before is not None and before.at is not None and before.at.date() == scene.at.date():
            when += f" {scene.at:%H:%M}"
        parts.append(when)
    if scene.who and (before is None or set(before.who) != set(scene.who)):
        parts.append(_JOIN.get(lang, ", ").join(scene.who))
    if not parts:
        parts.append(NEW_SCENE.get(lang, NEW_SCENE["en"]))
    sep = _SEP.get(lang, " · ")
    return f"{MARK} {sep.join(parts)} {MARK}"
