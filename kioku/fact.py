"""A fact as a value: what the model-free extractors find (`kioku.facts` for English,
`kioku.facts_ja` for Japanese), the sentence they read it in, and the slot a newer fact of the
same kind replaces an older one in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime

from kioku.morph import wordset

__all__ = ["KINDS", "WEATHER", "Fact", "Speech", "slot_for_object"]

KINDS = ("name", "relation", "anniversary", "promise", "preference", "habit", "fact")


@dataclass(frozen=True)
class Fact:
    kind: str
    subject: str  # whom it is about
    text: str
    said_by: str  # who said it
    seq: int | None = None
    on: date | None = None  # the date of what it records
    slot: str = ""  # facts in one slot replace each other


@dataclass(frozen=True)
class Speech:
    """One sentence to read for facts, with who said it, to whom and when."""

    text: str
    speaker: str
    addressee: str = ""
    at: datetime | None = None
    seq: int | None = None


# things one likes that change with the day: only the latest is kept (see the module docstring)
WEATHER = wordset(
    """
    rain rainy snow snowy fog foggy mist misty sun sunny sunshine heat cold clouds cloud
    cloudy wind windy storm storms thunder humidity drizzle weather breeze frost 雨 雪 霧 晴れ 暑さ
    寒さ 曇り 風 嵐 雷 天気 雨の日 雪の日
    """
)


def slot_for_object(obj: str) -> str:
    """The slot of a preference: its object, or the object's category when a new one
    replaces the old (the weather)."""
    key = re.sub(r"^(?:the|a|an|this|that)\s+", "", obj.strip().casefold())
    if key in WEATHER or any(w in WEATHER for w in key.split()[-1:]):
        return "pref:weather"
    return f"pref:{key}"
