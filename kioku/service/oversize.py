"""A prompt the upstream refused for its size, and the window that refusal teaches.

Servers say it in their own words, and some say the numbers: llama.cpp answers 400 with
`type: exceed_context_size_error`, `n_prompt_tokens` and `n_ctx` ("request (4476 tokens) exceeds
the available context size (4096 tokens)"; older builds only "the request exceeds the available
context size"), llama-cpp-python "Requested tokens (5000) exceed context window of 4096", vLLM
and OpenAI "This model's maximum context length is 8192 tokens. However, you requested 9000
tokens (8000 in the messages, 1000 in the completion)" (OpenAI's `code` is
`context_length_exceeded`). When the window was a wrong guess, the service answers that turn
with an error naming `--window` and the size the server said, and shrinks its window for the
next turns (`learned_window`): one wrong guess costs one turn, not the conversation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Oversize", "learned_window", "oversize_of"]

# what a refusal for size says, whatever else it says
SAYS_TOO_LARGE = re.compile(
    r"context[ _](?:size|length|window)|maximum context|exceed_context_size|n_ctx|"
    r"requested tokens|too many tokens|prompt is too long",
    re.IGNORECASE,
)
LIMIT_PATTERNS = (
    re.compile(r"available context size \((\d+) tokens?\)", re.IGNORECASE),
    re.compile(r"exceed context window of (\d+)", re.IGNORECASE),
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),
    re.compile(r"context (?:window|length|size) (?:is|of) (?:only )?(\d+)", re.IGNORECASE),
)
PROMPT_PATTERNS = (
    re.compile(r"request \((\d+) tokens?\) exceeds", re.IGNORECASE),
    re.compile(r"requested tokens \((\d+)\)", re.IGNORECASE),
    re.compile(r"(\d+) in the messages", re.IGNORECASE),
    re.compile(r"(?:resulted in|has) (\d+) (?:input )?tokens", re.IGNORECASE),
)
# with no number to go by, each refusal takes this share off the window
BLIND_SHRINK = 0.85
SMALLEST_WINDOW = 512


@dataclass(frozen=True)
class Oversize:
    """The numbers a refusal for size said: the server's window and the prompt as it counted
    it (either may be None)."""

    limit: int | None
    prompt: int | None


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for p in patterns:
        m = p.search(text)
        if m:
            return int(m.group(1))
    return None


def oversize_of(status: int, message: str, body: Any = None) -> Oversize | None:
    """The refusal's numbers when a 4xx says the prompt is larger than the server's window,
    else None. `body` is the upstream's JSON (for llama.cpp's `n_ctx` and `n_prompt_tokens`)."""
    if status not in (400, 413, 422):
        return None
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code = str(err.get("code") or "") + " " + str(err.get("type") or "")
    if not (SAYS_TOO_LARGE.search(message) or SAYS_TOO_LARGE.search(code)):
        return None

    def number(key: str) -> int | None:
        v = err.get(key)
        return v if isinstance(v, int) and v > 0 else None

    return Oversize(
        number("n_ctx") or _first(LIMIT_PATTERNS, message),
        number("n_prompt_tokens") or _first(PROMPT_PATTERNS, message),
    )


def learned_window(window: int, sent_tokens: int, said: Oversize) -> int:
    """The window to keep prompts within after a refusal of a prompt kioku counted as
    `sent_tokens` in a `window`: the server's own size, in kioku's tokens (when the server
    counted the prompt as more than kioku did, its size shrinks by as much), and always less
    than the window the refused prompt was built for."""
    size = float(said.limit or window)
    if said.prompt and sent_tokens and said.prompt > sent_tokens:
        size *= sent_tokens / said.prompt
    if size >= window:
        size = window * BLIND_SHRINK
    return max(SMALLEST_WINDOW, int(size))
