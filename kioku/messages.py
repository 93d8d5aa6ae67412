"""Messages as the product sees them: role, author, time and structured parts.

A character's reply is not one string. It holds narration (地の文), speech with a speaker (台詞)
and unspoken thought (本音). The summarizer needs that structure to tell what happened from what
someone claimed, so it is kept from the API all the way to the chronicler.
Sequence numbers are the store's business: a `LogEntry` pairs a stored message with its seq.

The chat-completions protocol adds parts of its own (see `kioku.chat_messages`): an image or other
media part (`ref`: its blob's sha256; the data lives in the store's blobs table), an assistant's
tool call (`ref`: the call id, `name`: the function, `text`: the arguments) and a tool's result
(`ref`: the call it answers, `name`: the function, `text`: what it returned).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from kioku.errors import InputError

Role = Literal["user", "assistant", "system", "tool"]
PartKind = Literal[
    "narration", "speech", "thought", "text", "image", "attachment", "tool_call", "tool_result"
]
ROLES: tuple[str, ...] = get_args(Role)
PART_KINDS: tuple[str, ...] = get_args(PartKind)
MEDIA_KINDS = ("image", "attachment")  # parts with no text of their own: data in a blob


@dataclass(frozen=True)
class Part:
    kind: PartKind
    text: str
    speaker: str | None = None
    ref: str | None = None  # media: the blob's sha256; tool call / result: the call id
    name: str | None = None  # tool call / result: the function; attachment: its part type

    def __post_init__(self) -> None:
        if self.kind not in PART_KINDS:
            raise InputError(f"unknown part kind {self.kind!r}; use one of {', '.join(PART_KINDS)}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.text}
        if self.speaker:
            out["speaker"] = self.speaker
        if self.ref is not None:
            out["ref"] = self.ref
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Part:
        return cls(
            kind=data.get("kind", "text"),
            text=str(data.get("text", "")),
            speaker=data.get("speaker"),
            ref=data.get("ref"),
            name=data.get("name"),
        )


@dataclass(frozen=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    author: str = ""
    at: datetime | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InputError(f"unknown role {self.role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(self.parts, tuple):
            object.__setattr__(self, "parts", tuple(self.parts))

    @classmethod
    def of(cls, role: Role, text: str, author: str = "", at: datetime | None = None) -> Message:
        return cls(role=role, parts=(Part("text", text),), author=author, at=at)

    @classmethod
    def user(cls, text: str, author: str = "user", at: datetime | None = None) -> Message:
        return cls.of("user", text, author, at)

    @classmethod
    def assistant(cls, text: str, author: str = "", at: datetime | None = None) -> Message:
        return cls.of("assistant", text, author, at)

    @property
    def text(self) -> str:
        """What the chat model sees: parts joined, speech quoted with its speaker when it differs."""
        return render_parts(self.parts, self.author)

    def is_empty(self) -> bool:
        return not any(p.text.strip() or p.kind in MEDIA_KINDS or p.ref for p in self.parts)

    def parts_json(self) -> str:
        return json.dumps([p.to_json() for p in self.parts], ensure_ascii=False)

    def content_hash(self, parts_json: str | None = None) -> str:
        """`parts_json`: this message's `parts_json()` when the caller has it already."""
        h = hashlib.sha256()
        h.update(self.role.encode())
        h.update(b"\0")
        h.update(self.author.encode())
        h.update(b"\0")
        h.update((self.parts_json() if parts_json is None else parts_json).encode())
        return h.hexdigest()[:32]


def parts_from_json(raw: str | Iterable[Mapping[str, Any]]) -> tuple[Part, ...]:
    data = json.loads(raw) if isinstance(raw, str) else raw
    return tuple(Part.from_json(p) for p in data)


def render_parts(parts: Iterable[Part], author: str = "") -> str:
    out: list[str] = []
    for p in parts:
        if p.kind == "speech":
            who = p.speaker or author
            out.append(f"{who}: 「{p.text}」" if who and who != author else f"「{p.text}」")
        elif p.kind == "thought":
            out.append(f"({p.text})")
        elif p.kind in MEDIA_KINDS or p.kind == "tool_call":
            out.append(protocol_text(p))
        else:
            out.append(p.text)
    return "\n".join(s for s in out if s)


def protocol_text(p: Part) -> str:
    """A media part or a tool call as one line of text: what the log's `text` column holds, what
    syncing compares (so the hash and the call id tell two of them apart) and what is counted
    (an image's cost is added apart, see `kioku.chat_messages.message_tokens`)."""
    if p.kind == "tool_call":
        return f"[tool call {p.name}({canonical_json(p.text)}) {p.ref or ''}]".replace(" ]", "]")
    what = "image" if p.kind == "image" else p.name or p.kind
    return f"[{what} {(p.ref or '')[:12]}]"


def canonical_json(text: str) -> str:
    """JSON text in one spelling (clients re-serialize tool arguments: `{"a":1}` and
    `{"a": 1}` are the same call); text that is not JSON stays as it is."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, sort_keys=True)
    except ValueError:
        return text


@dataclass(frozen=True)
class LogEntry:
    """A message as stored: its gap-free seq within the conversation and its token count."""

    seq: int
    message: Message
    tokens: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> Role:
        return self.message.role

    @property
    def text(self) -> str:
        return self.message.text
