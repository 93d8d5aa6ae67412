"""A chat-completions request as the proxy reads it: the body's model (fields kioku does not use
pass through to the upstream) and the messages split into the character card
(`kioku.service.card_parts`), the chat to sync with the log, and the system messages that go
upstream beside it, each where the client put it (`kioku.client_parts`).

Parsing lives apart from the turn (`kioku.service.proxy`) so that both stay small; the proxy
re-exports `ChatBody`, `Split` and `split_messages` for the code that imports them from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kioku import protocol
from kioku.client_parts import NO_PARTS, ClientParts
from kioku.dates import parse_client_date
from kioku.errors import BadParameter, InputError
from kioku.messages import Role
from kioku.models import ChatMessage
from kioku.service.card_parts import Card, LeadingMessage, card_of
from kioku.service.speakers import speaker_of
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
    system: str | None  # the character card kioku keeps (`card_parts`)
    chat: tuple[Incoming, ...]
    parts: ClientParts = NO_PARTS  # what the client adds around the chat (`client_parts`)
    blobs: Mapping[str, bytes] = field(default_factory=dict)  # media parts, by sha256
    card: Card = field(default_factory=Card)

    @property
    def after_last(self) -> tuple[ChatMessage, ...]:
        return self.parts.after


def split_messages(
    messages: Sequence[ChatMessageIn],
    *,
    volatile: frozenset[int] = frozenset(),
    user: str = "",
    character: str = "",
    speakers: Sequence[str] = (),
) -> Split:
    """The card (leading system messages, `volatile` ones moved after the chat), the chat, and
    the system messages inside and after it: each inside one at its depth, as many chat
    messages from the end as the client put it. `speakers`: a group chat's characters (an
    assistant message opening with `Name:` is theirs, `kioku.service.speakers`)."""
    leading: list[LeadingMessage] = []
    chat: list[Incoming] = []
    inside: list[tuple[int, ChatMessage]] = []  # (chat messages before it, message)
    after: list[ChatMessage] = []
    blobs: dict[str, bytes] = {}
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            raise InputError(f"unknown role {m.role!r}; use system, user, assistant or tool")
        if role == "system":
            text = system_text(m.content, f"messages.{i}")
            if not chat:
                leading.append(LeadingMessage(text, m.name or ""))
            else:
                after.append(ChatMessage("system", text))
            continue
        parsed = protocol.incoming(
            m.role, m.content, name=m.name, extra=m.model_extra, where=f"messages.{i}"
        )
        if parsed.is_empty:
            continue  # nothing kioku can store
        blobs.update(parsed.blobs)
        inside.extend((len(chat), a) for a in after)
        after = []
        at = parse_client_date((m.model_extra or {}).get("send_date"))
        name = m.name or ""
        if speakers and role == "assistant" and not name:
            name = speaker_of(parsed.text, speakers) or ""
        chat.append(Incoming(role, parsed.text, name, parsed.parts, at))
    if not chat:
        raise InputError("the request has no user or assistant message to answer")
    card = card_of(leading, volatile, user=user, character=character)
    parts = ClientParts(
        injections=tuple((len(chat) - k, m) for k, m in inside),
        volatile=card.volatile,
        after=tuple(after),
    )
    return Split(card.text, tuple(chat), parts, blobs, card)
