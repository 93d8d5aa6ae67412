"""Dates: how a message's time is written, and the one rule for date lines in the raw window.

Every message carries a time (`Message.at`): the dataset's session date, the client's
`send_date`, or the moment kioku received it. A model cannot answer "what did we do last
weekend?" without knowing when each thing was said, so the raw window shows a date line in front
of every message whose day differs from the one before it, and in front of the window's first
message once the window no longer starts the conversation (memory or dropped messages come
before it, and their dates are elsewhere). A conversation that still fits from its first
message shows dates only where the day changes, so what a client sends passes through as sent.
The line is part of the message it precedes (its tokens are counted with that message) and
depends only on the message and its predecessor, so a message renders the same at every turn and
the prompt cache holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from typing import Any

from kioku.inert import mark
from kioku.lang import EN, JA, ZH
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage
from kioku.tokens import TokenCounter

MONTHS = EN.months
WEEKDAYS = {x.code: x.weekdays for x in (EN, JA, ZH)}


def _lang(lang: str) -> str:
    return lang if lang in WEEKDAYS else "en"


def day_text(d: date, lang: str = "en") -> str:
    """A day as a reader writes it: "8 May 2023", "2023年5月8日"."""
    if _lang(lang) == "en":
        return f"{d.day} {MONTHS[d.month - 1]} {d.year}"
    return f"{d.year}年{d.month}月{d.day}日"


def month_text(d: date, lang: str = "en") -> str:
    if _lang(lang) == "en":
        return f"{MONTHS[d.month - 1]} {d.year}"
    return f"{d.year}年{d.month}月"


def year_text(year: int, lang: str = "en") -> str:
    return str(year) if _lang(lang) == "en" else f"{year}年"


def day_with_weekday(d: date, lang: str = "en") -> str:
    """ "Monday, 8 May 2023", "2023年5月8日(月)", "2023年5月8日 星期一"."""
    lg = _lang(lang)
    wd = WEEKDAYS[lg][d.weekday()]
    if lg == "en":
        return f"{wd}, {day_text(d, lg)}"
    if lg == "ja":
        return f"{day_text(d, lg)}({wd})"
    return f"{day_text(d, lg)} {wd}"


def date_line(d: date, lang: str = "en") -> str:
    """The line the raw window shows when the day changes, in kioku's mark (`kioku.inert`): a
    date a message writes on a line of its own never reads as one of these."""
    return mark(day_with_weekday(d, lang))


def day_of(at: datetime | None) -> date | None:
    return at.date() if at is not None else None


def line_for(
    message: Message, previous: Message | None, lang: str = "en", continued: bool = True
) -> str:
    """The date line (with its newline) that goes in front of `message` in the window, or "".

    The rule: a dated message whose day differs from the message before it in the window (an
    undated predecessor counts as a change) gets a line; one that opens the window (`previous`
    None) gets one when the window `continued` a conversation begun before it. Only what people
    wrote gets one: a tool result reaches the model as the tool returned it."""
    if message.role not in ("user", "assistant") or message.at is None:
        return ""
    if previous is None:
        dated = continued
    else:
        dated = previous.at is None or previous.at.date() != message.at.date()
    return f"{date_line(message.at.date(), lang)}\n" if dated else ""


def dated_text(
    message: Message, previous: Message | None, lang: str = "en", continued: bool = True
) -> str:
    """The message's text as the raw window shows it, date line included."""
    return line_for(message, previous, lang, continued) + message.text


def dated_texts(
    messages: Sequence[Message], lang: str = "en", continued: bool = False
) -> list[str]:
    """Every message of a window with the rule applied (for prompts kioku does not build);
    `continued`: the window does not start the conversation."""
    return [
        dated_text(m, messages[i - 1] if i else None, lang, continued)
        for i, m in enumerate(messages)
    ]


def line_tokens(line: str, message: Message, counter: TokenCounter) -> int:
    """What a date line adds to its message, counted on the joined text (exact, not summed)."""
    return counter.count(line + message.text) - counter.count(message.text) if line else 0


def window(
    raw: Sequence[LogEntry],
    counter: TokenCounter,
    lang: str,
    render: Callable[[LogEntry], ChatMessage],
) -> list[tuple[ChatMessage, int]]:
    """The raw window as chat messages (`render` makes one from an entry), each with its token
    count, date lines included (the window continues the conversation when its first seq is
    not 0)."""
    out: list[tuple[ChatMessage, int]] = []
    for i, e in enumerate(raw):
        line = line_for(e.message, raw[i - 1].message if i else None, lang, e.seq > 0)
        message = render(e)
        tokens = e.tokens or counter.count(e.message.text)
        if line:
            message = message.prefixed(line)
            tokens += line_tokens(line, e.message, counter)
        out.append((message, tokens))
    return out


# times kioku is given --------------------------------------------------------------------------


def received(now: float) -> datetime:
    """The time kioku received a message the client did not date: local, with its offset."""
    return datetime.fromtimestamp(now, tz=UTC).astimezone()


_ST_FORMATS = (
    "%B %d, %Y %I:%M%p",  # SillyTavern: "May 8, 2023 1:56pm"
    "%B %d, %Y %I:%M %p",
    "%b %d, %Y %I:%M%p",
    "%b %d, %Y %I:%M %p",
    "%B %d, %Y",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
)
_EPOCH_MS = 1e11  # a number above this is milliseconds (JavaScript's Date.now())


def parse_client_date(value: Any) -> datetime | None:
    """A client's message date (`send_date`): ISO 8601, SillyTavern's "May 8, 2023 1:56pm",
    or epoch seconds / milliseconds. Anything else is None: the receipt time is used instead."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = value / 1000 if value > _EPOCH_MS else value
        try:
            return datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if not isinstance(value, str) or not value.strip():
        return None
    s = value.strip()
    if re.fullmatch(r"\d{9,14}(\.\d+)?", s):
        return parse_client_date(float(s))
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        pass
    squeezed = re.sub(r"\s+", " ", s.replace(" at ", " "))
    for fmt in _ST_FORMATS:
        try:
            return datetime.strptime(squeezed, fmt)
        except ValueError:
            continue
    return None
