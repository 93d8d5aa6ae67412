"""One budget for the whole rendered prompt.

A serving engine reads every token of the prompt it renders: the system prompt, the memory
exchange, each raw message with the chat template's role markers around it, what kioku added to
a turn (recollections, per-turn instructions) and the new message; the reply needs its reserve
beside them. kioku decides everything on that one number — when to schedule a summary, when to
cut, how much raw history to keep after a fold, how much room recollections get, and whether a
message can ever be served — so nothing is decided on a count the server does not see.

`Template` is what the chat template adds: tokens per message and per prompt (the reply's
opening). A real tokenizer names its template (`ChatML`, say); an estimator that calibrates
itself on the server's `usage.prompt_tokens` learns both figures. `Margin` is the share of the
budget kept back for counting error, learned the same way: how far kioku's account of its recent
prompts fell short of what the server read.

`share` splits a room among parts that each want some of it, with priorities and a ratio for the
part that takes "a share of what is left" — rich's `ratio_resolve` in kioku's terms.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kioku.tokens import TokenCounter


@dataclass(frozen=True)
class Template:
    """Tokens a chat template spends besides the messages' contents (fractional when an
    estimator learned them from the server's counts)."""

    per_message: float = 6  # role markers and separators around one message
    per_prompt: float = 4  # the reply's opening (e.g. "<|im_start|>assistant\n"), a BOS

    def messages(self, n: int) -> int:
        """The template's tokens for a prompt of `n` messages."""
        return math.ceil(n * self.per_message + self.per_prompt)


# What an unknown template costs at most among the common ones (per message / per prompt: from
# ~4/1 for bracket-style templates to 5/5 for header-style ones with a BOS; ChatML 5/3):
# counting a little high only leaves a little room unused.
DEFAULT_TEMPLATE = Template()
CHATML = Template(per_message=5, per_prompt=3)

# Share of the budget kept back when the counter is an estimate (calibrated estimates of whole
# prompts stay within ~3 % on ja/en/zh; `kioku bench tokens`).
ESTIMATE_MARGIN = 0.04


def template_of(counter: TokenCounter) -> Template:
    """The chat template's overhead as the counter knows it: a real tokenizer names its
    template; an estimator (calibrated or not) carries its own per-message figures."""
    named = getattr(counter, "template", None)
    if isinstance(named, Template):
        return named
    est: Any = getattr(counter, "current", counter)  # a CalibratedEstimator's fitted snapshot
    per_message = getattr(est, "per_message", None)
    per_prompt = getattr(est, "per_prompt", None)
    if isinstance(per_message, int | float) and isinstance(per_prompt, int | float):
        return Template(float(per_message), float(per_prompt))
    return DEFAULT_TEMPLATE


def is_exact(counter: TokenCounter) -> bool:
    """Whether the counter is the serving model's own tokenizer (no margin needed up front)."""
    return bool(getattr(counter, "exact", False))


def usable(budget: int, margin: float) -> int:
    """The prompt tokens kioku plans for: the budget less a share kept back for counting
    error."""
    return budget - math.ceil(budget * margin)


# The margin is a quarter more than the worst recent shortfall, over the last 50 prompts, at
# least 0.5 % (none for the model's own tokenizer until it falls short), at most 6 % (the
# estimate before calibration misses Japanese by ~5 %), and 4 % until five prompts were seen.
MARGIN_WINDOW = 50
MARGIN_WARMUP = 5
MARGIN_MIN = 0.005
MARGIN_MAX = 0.06


class Margin:
    """How far kioku's count of its prompts falls short of what the server reports.

    Every reply's `usage.prompt_tokens` is compared with the prompt's account (stored message
    counts, the template's figures, the server's own template): the share kept back is what
    the recent prompts needed, so an estimate, a stale count or an unknown template cannot
    overflow the window, and an exact count wastes nothing. Thread-safe enough: a deque."""

    def __init__(self, exact: bool = False) -> None:
        self.exact = exact
        self._short: deque[float] = deque(maxlen=MARGIN_WINDOW)

    def observe(self, counted: int, observed: int) -> None:
        if observed > 0:
            self._short.append(max(0.0, (observed - counted) / observed))

    @property
    def share(self) -> float:
        seen = list(self._short)
        if len(seen) < MARGIN_WARMUP:
            return max(seen, default=0.0) * 1.25 if self.exact else ESTIMATE_MARGIN
        worst = 1.25 * max(seen)
        return min(MARGIN_MAX, worst if self.exact else max(MARGIN_MIN, worst))


@dataclass(frozen=True)
class Account:
    """Where a prompt's tokens went, by part, and what was left out, by part.

    `parts` add up to the rendered prompt: contents plus `template` (the chat template's tokens
    for every message and the reply's opening). `dropped` names what did not fit, in tokens."""

    parts: Mapping[str, int]
    reserve: int
    window: int
    raw_messages: int = 0
    raw_start: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)

    def __getitem__(self, name: str) -> int:
        return self.parts.get(name, 0)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total + self.reserve <= self.window

    # the names the account has always had
    @property
    def system(self) -> int:
        return self["system"]

    @property
    def memory(self) -> int:
        return self["memory"]

    @property
    def raw(self) -> int:
        return self["raw"]

    @property
    def recollections(self) -> int:
        return self["recollections"]

    @property
    def instructions(self) -> int:
        return self["instructions"]

    @property
    def new(self) -> int:
        return self["new"]

    @property
    def overhead(self) -> int:
        return self["template"]

    @property
    def dropped_recollections(self) -> int:
        return self.dropped.get("recollections", 0)


@dataclass(frozen=True)
class Want:
    """A part asking for room: `tokens` it would take whole, the least it takes at all
    (`minimum`; 0 = may be left out), and `ratio` of the room left after higher priorities
    (1 = all of it)."""

    name: str
    tokens: int
    priority: int = 0
    minimum: int = 0
    ratio: float = 1.0


def share(room: int, wants: Sequence[Want]) -> dict[str, int]:
    """How many tokens each part may use. Higher priority first; within one priority, in the
    order given. A part gets min(tokens, ratio × what is left) if that reaches its minimum,
    else nothing. The sum never exceeds `room`."""
    out: dict[str, int] = {}
    left = max(0, room)
    for w in sorted(wants, key=lambda w: -w.priority):
        cap = min(w.tokens, math.floor(left * w.ratio))
        got = cap if cap >= max(w.minimum, 1) else 0
        out[w.name] = got
        left -= got
    return out
