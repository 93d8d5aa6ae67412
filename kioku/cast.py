"""Who is in a stretch of the conversation, as the chronicler's prompt names them.

The chronicler's prompt says whose story it records ("a conversation between the user (Alex)
and the character Rowan"). It used to say "the user (user)" however the persona was
called, while the transcript below named Alex (issue 22), and a group chat has several
characters. The names come from the messages themselves: the user's persona is the author of
the user messages, the characters are the authors of the replies, in the order they first
speak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kioku.messages import LogEntry

AND = {"en": " and ", "ja": "と", "zh": "和"}
LIST = {"en": ", ", "ja": "、", "zh": "、"}


def user_of(entries: Iterable[LogEntry]) -> str:
    """The name most of the user messages are stored under ("" when none has one)."""
    names = Counter(
        e.message.author
        for e in entries
        if e.role == "user" and e.message.author not in ("", "user")
    )
    return names.most_common(1)[0][0] if names else ""


def characters_of(entries: Iterable[LogEntry]) -> list[str]:
    """The replies' authors, in the order they first speak."""
    seen: list[str] = []
    for e in entries:
        name = e.message.author
        if e.role == "assistant" and name and name not in seen:
            seen.append(name)
    return seen


def character_phrase(entries: Iterable[LogEntry], character: str, lang: str = "en") -> str:
    """The character(s) a stretch is about: the conversation's `character`, or, when several
    characters speak in it (a group chat), all of them as one phrase ("Rowan and Mika")."""
    seen = characters_of(entries)
    if len(seen) <= 1:
        return character or (seen[0] if seen else "")
    return LIST.get(lang, ", ").join(seen[:-1]) + AND.get(lang, " and ") + seen[-1]
