"""Compaction statistics from the compaction log: is memory being written, and at what cost?

The seed kept this table by hand (chapters: 133, median 27 s, 1,110 chars on average; major GC: 17,
34 s, 4,123 chars; forced cuts: 3) and it is what told them refusals were absorbed by the retry
and that en/zh synopses kept growing. Here it is computed from `store.log_entries()`: counts per
event and outcome, median duration, mean input and output tokens. Each outcome reads as what
happened (`kioku.outcomes`): a fallback "fell back", a rejected reply "rejected", never "ok".
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from rich.table import Table

from kioku.outcomes import event_outcome

# the events the worker logs, in the order the table shows them; others follow alphabetically
EVENTS: tuple[str, ...] = (
    "chapter",
    "synopsis",
    "cut",
    "fold",
    "refusal",
    "truncated",
    "unparseable",
    "retry",
    "compress",
    "fallback",
    "forced_cut",
    "truncated_reply",
)


class HasLog(Protocol):
    def log_entries(self, conversation_id: str | None = None) -> list[dict[str, Any]]: ...


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def stats_from_entries(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The statistics of log rows (dicts with event, outcome, duration_s, input/output tokens)."""
    rows = list(entries)
    by_event: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_event.setdefault(str(r["event"]), []).append(r)
    order = [e for e in EVENTS if e in by_event] + sorted(set(by_event) - set(EVENTS))
    events: dict[str, dict[str, Any]] = {}
    for name in order:
        group = by_event[name]
        outcomes: dict[str, int] = {}
        for r in group:
            key = str(r.get("outcome") or "ok")
            if key == "ok":
                # rows written before each event had its own word called a fallback "ok"
                key = event_outcome(name)
            outcomes[key] = outcomes.get(key, 0) + 1
        durations = [float(r["duration_s"]) for r in group if r.get("duration_s") is not None]
        inputs = [float(r["input_tokens"]) for r in group if r.get("input_tokens") is not None]
        outputs = [float(r["output_tokens"]) for r in group if r.get("output_tokens") is not None]
        events[name] = {
            "count": len(group),
            "outcomes": outcomes,
            "median_duration_s": _median(durations),
            "mean_input_tokens": _mean(inputs),
            "mean_output_tokens": _mean(outputs),
        }
    return {
        "rows": len(rows),
        "conversations": len({r.get("conversation_id") for r in rows}),
        "first_at": min((float(r["at"]) for r in rows if r.get("at") is not None), default=None),
        "last_at": max((float(r["at"]) for r in rows if r.get("at") is not None), default=None),
        "events": events,
    }


def compaction_stats(store: HasLog, conversation_id: str | None = None) -> dict[str, Any]:
    """Statistics of one conversation's compaction log, or of all conversations."""
    return stats_from_entries(store.log_entries(conversation_id))


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def stats_table(stats: Mapping[str, Any], title: str = "Compaction") -> Table:
    """A rich table of `compaction_stats` output: one row per event."""
    table = Table(
        title=f"{title} ({stats['rows']} log rows, {stats['conversations']} conversations)"
    )
    table.add_column("event")
    table.add_column("count", justify="right")
    table.add_column("outcomes")
    table.add_column("median s", justify="right")
    table.add_column("mean in tok", justify="right")
    table.add_column("mean out tok", justify="right")
    for name, e in stats["events"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(e["outcomes"].items()))
        table.add_row(
            name,
            str(e["count"]),
            outcomes,
            _fmt(e["median_duration_s"], 1),
            _fmt(e["mean_input_tokens"]),
            _fmt(e["mean_output_tokens"]),
        )
    return table
