"""The machinery of a scripted story: beats at fixed places, filler between them, a tic that creeps.

A language module (`en`, `ja`) supplies a `Script`: the cast, the planted beats (each with the
questions it answers) and a `Filler` that writes ordinary evenings. `compose(script, messages,
seed)` lays the beats at their fractions of the conversation, fills the days between them with
chat drawn from a seeded `random.Random`, and returns a `Transcript` whose `info` lists the planted
facts with the seq of every message that holds their answer. Nothing here reads the clock or the
environment: the same arguments give the same conversation, byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kioku.datasets import Transcript
from kioku.errors import InputError
from kioku.messages import Message, Part

MIN_MESSAGES = 120  # below this the beats would crowd each other out


@dataclass(frozen=True)
class Question:
    """A question a planted beat answers; `where` says which message of the beat holds the
    answer: "user" or "reply" of exchange `exchange`."""

    id: str
    question: str
    answer: str
    kind: str  # user-fact | character-fact | claim | truth | promise | event
    exchange: int = 0
    where: str = "user"


@dataclass(frozen=True)
class Beat:
    """One planted moment: a few exchanges (user text, character reply parts) at a fraction of
    the conversation."""

    id: str
    at: float
    exchanges: tuple[tuple[str, tuple[Part, ...]], ...]
    questions: tuple[Question, ...] = ()


@dataclass(frozen=True)
class Cast:
    user: str
    character: str
    system_prompt: str
    lang: str
    start: datetime
    tic: str  # the phrase that creeps into the character's speech
    tic_from: float = 0.3  # fraction of the conversation where it starts
    tic_max: float = 0.65  # share of replies that carry it at the end


class Filler:
    """Writes ordinary chat between the beats (`kioku.story.engine.TableFiller` writes it from a
    language module's phrase tables)."""

    def day_open(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        raise NotImplementedError

    def exchange(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        raise NotImplementedError

    def day_close(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        raise NotImplementedError


@dataclass(frozen=True)
class Script:
    cast: Cast
    beats: tuple[Beat, ...]
    filler: Filler
    exchanges_per_day: tuple[int, int] = (5, 11)


@dataclass
class _Writer:
    cast: Cast
    target: int
    messages: list[Message] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    clock: datetime = datetime(2000, 1, 1)

    def add(self, user: str, parts: Sequence[Part], day: int, beat: str | None, tic: bool) -> None:
        self.clock += timedelta(minutes=1)
        self.messages.append(Message("user", (Part("text", user),), self.cast.user, self.clock))
        self.meta.append({"day": day, "beat": beat})
        if tic:
            parts = add_tic(parts, self.cast)
        self.clock += timedelta(minutes=2)
        self.messages.append(Message("assistant", tuple(parts), self.cast.character, self.clock))
        self.meta.append({"day": day, "beat": beat})


def add_tic(parts: Sequence[Part], cast: Cast) -> tuple[Part, ...]:
    """The tic closes the character's last speech part (a reply without speech gets none)."""
    out = list(parts)
    for i in range(len(out) - 1, -1, -1):
        p = out[i]
        if p.kind == "speech":
            text = p.text.rstrip()
            sep = "" if cast.lang == "ja" else " "
            out[i] = Part("speech", f"{text}{sep}{cast.tic}", p.speaker)
            break
    return tuple(out)


def tic_share(position: float, cast: Cast) -> float:
    """How many replies carry the tic at this point: none before `tic_from`, then a ramp."""
    if position <= cast.tic_from:
        return 0.0
    return cast.tic_max * min(1.0, (position - cast.tic_from) / (1.0 - cast.tic_from))


def compose(script: Script, messages: int, seed: int = 0) -> Transcript:
    if messages < MIN_MESSAGES:
        raise InputError(f"a story needs at least {MIN_MESSAGES} messages, not {messages}")
    rng = random.Random(f"kioku-story/{script.cast.lang}/{seed}")
    cast = script.cast
    w = _Writer(cast, messages, clock=cast.start)
    beats = sorted(script.beats, key=lambda b: b.at)
    placed: dict[str, int] = {}  # beat id -> seq of its first message
    day = 0
    lo, hi = script.exchanges_per_day
    next_beat = 0

    def position() -> float:
        return len(w.messages) / messages

    def tic() -> bool:
        return rng.random() < tic_share(position(), cast)

    def place_due() -> None:
        nonlocal next_beat
        while next_beat < len(beats) and beats[next_beat].at <= position():
            b = beats[next_beat]
            placed[b.id] = len(w.messages)
            for user, parts in b.exchanges:
                w.add(user, parts, day, b.id, False)
            next_beat += 1

    while len(w.messages) < messages - 1 or next_beat < len(beats):
        day += 1
        w.clock = cast.start + timedelta(days=day - 1, minutes=rng.randrange(0, 180))
        if day == 1 and beats and beats[0].at <= 0.0:
            place_due()  # the story opens on its first beat (the meeting), not on a greeting
        else:
            user, parts = script.filler.day_open(rng, day)
            w.add(user, parts, day, None, tic())
        for _ in range(rng.randint(lo, hi)):
            place_due()
            if len(w.messages) >= messages - 2:
                break
            user, parts = script.filler.exchange(rng, day)
            w.add(user, parts, day, None, tic())
        place_due()
        if len(w.messages) < messages - 1:
            user, parts = script.filler.day_close(rng, day)
            w.add(user, parts, day, None, tic())
    questions = []
    for b in beats:
        first = placed[b.id]
        for q in b.questions:
            seq = first + 2 * q.exchange + (0 if q.where == "user" else 1)
            questions.append(
                {
                    "id": q.id,
                    "question": q.question,
                    "answer": q.answer,
                    "kind": q.kind,
                    "beat": b.id,
                    "evidence": [seq],
                }
            )
    _merge_evidence(questions)
    return Transcript(
        messages=tuple(w.messages),
        meta=tuple(w.meta),
        user=cast.user,
        character=cast.character,
        system_prompt=cast.system_prompt,
        lang=cast.lang,
        info={
            "story": f"kioku-story/{cast.lang}",
            "seed": seed,
            "days": day,
            "beats": placed,
            "questions": questions,
            "tic": cast.tic,
        },
    )


def _merge_evidence(questions: list[dict[str, Any]]) -> None:
    """Two beats may answer one question (a promise made and kept): one question, both seqs."""
    by_id: dict[str, dict[str, Any]] = {}
    out = []
    for q in questions:
        if q["id"] in by_id:
            by_id[q["id"]]["evidence"].extend(q["evidence"])
            continue
        by_id[q["id"]] = q
        out.append(q)
    questions[:] = out


Speech = Callable[[str], Part]


def speech(speaker: str) -> Speech:
    return lambda text: Part("speech", text, speaker)


def narration(text: str) -> Part:
    return Part("narration", text)


def thought(speaker: str, text: str) -> Part:
    return Part("thought", text, speaker)
