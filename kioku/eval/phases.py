"""One LoCoMo margin read over several fold phases: `kioku eval locomo --phases 0,8,16,24,32,40`.

The question comes at the end of each conversation, so kioku's room for it depends on where the
last fold fell. One reading moves by about ±0.005 with that phase alone, as much as the distance
to a floor, so a change is judged by the margin's mean and its worst phase over several
`--start-at` values, each a whole `kioku.eval.locomo.run` of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

from kioku.counters import counter_from_spec
from kioku.errors import InputError
from kioku.eval.locomo import Models, Options, run
from kioku.tokens import TokenCounter

KIND = "locomo-phases"


def over_phases(
    path: Path | str | None,
    options: Options,
    starts: Sequence[int],
    *,
    counter: TokenCounter | None = None,
    models: Models | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`run` once per start (no samples: a phase is read by its rates), then `summarize`."""
    if not starts:
        raise InputError("--phases takes one or more message indexes, e.g. 0,8,16")
    started = time.monotonic()
    counter = counter or counter_from_spec(options.tokenizer)  # one tokenizer for every phase
    models = models or Models()
    results = []
    for n in starts:
        if log:
            log(f"phase: from message {n}")
        one = replace(options, start_at=n, samples=0)
        results.append(run(path, one, counter=counter, models=models, progress=progress, log=log))
    return {**summarize(results), "runtime_s": round(time.monotonic() - started, 1)}


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each phase's margins and rates, then every margin's mean and worst over the phases (a
    margin some phase lacks is left out of both)."""
    phases = [
        {
            "start_at": r["start_at"],
            "margins": r["margins"],
            "answer_in_context": {
                arm: {
                    half: s[half]["answer_in_context"] for half in ("dev", "heldout") if half in s
                }
                for arm, s in r["strategies"].items()
            },
        }
        for r in results
    ]
    mean: dict[str, dict[str, float]] = {}
    worst: dict[str, dict[str, float]] = {}
    for half in ("dev", "heldout"):
        rows = [p["margins"].get(half) or {} for p in phases]
        keys = [k for k in rows[0] if all(r.get(k) is not None for r in rows)] if rows else []
        if keys:
            mean[half] = {k: round(fmean(r[k] for r in rows), 4) for k in keys}
            worst[half] = {k: min(r[k] for r in rows) for k in keys}
    first = results[0] if results else {}
    return {
        "kind": KIND,
        "budget": first.get("budget"),
        "arms": first.get("arms"),
        "start_at": [p["start_at"] for p in phases],
        "phases": phases,
        "margins_mean": mean,
        "margins_min": worst,
    }
