"""Conversation ids: what a conversation may be named, and the id kioku keeps for any name.

An id names a conversation in an HTTP header (`X-Kioku-Conversation`), a URL path
(`/v1/conversations/{id}/…`), a log line and a shell argument, so it must survive all four. A
client names its chats as it likes, though: SillyTavern calls a branch
`Branch #60 - 2026-12-01@18h34m47s`, a renamed chat is whatever the user typed, a character's
name may hold any punctuation. Refusing such a name left the user's message without a reply
(issue 22), so the proxy takes any name and keeps it under an id that can travel:

- a name that follows the rule below is its own id;
- any other (`a/b`, a control character, 201 characters) is kept under `key_for(name)`: the name
  with what cannot travel replaced by `_`, cut to 160 characters, and ` ~` plus 12 hex digits of
  the name's SHA-256, so two names never share an id and the same name always gets the same
  one. kioku answers it in the response header `X-Kioku-Conversation`.

The rule: 1 to 200 printable characters of any script, no `/` or `\\` (a URL path cannot carry
them: `%2F` is decoded before routing), no `.` or `..` alone (a path segment), and no space at
either end. Everything else is fine: `# ? % @ : ' ( ) !`, spaces inside, `ミカとの会話`. The
store checks it where a conversation is created (`check_id`); ids stored before it keep working.
"""

from __future__ import annotations

import hashlib
import unicodedata

from kioku.errors import InputError

MAX_ID_LENGTH = 200
KEPT_CHARS = 160  # of a name that cannot be its own id, before its hash
FORBIDDEN = frozenset("/\\")
# control, format, surrogate, unassigned, private use; line and paragraph separators
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Cn", "Co", "Zl", "Zp"})


def _printable(ch: str) -> bool:
    return unicodedata.category(ch) not in _UNPRINTABLE and ch not in FORBIDDEN


def is_valid_id(conversation_id: str) -> bool:
    cid = conversation_id
    if not cid or len(cid) > MAX_ID_LENGTH or cid in (".", ".."):
        return False
    if cid != cid.strip():
        return False
    return all(_printable(ch) for ch in cid)


def key_for(name: str) -> str:
    """The id kioku keeps a client's chat name under (see the module docstring)."""
    if is_valid_id(name):
        return name
    kept = "".join(ch if _printable(ch) else "_" for ch in name)
    kept = " ".join(kept.split())[:KEPT_CHARS].strip().strip(".") or "chat"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{kept} ~{digest}"


def check_id(conversation_id: str) -> str:
    """The id, or `InputError` saying what a conversation id may hold."""
    if not is_valid_id(conversation_id):
        shown = conversation_id if len(conversation_id) <= 60 else conversation_id[:60] + "…"
        raise InputError(
            f"conversation id {shown!r} is not allowed: use 1-{MAX_ID_LENGTH} printable "
            "characters (any script) without '/' or '\\', not '.' or '..', and no space at "
            "either end"
        )
    return conversation_id
