"""A chat-completions request as the proxy reads it: the body's model (fields kioku does not use
pass through to the upstream) and the messages split into the character card, the chat to sync
with the log, and the system messages that go upstream beside it.

Parsing lives apart from the turn (`kioku.service.proxy`) so that both stay small; the proxy
re-exports `ChatBody`, `Split` and `split_messages` for the code that imports them from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kioku import protocol
from kioku.dates import parse_client_date
from kioku.errors import BadParameter, InputError
from kioku.messages import Role
from kioku.models import ChatMessage
from kioku.sync import Incoming

__all__ = [
    "MAX_NAME_LENGTH",
    "ROLES",
    "ChatBody",
    "ChatMessageIn",
    "Split",
    "content_text",
    "split_messages",
]

ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


# A name (a message's `name`, X-Kioku-Character, X-Kioku-User) is a person's or a character's:
# the longest any chat needs is far below this. A 20,000-character name once made every
# chronicler prompt 170,070 characters (issue 21).
MAX_NAME_LENGTH = 200


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, max_length=MAX_NAME_LENGTH)


class ChatBody(BaseModel):
    """An OpenAI chat completion request; fields kioku does not use pass to the upstream."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(None, description="Names the conversation (or X-Kioku-Conversation).")
    max_tokens: int | None = Field(None, ge=1)


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def system_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A system message is text (the card, an author's note): an image there would vanish."""
    if isinstance(content, list) and any(
        not isinstance(p, dict) or p.get("type") != "text" for p in content
    ):
        raise BadParameter(
            f"{where} is a system message with a part that is not text; kioku keeps system "
            "messages as text: send images in a user message",
            f"{where}.content",
        )
    return content_text(content)


@dataclass(frozen=True)
class Split:
    system: str | None  # leading system messages: the character card
    chat: tuple[Incoming, ...]
    before_last: tuple[ChatMessage, ...] = ()  # system messages inside the history
    after_last: tuple[ChatMessage, ...] = ()  # system messages after the last message
    blobs: Mapping[str, bytes] = field(default_factory=dict)  # media parts, by sha256


def split_messages(messages: Sequence[ChatMessageIn]) -> Split:
    system: list[str] = []
    chat: list[Incoming] = []
    inside: list[ChatMessage] = []
    after: list[ChatMessage] = []
    blobs: dict[str, bytes] = {}
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            raise InputError(f"unknown role {m.role!r}; use system, user, assistant or tool")
        if role == "system":
            text = system_text(m.content, f"messages.{i}")
            if not chat:
                system.append(text)
            else:
                after.append(ChatMessage("system", text))
            continue
        parsed = protocol.incoming(
            m.role, m.content, name=m.name, extra=m.model_extra, where=f"messages.{i}"
        )
        if parsed.is_empty:
            continue  # nothing kioku can store
        blobs.update(parsed.blobs)
        inside.extend(after)
        after = []
        at = parse_client_date((m.model_extra or {}).get("send_date"))
        chat.append(Incoming(role, parsed.text, m.name or "", parsed.parts, at))
    if not chat:
        raise InputError("the request has no user or assistant message to answer")
    system_prompt = "\n\n".join(system) if system else None
    return Split(system_prompt, tuple(chat), tuple(inside), tuple(after), blobs)
