"""Archive recall benchmark: evidence recall on LoCoMo, and cost at 100,000 messages.

`run(data)` searches each LoCoMo conversation's archive with each question and reports the share
of the question's evidence turns found among the top k turns (windows are ranked by the turn
they are centred on), overall, per category, on conversations 0–4 ("dev", the only ones tuned
on) and 5–9 ("heldout"). `run(None, scale=N)` feeds N synthetic messages one at a time, as a live
conversation does, persisting segments to a temporary SQLite store, then measures queries and a
restart. Progress goes to stderr; the result is a dict the CLI prints as JSON.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from kioku.datasets import default_path, load_locomo, read_locomo
from kioku.errors import InputError
from kioku.messages import LogEntry, Message
from kioku.recall.indexes import ArchiveIndex, BM25Params, RecallIndexes, Terms, _write_segments
from kioku.store import Store

DEFAULT_K_VALUES = (1, 5, 10, 25)
DEV = range(0, 5)  # tune only on these; 5–9 are held out
_DIA = re.compile(r"D\d+:\d+")


def _pct(values: Sequence[float]) -> float:
    return round(100.0 * sum(values) / len(values), 1) if values else 0.0


def _ms(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"p50": 0.0, "p95": 0.0}
    arr = np.asarray(samples) * 1000
    return {
        "p50": round(float(np.percentile(arr, 50)), 3),
        "p95": round(float(np.percentile(arr, 95)), 3),
    }


def _summary(rows: Iterable[dict[str, Any]], k_values: Sequence[int]) -> dict[str, Any]:
    rows = list(rows)
    return {
        "recall": {str(k): _pct([r["recall"][k] for r in rows]) for k in k_values},
        "questions": len(rows),
    }


def run_locomo(
    path: Path,
    k_values: Sequence[int] = DEFAULT_K_VALUES,
    params: BM25Params | None = None,
    conversations: Sequence[int] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    terms = Terms()
    kmax = max(k_values)
    rows: list[dict[str, Any]] = []
    times: list[float] = []
    n_conv = len(read_locomo(path))
    chosen = list(range(n_conv)) if conversations is None else list(conversations)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("LoCoMo recall", total=len(chosen))
        for ci in chosen:
            tr = load_locomo(path, ci)
            index = ArchiveIndex(terms, params)
            index.add([LogEntry(seq=i, message=m) for i, m in enumerate(tr.messages)])
            seq_of = {meta["dia_id"]: i for i, meta in enumerate(tr.meta)}
            for qa in tr.info["qa"]:
                evidence = {
                    seq_of[d]
                    for e in qa.get("evidence", [])
                    for d in _DIA.findall(e)
                    if d in seq_of
                }
                if not evidence:
                    continue
                t0 = time.perf_counter()
                hits = index.search(str(qa["question"]), k=kmax)
                times.append(time.perf_counter() - t0)
                ranked = [h.seq for h in hits]
                rows.append(
                    {
                        "conversation": ci,
                        "category": str(qa.get("category")),
                        "recall": {
                            k: len(evidence & set(ranked[:k])) / len(evidence) for k in k_values
                        },
                    }
                )
            progress.advance(task)
    out = _summary(rows, k_values)
    cats = sorted({r["category"] for r in rows})
    out["by_category"] = {
        c: _summary((r for r in rows if r["category"] == c), k_values) for c in cats
    }
    out["dev"] = _summary((r for r in rows if r["conversation"] in DEV), k_values)
    out["heldout"] = _summary((r for r in rows if r["conversation"] not in DEV), k_values)
    out["query_ms"] = _ms(times)
    p = index.params
    out["method"] = {
        "scorer": "bm25-windows",
        "tokenizer": terms.version,
        "k1": p.k1,
        "b": p.b,
        "neighbour_weight": p.neighbour_weight,
        "reach": p.reach,
    }
    return out


# synthetic scale -----------------------------------------------------------------------------

_SYLLABLES = [
    "ka",
    "ri",
    "mo",
    "ne",
    "la",
    "to",
    "sa",
    "vi",
    "ru",
    "po",
    "de",
    "mi",
    "an",
    "el",
    "or",
    "us",
    "ta",
    "ko",
]
_KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわん"
_KANJI = "日月火水木金土山川田人口目耳手足雨花犬猫空海星夏冬春秋朝夜駅町店本誕生約束旅行映画音楽"


def synthetic_messages(n: int, seed: int = 7) -> list[Message]:
    """A deterministic mix: Zipf-distributed made-up English-like words, one message in ten
    Japanese (kana and kanji runs)."""
    rng = np.random.default_rng(seed)
    vocab = ["".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 5)))) for _ in range(20000)]
    ranks = np.minimum(rng.zipf(1.2, size=n * 40), len(vocab)) - 1
    out: list[Message] = []
    pos = 0
    for i in range(n):
        if i % 10 == 9:
            chars = rng.choice(list(_KANA + _KANJI), size=int(rng.integers(15, 80)))
            text = "".join(chars) + "。"
        else:
            size = int(rng.integers(5, 40))
            text = " ".join(vocab[r] for r in ranks[pos : pos + size]) + "."
            pos += size
        if i % 2 == 0:
            out.append(Message.user(text, author="Aki"))
        else:
            out.append(Message.assistant(text, author="Mika"))
    return out


def run_scale(
    n: int, segment_size: int = 512, queries: int = 300, console: Console | None = None
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    messages = synthetic_messages(n)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(str(Path(tmp) / "bench.db"))
        store.ensure_conversation("bench")
        index = ArchiveIndex()
        segments = 0
        t_start = time.perf_counter()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"indexing {n} messages", total=n)
            for seq, m in enumerate(messages):
                index.add([LogEntry(seq=seq, message=m)])
                if index.pending >= segment_size:
                    seg = index.take_segment()
                    if seg is not None:
                        _write_segments(store, "bench", [seg])
                        segments += 1
                if seq % 1000 == 999:
                    progress.update(task, completed=seq + 1)
        seg = index.take_segment()
        if seg is not None:
            _write_segments(store, "bench", [seg])
            segments += 1
        build_s = time.perf_counter() - t_start

        rng = np.random.default_rng(11)
        qtimes: list[float] = []
        before = max(1, n - 30)  # the raw window is never searched
        for _ in range(queries):
            m = messages[int(rng.integers(0, n))]
            words = m.text.split() if " " in m.text else [m.text[i : i + 4] for i in (0, 6, 12)]
            pick = rng.choice(words, size=min(len(words), int(rng.integers(2, 9))), replace=False)
            t0 = time.perf_counter()
            index.search(" ".join(pick), k=10, before_seq=before)
            qtimes.append(time.perf_counter() - t0)

        restarts = []
        for _ in range(2):  # the first restart merges the segments into one, the second reads it
            fresh = RecallIndexes(store)
            t0 = time.perf_counter()
            loaded = fresh.index("bench")
            restarts.append(round(time.perf_counter() - t0, 3))
            if loaded.size != n:
                raise InputError(f"restart found {loaded.size} messages, expected {n}")
        store.close()
    return {
        "scale": n,
        "update_ms_per_message": round(1000 * build_s / n, 4),
        "build_s": round(build_s, 2),
        "segments_written": segments,
        "query_ms": _ms(qtimes),
        "queries": queries,
        "restart_s": {"merge": restarts[0], "load": restarts[1]},
    }


def run(
    data: Path | None = None,
    scale: int | None = None,
    k_values: Sequence[int] = DEFAULT_K_VALUES,
) -> dict[str, Any]:
    if scale:
        return run_scale(scale)
    path = Path(data) if data else default_path("locomo")
    if not path.exists():
        raise InputError(f"no LoCoMo file at {path}; pass --data or set KIOKU_SHARED")
    return run_locomo(path, k_values)
