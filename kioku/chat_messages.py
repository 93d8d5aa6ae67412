"""Messages as the chat-completions protocol writes them, and as kioku stores them.

Companion apps give characters tools (a calendar, the weather, a search) and let people share
pictures. A message is then more than role and text: an assistant message may carry
`tool_calls`, a `tool` message answers one of them by `tool_call_id`, and content may be an array
of parts with images in it. kioku keeps all of it, in order, so that what it sends upstream is
what the client would have sent itself (plus memory):

- `incoming(...)` reads one request message into `Part`s (`kioku.messages`) and the blobs its
  media parts need. A media part is kept whole, exactly as the client wrote it, in the store's
  blobs table under the sha256 of its canonical JSON; the message row holds only that name, so
  the rows read at every turn stay small, and a picture sent twice is stored once.
- `chat_message(message)` is the one place a stored message becomes what the upstream gets
  (`context` uses it for every message of the prompt): plain messages as role + text, as
  always; the others with their content array, tool calls, tool call id. Media parts stay named
  by their hash until the request is sent (`ChatMessage.to_json(media)`).
- `reply_message(completion)` is the reply as stored: its text and its tool calls.
- `message_tokens(...)` is what a message costs in the prompt: its text as the counter counts
  it, plus the profile's per-image cost for each media part (never zero).

What the chronicler reads is `kioku.transcript`'s business: a tool call there is an action of the
character, a tool result what the tool returned, an image something someone shared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kioku.errors import BadParameter
from kioku.messages import MEDIA_KINDS, Message, Part, Role, render_parts
from kioku.models import ChatMessage, Completion, ContentPart, ToolCall
from kioku.tokens import TokenCounter

TEXTUAL = ("narration", "speech", "thought", "text")


@dataclass(frozen=True)
class Parsed:
    """One request message as kioku stores it: its parts, their text, and the blobs to keep."""

    parts: tuple[Part, ...]
    blobs: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return render_parts(self.parts)

    @property
    def is_empty(self) -> bool:
        return Message("user", self.parts).is_empty()


def blob_of(part: Mapping[str, Any]) -> tuple[str, bytes]:
    """A media part's stored form and its name: the sha256 of its canonical JSON."""
    data = json.dumps(part, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest(), data


def media_of(blobs: Mapping[str, bytes]) -> dict[str, Any]:
    """Stored blobs back as the content parts they were."""
    return {ref: json.loads(data) for ref, data in blobs.items()}


def _content(content: Any, where: str) -> tuple[list[Part], dict[str, bytes]]:
    if content is None:
        return [], {}
    if isinstance(content, str):
        return [Part("text", content)], {}
    parts: list[Part] = []
    blobs: dict[str, bytes] = {}
    for j, item in enumerate(content):
        kind = item.get("type") if isinstance(item, dict) else None
        if not isinstance(kind, str):
            raise BadParameter(
                f"{where}.content[{j}] is not a content part: each needs a `type`", where
            )
        if kind == "text":
            parts.append(Part("text", str(item.get("text") or "")))
            continue
        ref, data = blob_of(item)
        blobs[ref] = data
        if kind == "image_url":
            parts.append(Part("image", "", ref=ref))
        else:  # input_audio, file, …: kept and sent as written, counted like an image
            parts.append(Part("attachment", "", ref=ref, name=kind))
    return parts, blobs


def _tool_calls(raw: Any, where: str) -> list[Part]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadParameter(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        ok = (
            isinstance(fn, dict)
            and isinstance(call.get("id"), str)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str)
        )
        if not ok:
            raise BadParameter(
                f"{where}.tool_calls[{j}] must be "
                '{"id": str, "type": "function", "function": {"name": str, "arguments": str}}',
                f"{where}.tool_calls",
            )
        assert isinstance(fn, dict) and isinstance(call, dict)
        out.append(Part("tool_call", fn["arguments"], ref=call["id"], name=fn["name"]))
    return out


def incoming(
    role: str,
    content: Any,
    *,
    name: str | None = None,
    extra: Mapping[str, Any] | None = None,
    where: str = "message",
) -> Parsed:
    """A request message (`role` as the client wrote it: `function` is the legacy tool role)
    as parts. Malformed tool calls and tool messages without their call are refused (400):
    an upstream would refuse them too, with a less helpful message."""
    extra = extra or {}
    parts, blobs = _content(content, where)
    if extra.get("function_call") is not None:
        raise BadParameter(
            f"{where}.function_call (deprecated) is not supported; send tool_calls",
            f"{where}.function_call",
        )
    if role == "assistant":
        parts += _tool_calls(extra.get("tool_calls"), where)
    elif role in ("tool", "function"):
        call_id = extra.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise BadParameter(
                f"{where} is a tool message without tool_call_id: name the call it answers",
                f"{where}.tool_call_id",
            )
        if role == "function" and not name:
            raise BadParameter(f"{where} is a function message without a name", f"{where}.name")
        text = render_parts([p for p in parts if p.kind == "text"])
        media = [p for p in parts if p.kind in MEDIA_KINDS]
        parts = [Part("tool_result", text, ref=call_id if role == "tool" else None, name=name)]
        parts += media
    return Parsed(tuple(parts), blobs)


def _segment(p: Part, author: str) -> str:
    return p.text if p.kind == "tool_result" else render_parts((p,), author)


def chat_message(message: Message) -> ChatMessage:
    """A stored message as the upstream gets it: the one function that decides it."""
    parts = message.parts
    if not any(p.kind in MEDIA_KINDS or p.ref is not None or p.name for p in parts):
        # the plain message of every conversation before tools and images: role and text
        # (an old tool row without its call id is shown as user text, as it always was)
        plain = message.role if message.role in ("user", "assistant", "system") else "user"
        return ChatMessage(role=plain, content=message.text)
    texts = [p for p in parts if p.kind in TEXTUAL or p.kind == "tool_result"]
    content = "\n".join(s for s in (_segment(p, message.author) for p in texts) if s)
    array: tuple[ContentPart, ...] = ()
    if any(p.kind in MEDIA_KINDS for p in parts):
        array = tuple(
            ContentPart(ref=p.ref)
            if p.kind in MEDIA_KINDS
            else ContentPart(_segment(p, message.author))
            for p in parts
            if p.kind in MEDIA_KINDS or p in texts
        )
    result = next((p for p in parts if p.kind == "tool_result"), None)
    role: Role = "tool" if result is not None else message.role
    return ChatMessage(
        role=role,
        content=content,
        parts=array,
        tool_calls=tuple(
            ToolCall(p.ref or "", p.name or "", p.text) for p in parts if p.kind == "tool_call"
        ),
        tool_call_id=result.ref if result is not None else None,
        name=result.name if result is not None else None,
        no_content=not texts and not array,  # `null`, not "": some servers take only one
    )


def reply_message(completion: Completion, author: str = "") -> Message:
    """A reply as stored: its text, then each tool call it asked for."""
    parts = [Part("text", completion.text)] if completion.text or not completion.tool_calls else []
    parts += [Part("tool_call", c.arguments, ref=c.id, name=c.name) for c in completion.tool_calls]
    return Message(role="assistant", parts=tuple(parts), author=author)


def media_count(message: Message) -> int:
    return sum(1 for p in message.parts if p.kind in MEDIA_KINDS)


def message_tokens(message: Message, counter: TokenCounter, image_tokens: int) -> int:
    """What a message costs in the prompt: its text, plus `image_tokens` per media part (the
    profile's number: a model's image cost is not text, and never zero)."""
    return counter.count(message.text) + image_tokens * media_count(message)


def refs_of(messages: Sequence[ChatMessage]) -> set[str]:
    """The blobs a prompt needs to be sent."""
    return {r for m in messages for r in m.refs}
