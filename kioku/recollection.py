"""A recollection: an excerpt of the archive that retrieval found relevant to the new message.

`kioku.recall` finds them; `kioku.context` puts them beside the new user message (never in front
of the raw window, so the prompt cache survives). One value serves both: the lines it holds, and
the text and tokens the prompt spends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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

    @property
    def at(self) -> datetime | None:
        return next((ln.at for ln in self.lines if ln.at), None)

    def render(self) -> str:
        when = f", {self.at:%Y-%m-%d}" if self.at else ""
        head = f"(#{self.first_seq}–{self.last_seq}{when})"
        return "\n".join([head, *(f"{ln.speaker}: {ln.text}" for ln in self.lines)])

    @property
    def text(self) -> str:
        """What the prompt shows."""
        return self.render()
