"""What a chronicler's model wrote, kept and played back.

A live run of a small local model costs minutes a chapter, and its replies are the evidence of
what grounding decided: `ReplyLog` appends every request and reply to a JSONL file (the form of
shared/fixtures/chronicler-small-model), and `Replayed` answers the same requests from such a
file, so a change to grounding, choice or rendering can be measured on what the model really
wrote without the model (`kioku bench chronicle --replay`). A request the file does not hold
(the change altered a prompt) gets an empty reply, as a model that wrote nothing: the chronicler
retries, then falls back to the extractive chapter, and `misses` counts it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kioku.errors import InputError
from kioku.models import ChatRequest, Completion, Usage


def _key(messages: list[tuple[str, str]]) -> str:
    """A request's messages (role, content) as one lookup key."""
    return json.dumps(messages, ensure_ascii=False)


class ReplyLog:
    """The chronicler's model with every request and reply appended to a JSONL file, in the
    form of shared/fixtures/chronicler-small-model (purpose, max_tokens, temperature, messages,
    text, finish_reason, secs): what a model wrote, to read beside what grounding kept."""

    def __init__(self, model: Any, path: Path) -> None:
        self.model = model
        self.path = path

    def complete(self, request: ChatRequest) -> Completion:
        started = time.monotonic()
        c: Completion = self.model.complete(request)
        row = {
            "purpose": request.purpose,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "seqs": list(request.seqs),
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "text": c.text,
            "finish_reason": c.finish_reason,
            "usage": {
                "prompt_tokens": c.usage.prompt_tokens,
                "completion_tokens": c.usage.completion_tokens,
            },
            "secs": round(time.monotonic() - started, 1),
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return c


class Replayed:
    """A chat model that answers each request with the reply a `ReplyLog` file kept for the
    same messages (role and content, in order), with its token counts where the file has them,
    the same prompt's replies in the order they were kept; an unknown request gets an empty
    reply and is counted in `misses` (by purpose)."""

    def __init__(self, path: Path) -> None:
        # a retry may send the very prompt again and get another reply: each request takes
        # the next reply kept for its messages, in the order the log kept them
        self.replies: dict[str, list[Completion]] = {}
        self.misses: list[str] = []
        self._taken: Counter[str] = Counter()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise InputError(f"--replay {path}: {e.strerror or e}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                usage = row.get("usage") or {}
                asked = [(m["role"], m["content"]) for m in row["messages"]]
                self.replies.setdefault(_key(asked), []).append(
                    Completion(
                        row["text"],
                        row.get("finish_reason") or "stop",
                        Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
                    )
                )
            except (ValueError, KeyError, TypeError) as e:
                raise InputError(f"--replay {path}, line {n}: not a reply log row ({e})") from None

    def to_json(self) -> dict[str, Any]:
        """What the replay held and what it lacked (`kioku bench chronicle`'s `replayed`)."""
        return {
            "replies": sum(len(r) for r in self.replies.values()),
            "misses": len(self.misses),
            "misses_by_purpose": dict(Counter(self.misses)),
        }

    def complete(self, request: ChatRequest) -> Completion:
        key = _key([(m.role, m.content) for m in request.messages])
        replies = self.replies.get(key)
        if not replies:
            self.misses.append(request.purpose)
            return Completion("", "stop")
        n = self._taken[key]
        self._taken[key] += 1
        return replies[min(n, len(replies) - 1)]
