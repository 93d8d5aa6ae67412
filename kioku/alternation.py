"""Roles that alternate: the last step before a message list goes to the upstream.

Strict chat templates (several model families', many GGUFs' own Jinja templates) accept one system
message first and then user, assistant, user, assistant… and raise on anything else. A kioku
prompt can break that in ordinary use: the memory exchange's acknowledgement followed by a raw
window that starts with the character's greeting (two assistant messages), a turn whose reply
failed (two user messages), SillyTavern's author's notes and nudges (system messages inside the
history). One failed turn must not break a conversation for good, so every list kioku sends is
made to alternate here:

- the leading system messages become one system message;
- a system message further down becomes a user message (it is an instruction to the model);
- neighbours of the same role merge into one message, their texts joined by a blank line;
- a list whose first message after the system one is the character's opens with a fixed user
  line (`OPENING`).

Each rule looks only at a message and its neighbours, and merging only appends, so the result
stays prefix-stable: what a turn sent is a prefix of what the next turn sends, as before.
Messages that carry tool calls, and tool results, are left as they are (a template that knows
tools defines its own order for them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kioku.models import ChatMessage, ContentPart

# What a strict template gets before a conversation that opens with the character's greeting:
# SillyTavern's own new-chat marker, the same in every prompt.
OPENING = "[Start a new chat]"
JOIN = "\n\n"


def _mergeable(m: Mapping[str, Any]) -> bool:
    return m.get("role") in ("user", "assistant") and not m.get("tool_calls")


def _parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": "" if content is None else str(content)}]


def _join(a: Any, b: Any) -> Any:
    if not isinstance(a, list) and not isinstance(b, list):
        a, b = "" if a is None else str(a), "" if b is None else str(b)
        return f"{a}{JOIN}{b}" if a and b else a or b
    return [*_parts(a), {"type": "text", "text": JOIN}, *_parts(b)]


def alternate(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The same conversation as a list a strict template accepts (see the module docstring)."""
    out: list[dict[str, Any]] = []
    k = 0
    while k < len(messages) and messages[k].get("role") in ("system", "developer"):
        if out:
            out[0]["content"] = _join(out[0]["content"], messages[k].get("content"))
        else:
            out.append({**messages[k], "role": "system"})
        k += 1
    start = len(out)
    for m in messages[k:]:
        m = dict(m)
        if m.get("role") in ("system", "developer"):
            m["role"] = "user"
            m.pop("name", None)
        prev = out[-1] if len(out) > start else None
        if prev is not None and prev["role"] == m["role"] and _mergeable(prev) and _mergeable(m):
            prev["content"] = _join(prev.get("content"), m.get("content"))
            if prev.get("name") != m.get("name"):
                prev.pop("name", None)
            continue
        if prev is None and m.get("role") == "assistant":
            out.append({"role": "user", "content": OPENING})
        out.append(m)
    return out


def _chat_mergeable(m: ChatMessage) -> bool:
    return m.role in ("user", "assistant") and not (
        m.tool_calls or m.tool_call_id or m.name or m.no_content
    )


def _chat_join(a: ChatMessage, b: ChatMessage) -> ChatMessage:
    content = f"{a.content}{JOIN}{b.content}" if a.content and b.content else a.content or b.content
    parts: tuple[ContentPart, ...] = ()
    if a.parts or b.parts:  # a content array (an image) stays one, in order
        parts = (
            *(a.parts or (ContentPart(a.content),)),
            ContentPart(JOIN),
            *(b.parts or (ContentPart(b.content),)),
        )
    return dataclasses.replace(a, content=content, parts=parts)


def alternate_chat(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """`alternate` for kioku's own `ChatMessage`s (the library's reply path): the same rules,
    with images, tool calls and tool results kept as they are."""
    out: list[ChatMessage] = []
    k = 0
    while k < len(messages) and messages[k].role == "system":
        out = [_chat_join(out[0], messages[k])] if out else [messages[k]]
        k += 1
    start = len(out)
    for m in messages[k:]:
        if m.role == "system":
            m = dataclasses.replace(m, role="user")
        prev = out[-1] if len(out) > start else None
        if (
            prev is not None
            and prev.role == m.role
            and _chat_mergeable(prev)
            and _chat_mergeable(m)
        ):
            out[-1] = _chat_join(prev, m)
            continue
        if prev is None and m.role == "assistant":
            out.append(ChatMessage("user", OPENING))
        out.append(m)
    return tuple(out)
