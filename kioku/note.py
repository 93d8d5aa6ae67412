"""A note as a value: a draft an extractor proposes, a ledger entry, an operator edit's result.

The ledger that stores notes is `kioku.store.ledger`; the layer that extracts, ranks and renders
them is `kioku.notes`. Both take these values, so neither imports the other.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import date
from typing import Literal

from kioku.dates import day_text

__all__ = ["NOTE_KINDS", "SAID_BY", "Author", "EditResult", "Note", "NoteDraft", "norm"]

NOTE_KINDS: tuple[str, ...] = (
    "name",
    "relation",
    "anniversary",
    "promise",
    "preference",
    "habit",
    "fact",
)  # also the order in which notes are kept when the budget is short
Author = Literal["extractor", "operator"]


@dataclass(frozen=True)
class NoteDraft:
    """A fact an extractor proposes, before it has a place in the ledger."""

    subject: str
    kind: str
    text: str
    source_seq: int | None = None
    supersedes: int | None = None
    said_by: str = ""  # who said it (the subject is whom it is about)
    on_date: str | None = None  # ISO date of what it records
    slot: str = ""  # a newer fact in the same slot (and subject, kind) supersedes the older


@dataclass(frozen=True)
class Note:
    """One ledger entry. A retraction (`retracted`) is an entry too: it hides what it supersedes."""

    id: int
    subject: str
    kind: str
    text: str
    author: Author = "extractor"
    source_seq: int | None = None
    supersedes: int | None = None
    retracted: bool = False
    origin: str = ""
    created_at: float = 0.0
    said_by: str = ""
    on_date: str | None = None
    slot: str = ""
    mentions: int = 1  # how many messages stated it, across the whole conversation

    @property
    def key(self) -> tuple[str, str]:
        return (norm(self.subject).casefold(), self.kind)

    def line(self) -> str:
        return f"- [{self.kind}] {self.subject}: {self.text}"

    def shown(self, lang: str = "en") -> str:
        """The line the memory exchange shows: with the date of what it records, and who said
        it when that is not the person it is about."""
        extra = []
        if self.on_date and not re.search(r"\d{4}", self.text):  # a dated fact says it already
            with contextlib.suppress(ValueError):
                extra.append(day_text(date.fromisoformat(self.on_date), lang))
        if self.said_by and self.said_by.casefold() != norm(self.subject).casefold():
            extra.append(SAID_BY.get(lang, SAID_BY["en"]).format(self.said_by))
        return self.line() + (f" ({', '.join(extra)})" if extra else "")


SAID_BY = {"en": "said by {}", "ja": "{}の話", "zh": "{}说"}


def norm(text: str) -> str:
    """One space between words and none around them: how a note's parts are compared."""
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class EditResult:
    added: tuple[int, ...] = ()
    changed: tuple[int, ...] = ()
    retracted: tuple[int, ...] = ()
