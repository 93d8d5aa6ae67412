"""A recollection: an excerpt of the archive that retrieval found relevant to the new message.

`kioku.recall` finds them; `kioku.context` puts them beside the new user message (never in front
of the raw window, so the prompt cache survives). One value serves both: the lines it holds, and
the text and tokens the prompt spends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property

from kioku import dates
from kioku.inert import indented, mark, one_line
from kioku.relative_dates import resolve


@dataclass(frozen=True)
class RecalledLine:
    seq: int
    speaker: str
    text: str
    at: datetime | None = None


@dataclass(frozen=True)
class Recollection:
    """A past exchange found relevant to the new user message."""

    first_seq: int
    last_seq: int
    score: float
    lines: tuple[RecalledLine, ...]
    tokens: int = 0  # of `text`, by the counter of whoever made it (0: not counted yet)
    lang: str = "en"  # the conversation's: how its dates are written

    @property
    def at(self) -> datetime | None:
        return next((ln.at for ln in self.lines if ln.at), None)

    @cached_property
    def text(self) -> str:
        """The excerpt as the prompt shows it, rendered once (a question's turn measures it for
        each recollection it tries beside the ones it took). Dates follow the raw window's rule
        (`kioku.dates`): a date line where the day changes. A recalled line is memory, read
        long after the day it was said, so its relative dates are resolved ("yesterday" said on
        8 May reads "yesterday (7 May 2023)"), as they are in chapters and notes."""
        # kioku's lines in its mark; what was said inert, its further lines indented under its
        # speaker (`kioku.inert`), so a recalled message cannot add lines of its own
        out = [mark(f"#{self.first_seq}–{self.last_seq}")]
        day: date | None = None
        for ln in self.lines:
            if ln.at is not None and ln.at.date() != day:
                day = ln.at.date()
                out.append(dates.date_line(day, self.lang))
            said = indented(resolve(ln.text, ln.at, self.lang), "  ")
            out.append(f"{one_line(ln.speaker)}: {said}")
        return "\n".join(out)
