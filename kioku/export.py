"""Exporting a conversation's transcript: users own their chats.

Two formats, one line of JSON each (docs/formats.md describes both):

- `kioku`: a header `{"kioku": 1, "conversation", "character", "system_prompt", "user", "lang"}`,
  then every message `{"seq", "role", "author", "at", "parts"}` with its structure (narration,
  speech with speaker, thought) intact. `kioku import --format kioku` reads it back to the same
  messages.
- `sillytavern`: SillyTavern's chat file (a header with `user_name` and `character_name`, then
  `{"name", "is_user", "is_system", "send_date", "mes"}` per message): open it in SillyTavern or
  import it into another kioku.

The log is read in pages, so a conversation of any length exports in bounded memory. Messages a
client deleted (kept in the log without content) are left out; memory is not exported (it is
kioku's, rebuilt by an import).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from kioku.datasets import message_to_json
from kioku.errors import InputError
from kioku.lang import detect_lang
from kioku.messages import LogEntry, render_parts
from kioku.store import Store

EXPORT_FORMATS = ("kioku", "sillytavern")
PAGE = 1000


def entries(store: Store, conversation_id: str) -> Iterator[LogEntry]:
    """Every message with content, oldest first, a page at a time."""
    first = 0
    while True:
        page = store.entries(conversation_id, first, first + PAGE - 1)
        if not page:
            return
        yield from (e for e in page if not e.message.is_empty())
        first = page[-1].seq + 1


def export_lines(store: Store, conversation_id: str, fmt: str = "kioku") -> Iterator[str]:
    """The conversation as JSON lines in `fmt`: a header line, then one line per message."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")
    info = store.conversation(conversation_id)
    opening = store.entries(conversation_id, 0, 30)
    user = next((e.message.author for e in opening if e.role == "user" and e.message.author), "")
    lang = detect_lang([info.system_prompt, *(e.text for e in opening)]) if opening else "en"
    dump = lambda d: json.dumps(d, ensure_ascii=False)  # noqa: E731
    if fmt == "kioku":
        yield dump(
            {
                "kioku": 1,
                "conversation": info.public_id or info.id,
                "character": info.character,
                "system_prompt": info.system_prompt,
                "user": user or "user",
                "lang": lang,
            }
        )
        for e in entries(store, conversation_id):
            yield dump({"seq": e.seq, **message_to_json(e.message)})
        return
    yield dump(
        {
            "user_name": user or "User",
            "character_name": info.character or "Assistant",
            "create_date": _date(opening[0].message.at) if opening else "",
            "chat_metadata": {"kioku_conversation": info.id},
        }
    )
    for e in entries(store, conversation_id):
        yield dump(_sillytavern(e, user or "User", info.character or "Assistant"))


def _sillytavern(e: LogEntry, user: str, character: str) -> dict[str, Any]:
    m = e.message
    name = m.author or (user if m.role == "user" else character)
    return {
        "name": name,
        "is_user": m.role == "user",
        "is_system": m.role == "system",
        "send_date": _date(m.at),
        "mes": render_parts(m.parts, name),
        "extra": {"kioku_seq": e.seq},
    }


def _date(at: datetime | None) -> str:
    return at.isoformat() if at else ""
