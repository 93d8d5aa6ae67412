"""`kioku bench turn`: the cost of one turn must not grow with the length of the conversation.

For each history size a conversation is laid out in the store as a long-lived one looks: N
archived messages, memory (a synopsis and chapters) covering all but the raw window, and the raw
window itself. Then `prepare()` + `record()` run turn after turn, with every layer attached
(recall over the whole archive, notes, the tic guard). The baseline is the naive design most
chat apps start with: load the whole history every turn and count it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from kioku.engine import Conversation, Kioku
from kioku.layers import Layers
from kioku.memory import MemoryItem
from kioku.messages import Message
from kioku.profiles import LOCAL_64K
from kioku.store import Store

TOPICS = (
    "the lighthouse keeper's cat slept on the warm lamp room floor all afternoon",
    "we argued about whether the harbour festival fireworks were better last year",
    "my sister Hana finally passed her driving test on the third try",
    "the bakery on Third Street started selling matcha croissants again",
    "I promised to take you to the observatory when the comet comes back",
    "rain again today so I stayed in and reorganised the bookshelf by colour",
)


def _text(i: int) -> str:
    return f"{TOPICS[i % len(TOPICS)]} (day {i // 40}, note {i})"


def seed_history(store: Store, cid: str, n: int, raw_n: int = 120) -> None:
    """Lay out `n` messages as a compacted conversation: memory covers [0, n - raw_n)."""
    store.ensure_conversation(cid, system_prompt="You are Mika, a lighthouse keeper.")
    messages = []
    for i in range(n):
        m = Message.of(
            "user" if i % 2 == 0 else "assistant", _text(i), "you" if i % 2 == 0 else "Mika"
        )
        messages.append((m, len(m.text) // 4))
    store.append_many(cid, messages)
    raw_start = max(0, n - raw_n)
    items: list[MemoryItem] = []
    if raw_start:
        cuts = [0, raw_start // 2, raw_start * 3 // 4, raw_start]
        items = [MemoryItem("synopsis", 0, cuts[1] - 1, "Synopsis. " * 120, 240)]
        items += [
            MemoryItem("chapter", lo, hi - 1, "Chapter text. " * 60, 180)
            for lo, hi in zip(cuts[1:-1], cuts[2:], strict=True)
            if hi > lo
        ]
    # one fold puts the memory in place and moves the raw window (memory version 1)
    store.fold(cid, activate=(), retire=(), raw_start=raw_start, add=items)


def _p50(xs: Sequence[float]) -> float:
    return round(statistics.median(xs), 3)


def measure(convs: Sequence[Conversation], turns: int) -> list[list[float]]:
    """Turn times per conversation, taken round-robin so that whatever else the machine does
    during the run weighs on every history size alike."""
    for conv in convs:
        conv.prepare("warm up: what did we talk about?")  # builds caches and the recall index
        conv.record("We talked about the lighthouse.")
    times: list[list[float]] = [[] for _ in convs]
    for i in range(turns):
        for conv, out in zip(convs, times, strict=True):
            t0 = time.perf_counter()
            conv.prepare(f"do you remember {TOPICS[i % len(TOPICS)].split()[1]}? turn {i}")
            out.append((time.perf_counter() - t0) * 1000)
            conv.record(f"Of course I remember, turn {i}.")
    return times


def naive(store: Store, cid: str, turns: int) -> list[float]:
    """Load every message and count it, every turn: the design without memory management."""
    times = []
    for _ in range(turns):
        t0 = time.perf_counter()
        entries = store.entries(cid)
        total = sum(len(e.text) // 4 for e in entries)
        assert total >= 0
        times.append((time.perf_counter() - t0) * 1000)
    return times


def run(
    sizes: Sequence[int] = (500, 5000, 50000), turns: int = 100, naive_turns: int = 10
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sizes": list(sizes),
        "turns": turns,
        "p50_ms": {},
        "p95_ms": {},
        "naive_p50_ms": {},
    }
    stores, convs = [], []
    for n in sizes:
        store = Store.open("sqlite://")
        seed_history(store, f"history-{n}", n)
        kk = Kioku(store, profile=LOCAL_64K, layers=Layers(store))
        stores.append(store)
        convs.append(kk.conversation(f"history-{n}"))
    for n, t in zip(sizes, measure(convs, turns), strict=True):
        out["p50_ms"][str(n)] = _p50(t)
        out["p95_ms"][str(n)] = round(sorted(t)[int(len(t) * 0.95) - 1], 3)
    for n, store in zip(sizes, stores, strict=True):
        out["naive_p50_ms"][str(n)] = _p50(naive(store, f"history-{n}", naive_turns))
        store.close()
    lo, hi = str(min(sizes)), str(max(sizes))
    out["ratio_p50"] = round(out["p50_ms"][hi] / out["p50_ms"][lo], 3)
    out["naive_ratio_p50"] = round(out["naive_p50_ms"][hi] / out["naive_p50_ms"][lo], 3)
    out["floors"] = {"ratio_p50<=1.2": out["ratio_p50"] <= 1.2}
    return out
