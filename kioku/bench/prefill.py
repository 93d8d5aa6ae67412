"""Prompt evaluation on a real serving engine: the prompts a replay sent, timed.

`kioku bench prefix` counts the tokens a prompt shares with the one before it; this asks what
they cost on the engine users run. Each arm's prompts (kioku's as its upstream received them,
the sliding window's) are sent to an OpenAI-compatible server such as llama.cpp's, in turn
order, with `max_tokens` 1, so a request's time is its prompt evaluation (plus one token, the
same for every arm). One arm after the other, never interleaved: a llama.cpp server keeps only
the previous request's prefix, so an arm's turn finds its own previous prompt cached, as it
would for a single user. Wall-clock times from a shared machine are only comparable within one
run: read the arms' ratio, not the seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from rich.progress import Progress

from kioku.errors import ConfigError
from kioku.models import ChatMessage


def _q(values: list[float], share: float) -> float:
    return float(np.percentile(values, 100 * share)) if values else 0.0


@dataclass
class Timed:
    """One arm's requests: the seconds of those the engine served, in turn order."""

    seconds: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)  # the turn each of `seconds` timed
    failed: int = 0
    prompt_tokens: int = 0  # the engine's own count (`usage.prompt_tokens`)

    def summary(self, full_from: int | None = None) -> dict[str, Any]:
        """`full_from`: the turn the arm's window was first full (its first cache break after
        the cold start), for the median and p90 from then on."""
        s = self.seconds
        full = [x for x, t in zip(s, self.turns, strict=True) if t >= (full_from or 0)]
        return {
            "turns": len(s),
            "failed": self.failed,
            "prompt_tokens": self.prompt_tokens,
            "total_s": round(sum(s), 3),
            "p50_s": round(_q(s, 0.5), 4),
            "p90_s": round(_q(s, 0.9), 4),
            "max_s": round(max(s, default=0.0), 4),
            "p50_s_full": round(_q(full, 0.5), 4) if full_from is not None else None,
            "p90_s_full": round(_q(full, 0.9), 4) if full_from is not None else None,
        }


def _unreachable(url: str, e: httpx.HTTPError) -> ConfigError:
    return ConfigError(f"--time-on {url}: {type(e).__name__}: {e}")


def check_reachable(url: str, timeout_s: float = 10.0) -> None:
    """Fail before a long replay, not after it: any HTTP answer will do."""
    try:
        httpx.get(f"{url.rstrip('/')}/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise _unreachable(url, e) from None


def time_prompts(
    url: str,
    prompts: Sequence[Sequence[ChatMessage]],
    *,
    timeout_s: float = 600.0,
    advance: Callable[[], None] | None = None,
) -> Timed:
    """Send `prompts` in order to `url` (the API root, …/v1) and time each. A turn the replay
    failed (no prompt) and one the server refuses count as failed and are not timed; a server
    that cannot be reached is a ConfigError."""
    out = Timed()
    endpoint = f"{url.rstrip('/')}/chat/completions"
    with httpx.Client(timeout=timeout_s) as client:
        for turn, messages in enumerate(prompts):
            if not messages:
                out.failed += 1
                continue
            body = {
                "messages": [m.to_json() for m in messages],
                "max_tokens": 1,
                "temperature": 0,
                "stream": False,
            }
            start = time.perf_counter()
            try:
                r = client.post(endpoint, json=body)
            except httpx.HTTPError as e:  # the engine is not there: no figure to give
                raise _unreachable(url, e) from None
            took = time.perf_counter() - start
            if advance:
                advance()
            if r.status_code != 200:
                out.failed += 1
                continue
            out.seconds.append(took)
            out.turns.append(turn)
            out.prompt_tokens += int((r.json().get("usage") or {}).get("prompt_tokens") or 0)
    return out


def time_arms(
    url: str,
    arms: Mapping[str, Sequence[Sequence[ChatMessage]]],
    *,
    baseline: str = "sliding_window",
    full_from: Mapping[str, int | None] | None = None,
) -> dict[str, Any]:
    """Each arm timed on `url`, one after the other, with a progress bar; `<arm>_vs_<baseline>`:
    its total time over the baseline's; `<arm>_p90_vs_<baseline>_p50_full`: its p90 turn over
    the baseline's median once full (`full_from`: each arm's first full turn)."""
    full_from = full_from or {}
    total = sum(len(p) for p in arms.values())
    with Progress(console=None, transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"timing prompts on {url}", total=total)
        timed = {
            name: time_prompts(url, prompts, advance=lambda: progress.advance(task))
            for name, prompts in arms.items()
        }
    out: dict[str, Any] = {
        "url": url,
        **{name: t.summary(full_from.get(name)) for name, t in timed.items()},
    }
    base = sum(timed[baseline].seconds) if baseline in timed else 0.0
    median = out[baseline]["p50_s_full"] if baseline in timed else None
    for name, t in timed.items():
        if name != baseline and base > 0:
            out[f"{name}_vs_{baseline}"] = round(sum(t.seconds) / base, 4)
        if name != baseline and median:
            out[f"{name}_p90_vs_{baseline}_p50_full"] = round(out[name]["p90_s"] / median, 4)
    return out
