"""Who is in a stretch of the conversation, as the chronicler's prompt names them.

The chronicler's prompt says whose story it records ("a conversation between the user (Alex)
and the character Rowan"). It used to say "the user (user)" however the persona was
called, while the transcript below named Alex (issue 22), and a group chat has several
characters. The names come from the messages themselves: the user's persona is the author of
the user messages, the characters are the authors of the replies, in the order they first
speak.

Authorship comes from the role, never from a name (issue 43): a user message is never stored or
read under a character's name (`user_author`, `as_recorded`).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

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


USER_MARK = " (user)"  # how a user's name that is a character's is stored


def _name_key(name: str) -> str:
    text = unicodedata.normalize("NFKC", name)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")  # zero-width marks
    return " ".join(text.split()).strip(_AROUND).casefold()


_AROUND = " \"'`.,:;!?()[]{}<>「」『』【】“”‘’*_~-"  # what may wrap a name without changing it


def same_name(a: str, b: str) -> bool:
    """Whether two names are one, as a reader would take them: case, width, spacing, invisible
    characters and the punctuation around them aside ("mika ", "Ｍｉｋａ", "Mi\u200bka", "「Mika」")."""
    return bool(_name_key(a)) and _name_key(a) == _name_key(b)


def user_author(name: str, character: str = "", cast: Sequence[str] = ()) -> str:
    """The name a user's message is stored under. Authorship comes from the role: a name the
    client gives a user message (its `name`, X-Kioku-User) that is the character's, or a group
    member's (`cast`), is stored as "Mika (user)", so nothing the user typed is ever filed as
    the character's (notes input, chapters, the ledger, recall all read the author)."""
    if any(same_name(name, c) for c in (character, *cast)):
        return f"{name.strip()}{USER_MARK}"
    return name


def as_recorded(entries: Sequence[LogEntry]) -> list[LogEntry]:
    """`entries` with each user message that carries a reply's author name (stored before
    `user_author` existed) under the user's label, so a reader of the range (the notes model,
    an extractive chapter) files it as the user's."""
    cast = characters_of(entries)
    if not cast:
        return list(entries)
    out = []
    for e in entries:
        if e.role == "user" and any(same_name(e.message.author, c) for c in cast):
            e = replace(
                e, message=replace(e.message, author=user_author(e.message.author, "", cast))
            )
        out.append(e)
    return out
