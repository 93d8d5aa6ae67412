"""`/metrics` in the Prometheus text format, for one tenant at a time.

Two sources: what this process measured (turn latency, upstream latency, prompt tokens, prefix
reuse — histograms), and what the store counted for the tenant's conversations across every
process (turns, folds, major GCs, forced cuts, refusals, …; summary durations from the
compaction log; the job queue's depth). A key sees its own tenant's numbers only.

Prefix reuse is estimated without the upstream's help: the share of a prompt's characters that
sit in leading messages identical to the previous prompt of the same conversation — what a
serving engine's prefix cache can reuse.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence

from kioku.models import ChatMessage
from kioku.store import Store

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = (256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
TOP_CONVERSATIONS = 20  # labelled per-conversation series, at most
# store counters every tenant shows, at 0 before the first event
ALWAYS = ("turns", "folds", "major_gcs", "forced_cuts", "refusal", "truncated_replies",
          "card_changes")  # fmt: skip


def prefix_reuse(previous: Sequence[ChatMessage] | None, current: Sequence[ChatMessage]) -> float:
    """Share of `current`'s characters in leading messages identical to `previous`'s."""
    total = sum(len(m.content) + len(m.role) for m in current)
    if not previous or not total:
        return 0.0
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        same += len(b.content) + len(b.role)
    return same / total


class Histogram:
    def __init__(self, name: str, help_: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.help = help_
        self.buckets = tuple(buckets)
        self._data: dict[str, list[float]] = {}  # tenant -> bucket counts..., sum, count
        self._lock = threading.Lock()

    def observe(self, tenant: str, value: float) -> None:
        with self._lock:
            row = self._data.setdefault(tenant, [0.0] * (len(self.buckets) + 2))
            for i, b in enumerate(self.buckets):
                if value <= b:
                    row[i] += 1
            row[-2] += value
            row[-1] += 1

    def render(self, tenant: str) -> list[str]:
        with self._lock:
            row = list(self._data.get(tenant) or [0.0] * (len(self.buckets) + 2))
        lab = f'tenant="{_esc(tenant)}"'
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for b, n in zip(self.buckets, row, strict=False):
            out.append(f'{self.name}_bucket{{{lab},le="{b:g}"}} {n:g}')
        out.append(f'{self.name}_bucket{{{lab},le="+Inf"}} {row[-1]:g}')
        out.append(f"{self.name}_sum{{{lab}}} {row[-2]:.6g}")
        out.append(f"{self.name}_count{{{lab}}} {row[-1]:g}")
        return out


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower())


class Metrics:
    def __init__(self) -> None:
        self.turn_seconds = Histogram(
            "kioku_turn_seconds", "Whole turns as the client saw them.", LATENCY_BUCKETS
        )
        self.overhead_seconds = Histogram(
            "kioku_overhead_seconds",
            "kioku's own share of a turn (turn minus upstream).",
            LATENCY_BUCKETS,
        )
        self.upstream_seconds = Histogram(
            "kioku_upstream_latency_seconds", "Upstream chat completions.", LATENCY_BUCKETS
        )
        self.prompt_tokens = Histogram(
            "kioku_prompt_tokens", "Prompt size kioku built, in tokens.", TOKEN_BUCKETS
        )
        self.prefix_reuse = Histogram(
            "kioku_prefix_reuse_ratio",
            "Share of the prompt identical to the previous prompt of the conversation.",
            RATIO_BUCKETS,
        )
        self._errors: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()

    def error(self, tenant: str, kind: str) -> None:
        with self._lock:
            self._errors[(tenant, kind)] += 1

    def render(self, store: Store, tenant: str) -> str:
        lines: list[str] = []
        for h in (
            self.turn_seconds,
            self.overhead_seconds,
            self.upstream_seconds,
            self.prompt_tokens,
            self.prefix_reuse,
        ):
            lines += h.render(tenant)
        lab = f'tenant="{_esc(tenant)}"'
        lines += [
            "# HELP kioku_errors_total Failed turns by kind.",
            "# TYPE kioku_errors_total counter",
        ]
        with self._lock:
            errors = {k: v for (t, k), v in self._errors.items() if t == tenant}
        for kind, n in sorted(errors.items()):
            lines.append(f'kioku_errors_total{{{lab},kind="{_esc(kind)}"}} {n}')
        lines += _store_metrics(store, tenant, lab)
        return "\n".join(lines) + "\n"


def _store_metrics(store: Store, tenant: str, lab: str) -> Iterable[str]:
    totals = store.tenant_totals(tenant)
    counters = dict(totals.counters)
    for name in ALWAYS:
        counters.setdefault(name, 0)
    for name, value in sorted(counters.items()):
        metric = f"kioku_{_metric_name(name)}_total"
        yield f"# TYPE {metric} counter"
        yield f"{metric}{{{lab}}} {value}"
    yield "# HELP kioku_summary_duration_seconds Summaries, cuts and revisions by kind."
    yield "# TYPE kioku_summary_duration_seconds summary"
    for event, (count, total) in totals.durations.items():
        kl = f'{lab},kind="{_esc(str(event))}"'
        yield f"kioku_summary_duration_seconds_sum{{{kl}}} {total:.6g}"
        yield f"kioku_summary_duration_seconds_count{{{kl}}} {count}"
    yield "# HELP kioku_queue_depth Summary jobs waiting or running."
    yield "# TYPE kioku_queue_depth gauge"
    for status in ("queued", "running"):
        yield f'kioku_queue_depth{{{lab},status="{status}"}} {totals.queue.get(status, 0)}'
    yield "# TYPE kioku_conversations gauge"
    yield f"kioku_conversations{{{lab}}} {totals.conversations}"
    # the conversations whose client breaks the prefix cache most by changing the card
    yield "# HELP kioku_conversation_card_changes Card changes by the client, per conversation."
    yield "# TYPE kioku_conversation_card_changes gauge"
    for cid, n in store.top_counter(tenant, "card_changes", TOP_CONVERSATIONS):
        yield f'kioku_conversation_card_changes{{{lab},conversation="{_esc(cid)}"}} {n}'
