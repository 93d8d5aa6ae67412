"""The chat-completions answer, read in one place: a completion's JSON and an SSE stream.

kioku reads answers of OpenAI-compatible servers in two places: its own HTTP client
(`kioku.client`, sync and async) and the proxy's upstream (`kioku.service.upstream`), which
relays the bytes to its client and records what they said. Both read them here, so a server's
answer means the same thing everywhere, and breaks the same way:

- a completion without `choices[0]`, or a body that is not a JSON object, is a `ModelError`;
- a `data:` line of a stream that is not JSON is a `ModelError` (the stream is broken: a reply
  read from it would be a guess);
- a stream's `{"error": …}` event is recorded as `StreamState.error` (the proxy relays it as
  the upstream wrote it; the client raises it);
- tool calls are read from `message.tool_calls`, or assembled from a stream's deltas (id and
  name once, the arguments in fragments, by the call's `index`);
- a number kioku reads (`usage`, an `index`) that is not a whole number a server could mean
  (`1e999`, `Infinity`, `"12"`, `-3`) is ignored: `usage` counts as unreported and the reply
  is kept (a `usage` of `1e999` once threw a valid reply away as a 500).

Every choice is read (`n > 1`); choice 0 is the one kioku records as the reply.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from kioku.errors import ModelError
from kioku.models import Completion, ToolCall, Usage

# a count past this is no count of tokens (and would not fit a database integer)
_COUNT_LIMIT = 2**53


def count(value: Any, default: int = 0) -> int:
    """A whole number a server sent, or `default` when it is none: a bool, a string, a
    fraction, a negative, an infinity or a number past 2^53."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return default
    return int(value) if 0 <= value < _COUNT_LIMIT else default


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    fields = (raw.get("prompt_tokens"), raw.get("completion_tokens"))
    counts = [0 if v is None else count(v, -1) for v in fields]
    if min(counts) < 0:
        return Usage()  # a field that is no count: none of it is believed (it calibrates)
    return Usage(*counts)


def _arguments(raw: Any) -> str:
    # the protocol sends a JSON string; some servers send the object itself
    return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)


def tool_calls_of(raw: Any) -> tuple[ToolCall, ...]:
    """`message.tool_calls` as kioku keeps them; entries that are not function calls are
    skipped (nothing else exists in the protocol today)."""
    out: list[ToolCall] = []
    for call in raw if isinstance(raw, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            out.append(
                ToolCall(
                    str(call.get("id") or ""), str(fn["name"]), _arguments(fn.get("arguments"))
                )
            )
    return tuple(out)


def _choice(choice: dict[str, Any], usage: Usage, model: str) -> Completion:
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    text = message.get("content")
    return Completion(
        text=text if isinstance(text, str) else "",
        finish_reason=str(choice.get("finish_reason") or "unknown"),
        usage=usage,
        model=model,
        tool_calls=tool_calls_of(message.get("tool_calls")),
    )


def read_choices(payload: Any, where: str, model: str = "") -> list[Completion]:
    """Every choice of a completion, in index order (choice 0 first). `where` names the server
    in the error; `model` stands in when the payload names none."""
    try:
        choices = sorted(payload["choices"], key=lambda c: count(c.get("index")))
        usage = _usage(payload.get("usage"))
        name = str(payload.get("model") or model or "")
        out = [_choice(c, usage, name) for c in choices]
        if not out:
            raise IndexError("no choices")
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise ModelError(f"{where} answered without choices[0]: {str(payload)[:300]}") from e
    return out


def read_completion(payload: Any, where: str, model: str = "") -> Completion:
    """Choice 0 of a completion: what kioku records as the reply."""
    return read_choices(payload, where, model)[0]


def read_json(text: str, where: str) -> Any:
    """A completion's body; anything but JSON is the server's fault, said as such. A number
    that is no JSON number (`Infinity`, `1e999`, which Python reads as an infinity) is read as
    null, so the body can be written out again as JSON for the client."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ModelError(f"{where} answered with something other than JSON: {text[:200]!r}") from e
    return _finite(value) if _NON_FINITE.search(text) else value


_NON_FINITE = re.compile(r"Infinity|NaN|[eE]\+?\d{3}")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@dataclass
class _Choice:
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments…]

    def take(self, delta: dict[str, Any]) -> str:
        text = delta.get("content")
        text = text if isinstance(text, str) else ""
        if text:
            self.parts.append(text)
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            at = self.calls.setdefault(count(call.get("index")), ["", ""])
            fn = call.get("function")
            fn = fn if isinstance(fn, dict) else {}
            at[0] = at[0] or str(call.get("id") or "")
            at[1] = at[1] or str(fn.get("name") or "")
            if fn.get("arguments") is not None:
                at.append(_arguments(fn["arguments"]))
        return text

    def completion(self, usage: Usage, model: str) -> Completion | None:
        if self.finish_reason is None:
            return None
        calls = tuple(
            ToolCall(c[0], c[1], "".join(c[2:])) for _, c in sorted(self.calls.items()) if c[1]
        )
        return Completion("".join(self.parts), self.finish_reason, usage, model, calls)


class StreamState:
    """What an SSE stream said so far. Feed it every line with `take`; it returns choice 0's
    text delta. At the end, `completion()` is choice 0 (None if it never finished) and
    `completions()` every finished choice."""

    def __init__(self, where: str = "the server", model: str = "") -> None:
        self.where = where
        self.model = model
        self.usage = Usage()
        self.done = False  # saw `data: [DONE]`
        self.error: str | None = None  # an `{"error": …}` event's message
        self._choices: dict[int, _Choice] = {}

    def _at(self, index: int) -> _Choice:
        return self._choices.setdefault(index, _Choice())

    def take(self, line: str) -> str:
        if not line.startswith("data:"):
            return ""  # comments (keep-alives), `event:` and `id:` lines, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return ""
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ModelError(
                f"the stream from {self.where} sent a line that is not JSON: {data[:200]!r}"
            ) from e
        if not isinstance(chunk, dict):
            raise ModelError(f"the stream from {self.where} sent {data[:200]!r}, not an object")
        if chunk.get("error"):
            err = chunk["error"]
            self.error = str(err.get("message") if isinstance(err, dict) else err)[:500]
            return ""
        self.model = str(chunk.get("model") or self.model)
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        out = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = count(choice.get("index"))
            state = self._at(index)
            delta = choice.get("delta")
            text = state.take(delta) if isinstance(delta, dict) else ""
            if index == 0:
                out += text
            if choice.get("finish_reason"):
                state.finish_reason = str(choice["finish_reason"])
        return out

    @property
    def text(self) -> str:
        return "".join(self._at(0).parts)

    @property
    def finish_reason(self) -> str | None:
        return self._at(0).finish_reason

    def completion(self) -> Completion | None:
        return self._at(0).completion(self.usage, self.model)

    def completions(self) -> list[Completion]:
        done = (c.completion(self.usage, self.model) for _, c in sorted(self._choices.items()))
        return [c for c in done if c is not None]
