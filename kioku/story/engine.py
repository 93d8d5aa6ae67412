"""The filler engine shared by the language modules: evenings of chat written from phrase tables.

A language module describes its ordinary chat as data, a `Phrases`: the character's stage
business, her thoughts, the reactions that open a line, and a `Topic` per subject of small talk.
A topic names the tables it draws from (in the order the draws are made), a template or a choice
of templates for the user's line and for the reply. `TableFiller` turns that into the `Filler` the
composer calls. The order of the draws is part of the story: the same seed gives the same chat only
while every `rng` call happens in the same order.

Templates are `str.format` strings over the drawn names, with three extra conversions: `!c`
capitalizes (`str.capitalize`), `!u` upper-cases the first letter only, `!p` closes with a full
stop unless the text already ends with one.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kioku.messages import Part
from kioku.story.script import Beat, Filler, Question, narration, speech, thought

# A draw: the name a template uses for the pick (a tuple of names unpacks a tuple pick) and the
# table it is picked from.
Draw = tuple[str | tuple[str, ...], Sequence[Any]]
# A template, or a choice of templates (one `rng.choice`).
Lines = str | Sequence[str]


def q(id: str, question: str, answer: str, kind: str, where: str = "user", exchange: int = 0):
    """A planted question; `where` is "user" or "reply" of exchange `exchange` of its beat."""
    return Question(id, question, answer, kind, exchange, where)


def beat(id: str, at: float, user: str, reply: tuple[Part, ...], *questions: Question) -> Beat:
    """A beat of one exchange: the user's line and the character's reply."""
    return Beat(id, at, ((user, reply),), questions)


@dataclass(frozen=True)
class Topic:
    """One subject of chat: `before` is drawn, then the user's line chosen, then `after` drawn,
    then the reply chosen."""

    user: Lines
    line: Lines
    before: tuple[Draw, ...] = ()
    after: tuple[Draw, ...] = ()


@dataclass(frozen=True)
class Phrases:
    character: str
    actions: Sequence[str]  # narration that may open a reply
    thoughts: Sequence[str]  # thoughts that may close one
    day_open: Topic
    day_close: Topic
    topics: tuple[Topic, ...]  # one is picked per exchange, uniformly
    user_reactions: Sequence[str]
    reply_reactions: Sequence[str]
    sep: str = " "  # between a reaction and the line it opens
    action_p: float = 0.55
    thought_p: float = 0.12
    user_reaction_p: float = 0.3
    reply_reaction_p: float = 0.2


class _Format(string.Formatter):
    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "c":
            return str(value).capitalize()
        if conversion == "u":
            text = str(value)
            return f"{text[0].upper()}{text[1:]}"
        if conversion == "p":
            text = str(value)
            return f"{text}{'' if text.endswith('.') else '.'}"
        return super().convert_field(value, conversion)


_FORMAT = _Format()


def _draw(rng: random.Random, draws: tuple[Draw, ...], into: dict[str, Any]) -> None:
    for names, table in draws:
        pick = rng.choice(table)
        if isinstance(names, str):
            into[names] = pick
        else:
            into.update(zip(names, pick, strict=True))


def _write(rng: random.Random, lines: Lines, values: dict[str, Any]) -> str:
    template = lines if isinstance(lines, str) else rng.choice(lines)
    return _FORMAT.format(template, **values)


class TableFiller(Filler):
    def __init__(self, phrases: Phrases) -> None:
        self.phrases = phrases
        self.say = speech(phrases.character)

    def _reply(self, rng: random.Random, line: str) -> tuple[Part, ...]:
        p = self.phrases
        parts: list[Part] = []
        if rng.random() < p.action_p:
            parts.append(narration(rng.choice(p.actions)))
        parts.append(self.say(line))
        if rng.random() < p.thought_p:
            parts.append(thought(p.character, rng.choice(p.thoughts)))
        return tuple(parts)

    def _talk(self, rng: random.Random, topic: Topic) -> tuple[str, str]:
        values: dict[str, Any] = {}
        _draw(rng, topic.before, values)
        user = _write(rng, topic.user, values)
        _draw(rng, topic.after, values)
        return user, _write(rng, topic.line, values)

    def day_open(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        user, line = self._talk(rng, self.phrases.day_open)
        return user, self._reply(rng, line)

    def day_close(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        user, line = self._talk(rng, self.phrases.day_close)
        return user, self._reply(rng, line)

    def exchange(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        p = self.phrases
        user, line = self._talk(rng, p.topics[rng.randrange(len(p.topics))])
        if rng.random() < p.user_reaction_p:
            user = f"{rng.choice(p.user_reactions)}{p.sep}{user}"
        if rng.random() < p.reply_reaction_p:
            line = f"{rng.choice(p.reply_reactions)}{p.sep}{line}"
        return user, self._reply(rng, line)
