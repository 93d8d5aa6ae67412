"""Does old evidence survive? LoCoMo's old questions traced to the turns that answer them.

`kioku eval locomo` asks whether an answer is in the context; this asks the question one step
earlier, of the memory alone: for every question whose evidence is old (OLD_AGE sessions or more
before the end), was an evidence turn ever picked into a memory item (any chapter or synopsis
written on the way), and is it still in the active memory at the end — a synopsis or chapter
line carrying its seq, or a note from it that the memory exchange shows? A chapter keeps a
turn only for a while: what decides recall of old facts is what outlives the major GCs.

    python -m kioku.bench.survival --conversations 0-4 --budget 4096 --json

Replays generational kioku with every layer on (notes included) on the extractive chronicler,
like the eval's `generational` arm, on the same simulated clock (30 s a turn).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kioku.counters import counter_from_spec
from kioku.datasets import default_path, load_locomo
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.memory import MemoryItem
from kioku.notes import notes as notes_in_force
from kioku.profiles import Profile, get_profile
from kioku.store import Store
from kioku.summarizer import parse_lines
from kioku.tokens import TokenCounter

OLD_AGE = 10
TURN_SECONDS = 30.0
_SESSION = re.compile(r"D(\d+)\s*:")


def item_seqs(item: MemoryItem) -> set[int]:
    """The message seqs an item quotes: `[seq]` lines, or the seqs in its structured data."""
    seqs = {ln.seq for ln in parse_lines(item.text)}
    for ln in item.data.get("lines", ()) if isinstance(item.data, dict) else ():
        if isinstance(ln, dict) and isinstance(ln.get("seq"), int):
            seqs.add(ln["seq"])
    return seqs


@dataclass(frozen=True)
class Outcome:
    questions: int
    picked: int  # an evidence turn was quoted by some memory item at some point
    survived: int  # an evidence turn is in the active memory at the end
    survived_items: int  # ... by an active synopsis or chapter line
    survived_notes: int  # ... by a note the memory exchange shows


def _fitted(budget: int) -> Profile:
    return get_profile("local-64k", budget).fitted()


def replay_conversation(
    index: int, path: Path, profile: Profile, counter: TokenCounter
) -> tuple[Outcome, dict[str, Any]]:
    t = load_locomo(path, index)
    clock = [0.0]
    store = Store.open("sqlite://")
    kk = Kioku(
        store,
        profile=profile,
        counter=counter,
        clock=lambda: clock[0],
        simulated_duration_s=profile.summary_duration_s,
        layers=Layers(store, recall=False),  # no question is asked here: only memory is read
    )
    conv = kk.conversation("bench", system_prompt=t.system_prompt, character=t.character)
    seq_of: dict[str, int] = {}
    # the same turns as the eval's replay: user messages, then the replies that follow them
    turns: list[tuple[list[int], list[int]]] = []
    for i, m in enumerate(t.messages):
        if m.role == "user":
            if not turns or turns[-1][1]:
                turns.append(([], []))
            turns[-1][0].append(i)
        elif turns:
            turns[-1][1].append(i)
    for users, replies in turns:
        clock[0] += TURN_SECONDS
        for i in users[:-1]:
            seq_of[t.meta[i]["dia_id"]] = conv.append(t.messages[i], dict(t.meta[i])).seq
        entry = conv.append(t.messages[users[-1]], dict(t.meta[users[-1]]))
        seq_of[t.meta[users[-1]]["dia_id"]] = entry.seq
        conv.prepare_for(entry)
        for i in replies:
            seq_of[t.meta[i]["dia_id"]] = conv.append(t.messages[i], dict(t.meta[i])).seq
        kk.worker.run_until_idle()
    p = profile
    for _ in range(100):
        clock[0] += p.summary_delay_s + p.summary_duration_s + 1.0
        kk.worker.run_until_idle()
        report = conv.settle()
        if not report.folded and not report.scheduled:
            break

    every = kk.store.items("bench")
    active = kk.store.items("bench", "active")
    picked_ever = set().union(*(item_seqs(i) for i in every)) if every else set()
    in_items = set().union(*(item_seqs(i) for i in active)) if active else set()
    shown = kk.store.notes_snapshot("bench")
    in_notes = {
        n.source_seq
        for n in notes_in_force(kk.store, "bench")
        if n.source_seq is not None and n.line() in shown
    }
    last = int(t.info.get("sessions") or 0)
    q_total = q_picked = q_surv = q_items = q_notes = 0
    for q in t.info.get("qa", []):
        if q.get("category") not in (1, 2, 3, 4):
            continue
        ev = [str(e) for e in q.get("evidence", [])]
        sessions = [int(m.group(1)) for e in ev for m in _SESSION.finditer(e)]
        if not sessions or last - max(sessions) < OLD_AGE:
            continue
        seqs = {seq_of[e.strip()] for e in ev if e.strip() in seq_of}
        if not seqs:
            continue
        q_total += 1
        q_picked += bool(seqs & picked_ever)
        q_items += bool(seqs & in_items)
        q_notes += bool(seqs & in_notes)
        q_surv += bool(seqs & (in_items | in_notes))
    counters = kk.store.counters("bench")
    detail = {
        "index": index,
        "messages": len(t.messages),
        "old_questions": q_total,
        "picked": q_picked,
        "survived": q_surv,
        "notes_in_force": len(notes_in_force(kk.store, "bench")),
        **{k: counters.get(k, 0) for k in ("folds", "major_gcs", "forced_cuts")},
    }
    kk.close()
    kk.store.close()
    return Outcome(q_total, q_picked, q_surv, q_items, q_notes), detail


def run(
    path: Path | None = None,
    conversations: Sequence[int] = tuple(range(10)),
    budget: int = 4096,
    tokenizer: str = "qwen2.5",
) -> dict[str, Any]:
    data = path or default_path("locomo")
    profile = _fitted(budget)
    counter = counter_from_spec(tokenizer)
    per: list[dict[str, Any]] = []
    totals = [0, 0, 0, 0, 0]
    for index in conversations:
        out, detail = replay_conversation(index, data, profile, counter)
        per.append(detail)
        for i, v in enumerate(
            (out.questions, out.picked, out.survived, out.survived_items, out.survived_notes)
        ):
            totals[i] += v
        print(f"conversation {index}: {detail}", file=sys.stderr)
    n = max(1, totals[0])
    return {
        "kind": "kioku.bench.survival/1",
        "budget": budget,
        "old_age": OLD_AGE,
        "old_questions": totals[0],
        "picked_rate": round(totals[1] / n, 4),
        "survived_rate": round(totals[2] / n, 4),
        "survived_items_rate": round(totals[3] / n, 4),
        "survived_notes_rate": round(totals[4] / n, 4),
        "conversations": per,
    }


def _indexes(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--conversations", default="0-9")
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--tokenizer", default="qwen2.5")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    result = run(a.data, _indexes(a.conversations), a.budget, a.tokenizer)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
