"""Conversation ids: what a caller may name a conversation, checked where one is created.

An id names a conversation in an HTTP header (`X-Kioku-Conversation`), a URL path
(`/v1/conversations/{id}/…`), a log line and a shell argument, so it must survive all four. The
proxy once accepted `a/b`, which no REST path can reach (`%2F` is decoded before routing).

A conversation id is 1 to 200 characters:

- letters, digits and combining marks of any script (`ミカとの会話` is fine) and `_`;
- inside, also spaces and `- . : @ + = ~ , ( ) '` (SillyTavern names chats like
  `Mika - 2024-05-01 @12h30m`);
- it starts with a letter, digit or `_` and does not end with a space.

So never `/ \\ ? # %`, control characters, or a `.`/`..` path segment. Ids stored before this rule
keep working; only new ones are checked.
"""

from __future__ import annotations

import unicodedata

from kioku.errors import InputError

MAX_ID_LENGTH = 200
INNER = frozenset(" -.:@+=~,()'")


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def is_valid_id(conversation_id: str) -> bool:
    cid = conversation_id
    if not cid or len(cid) > MAX_ID_LENGTH or not _word(cid[0]) or cid[-1] == " ":
        return False
    return all(_word(ch) or ch in INNER or unicodedata.category(ch)[0] == "M" for ch in cid[1:])


def check_id(conversation_id: str) -> str:
    """The id, or `InputError` saying what a conversation id may hold."""
    if not is_valid_id(conversation_id):
        shown = conversation_id if len(conversation_id) <= 60 else conversation_id[:60] + "…"
        raise InputError(
            f"conversation id {shown!r} is not allowed: use 1-{MAX_ID_LENGTH} letters or digits "
            "(any script), '_', and inside also spaces and - . : @ + = ~ , ( ) '"
        )
    return conversation_id
