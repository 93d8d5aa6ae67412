"""`kioku bench sync`: syncing a stateless client's transcript costs CPU linear in its length.

A stateless client (SillyTavern) resends its whole window every turn. Before issue 11 a
100,000-message body took 175 s of CPU: one transaction per stored message, and difflib's
quadratic matching when messages repeat. For each size N this measures, in CPU seconds of this
process, what `kioku.sync.sync` costs (with every layer attached, on SQLite):

- `first`: the first request of an N-message chat (all N stored);
- `next`: the next turn (N + 2 messages against the log: two appended);
- `repeats`: the next turn of a chat whose N messages all say the same thing ("ok"), the input
  that made difflib quadratic.

The floor: each stays under `FLOOR_CPU_S` at the largest size, and CPU per message grows less
than 3× from the smallest size to the largest (linear, give or take the machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.profiles import LOCAL_64K
from kioku.store import Store
from kioku.sync import Incoming, sync

FLOOR_CPU_S = 1.0
FLOOR_GROWTH = 3.0


def _chat(n: int, text: Callable[[int], str]) -> list[Incoming]:
    return [Incoming("user" if i % 2 == 0 else "assistant", text(i)) for i in range(n)]


def _cpu(f: Callable[[], object]) -> float:
    t0 = time.process_time()
    f()
    return time.process_time() - t0


def measure(n: int, repeated: bool = False) -> dict[str, float]:
    store = Store.open("sqlite://")
    kk = Kioku(store, profile=LOCAL_64K, layers=Layers(store))
    try:
        conv = kk.conversation("bench", system_prompt="You are Mika, a lighthouse keeper.")
        chat = _chat(
            n, (lambda i: "ok") if repeated else (lambda i: f"message {i}: " + "w " * (i % 9))
        )
        first = _cpu(lambda: sync(conv, chat, stateful=False))
        chat = [*chat, Incoming("assistant", "a reply"), Incoming("user", "and then?")]
        nxt = _cpu(lambda: sync(conv, chat, stateful=False))
        rows = kk.store.count_messages("bench")
        if rows != n + 2:
            raise AssertionError(f"sync stored {rows} messages, expected {n + 2}")
        return {"first": round(first, 4), "next": round(nxt, 4)}
    finally:
        kk.store.close()


def run(sizes: Sequence[int] = (2000, 20000)) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": list(sizes), "cpu_s": {}}
    for n in sizes:
        plain = measure(n)
        out["cpu_s"][str(n)] = {**plain, "repeats": measure(n, repeated=True)["next"]}
    lo, hi = str(min(sizes)), str(max(sizes))
    scale = max(sizes) / min(sizes)
    growth = {
        k: round(out["cpu_s"][hi][k] / max(out["cpu_s"][lo][k], 1e-4) / scale, 3)
        for k in ("first", "next", "repeats")
    }
    out["per_message_growth"] = growth
    out["floors"] = {
        f"cpu_s<={FLOOR_CPU_S:g} at {hi}": all(v <= FLOOR_CPU_S for v in out["cpu_s"][hi].values()),
        f"per_message_growth<={FLOOR_GROWTH:g}": all(g <= FLOOR_GROWTH for g in growth.values()),
    }
    return out
