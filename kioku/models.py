"""The chat model boundary: one method, `complete(request) -> Completion`.

Replies and summaries may come from different models (a fast one for the turn, a stronger one for
background compaction), so the engine holds two `ChatModel`s. A completion always carries its
`finish_reason`: a "length" finish is never passed off as a finished reply.
`ScriptedModel` is the double every test uses: it answers from a script and records each request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from kioku.errors import StoreError
from kioku.messages import Role


@dataclass(frozen=True)
class ToolCall:
    """A function call an assistant message asks for: the protocol's `tool_calls` entry."""

    id: str
    name: str
    arguments: str  # JSON text exactly as the model wrote it

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ContentPart:
    """One entry of a content array: text, or a media part (an image) that the store keeps as a
    blob named by its sha256, so a prompt holds the name and the data is read only to send it."""

    text: str = ""
    ref: str | None = None

    def to_json(self, media: Mapping[str, Any]) -> dict[str, Any]:
        if self.ref is None:
            return {"type": "text", "text": self.text}
        try:
            return dict(media[self.ref])
        except KeyError:
            raise StoreError(
                f"media part {self.ref[:12]} of a stored message is missing from the blobs "
                "table; the message cannot be sent as it was written"
            ) from None


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str  # the text (of every text part): what is counted, compared and summarized
    # The protocol beyond text; all empty for a plain message, which is sent as role + content.
    parts: tuple[ContentPart, ...] = ()  # content as an array, in order (images)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # a tool result's function (a legacy `function` message without id)
    no_content: bool = False  # `content: null`: an assistant turn that only calls tools

    @property
    def refs(self) -> tuple[str, ...]:
        """The blobs this message needs to be sent."""
        return tuple(p.ref for p in self.parts if p.ref is not None)

    def to_json(self, media: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The message as the protocol writes it; `media` maps blob hashes to their parts."""
        if not (self.parts or self.tool_calls or self.tool_call_id or self.name or self.no_content):
            return {"role": self.role, "content": self.content}
        out: dict[str, Any] = {"role": self.role}
        if self.name:
            out["name"] = self.name
            if not self.tool_call_id:
                out["role"] = "function"
        if self.parts:
            out["content"] = [p.to_json(media or {}) for p in self.parts]
        else:
            out["content"] = None if self.no_content else self.content
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out

    def prefixed(self, text: str) -> ChatMessage:
        """The same message with `text` in front of its content (recollections next to the
        new user message)."""
        parts = self.parts
        if parts:
            parts = (ContentPart(text), *parts)
        return replace(self, content=text + self.content, parts=parts)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    max_tokens: int = 1024
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    purpose: str = "reply"  # "reply" | "chapter" | "synopsis" | "cut" | "notes" | "eval": for logs
    extra: dict[str, Any] = field(default_factory=dict)
    media: Mapping[str, Any] = field(default_factory=dict)  # blob hash -> content part
    # the messages a chronicler request shows, in order: its transcript carries no numbers
    # (`kioku.chronicle_prompt`), so logs and replays learn here what it read; never sent
    seqs: tuple[int, ...] = ()

    def to_json(self, model: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": [m.to_json(self.media) for m in self.messages],
            "max_tokens": self.max_tokens,
        }
        if model:
            body["model"] = model
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.stop:
            body["stop"] = list(self.stop)
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str = "stop"
    usage: Usage = Usage()
    model: str = ""
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn may call tools instead of answering

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@runtime_checkable
class ChatModel(Protocol):
    def complete(self, request: ChatRequest) -> Completion: ...


Script = str | Completion | Exception | Callable[[ChatRequest], "str | Completion"]


class ScriptedModel:
    """A chat model that answers from a queue of scripted replies and records every request.

    Each queued item is a reply text, a full `Completion` (to script `finish_reason="length"`), an
    exception to raise, or a callable that computes the reply from the request. When the queue is
    empty, `default` answers (a callable or text); with no default, an empty queue is an error so a
    test never passes on replies nobody scripted.
    """

    def __init__(
        self,
        replies: Iterable[Script] = (),
        default: Script | None = None,
        name: str = "scripted",
    ) -> None:
        self._queue: list[Script] = list(replies)
        self.default = default
        self.name = name
        self.history: list[ChatRequest] = []
        self._lock = threading.Lock()

    def enqueue(self, *replies: Script) -> ScriptedModel:
        with self._lock:
            self._queue.extend(replies)
        return self

    @property
    def pending(self) -> int:
        return len(self._queue)

    def prompts(self, purpose: str | None = None) -> list[str]:
        """Every request flattened to text, optionally only those of one purpose."""
        return [
            "\n".join(m.content for m in r.messages)
            for r in self.history
            if purpose is None or r.purpose == purpose
        ]

    def complete(self, request: ChatRequest) -> Completion:
        with self._lock:
            self.history.append(request)
            item = self._queue.pop(0) if self._queue else self.default
        if item is None:
            raise AssertionError(
                f"ScriptedModel {self.name!r} got an unscripted request ({request.purpose}); "
                "enqueue a reply or set default"
            )
        if isinstance(item, Exception):
            raise item
        if callable(item) and not isinstance(item, Completion):
            item = item(request)
        if isinstance(item, Completion):
            return item
        prompt_tokens = sum(len(m.content) for m in request.messages) // 3
        return Completion(
            text=str(item),
            finish_reason="stop",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(str(item)) // 3),
            model=self.name,
        )
