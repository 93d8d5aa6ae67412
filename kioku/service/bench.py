"""`kioku bench serve`: kioku's added latency per turn, on loopback.

A fake OpenAI-compatible upstream answers every chat completion after a fixed delay (20 ms).
N conversations run concurrently, each M turns in a row: a turn is sent when the previous
reply has arrived and the user has "read" it for a think time drawn uniformly from
[0, 2 × think_ms] (500 ms on average: still ten times faster than people type). The same load
runs straight against the upstream, then through `kioku serve` (its own process, SQLite, the
production wiring: layers, embedded worker), in the same run. Added latency = kioku's
percentile minus the direct one. Both a stateful client (only the new message) and a
stateless one (the whole transcript every turn, as SillyTavern does) are measured, and the
saturated case (think time 0: N requests always in flight, which measures queueing behind
kioku's CPU time per turn, not its latency) for each process count of `--processes`
(`kioku serve --workers N`, on SQLite or, with `--db`, PostgreSQL). On a machine with C cores
the saturated latency can fall only until N reaches the cores left beside the load generator,
the fake upstream (this process) and the database server.

The load generator is a minimal asyncio HTTP/1.1 client (one keep-alive connection per
conversation) so that the measuring costs little of the CPU kioku runs on. Everything binds
127.0.0.1; every loop is bounded by the turn count and a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FLOOR_ADDED_P50_MS = 15.0
DEFAULT_THINK_MS = 500.0
DEADLINE_S = 300.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "p50": round(_pct(ms, 0.50), 2),
        "p95": round(_pct(ms, 0.95), 2),
        "mean": round(statistics.fmean(ms), 2) if ms else 0.0,
        "max": round(max(ms), 2) if ms else 0.0,
    }


class _Conn:
    """One keep-alive HTTP/1.1 connection; just enough client for JSON posts."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n{head}\r\n".encode()
            + data
        )
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdrs = {
            k.strip().lower(): v.strip()
            for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)
        }
        if "content-length" in hdrs:
            payload = await self.reader.readexactly(int(hdrs["content-length"]))
        else:  # chunked
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunks.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            payload = b"".join(chunks)
        if status == 200:
            json.loads(payload.rstrip(b"\r\n") or b"{}")
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _timed_load(*args: Any, **kw: Any) -> tuple[list[float], int, float]:
    started = time.perf_counter()
    latencies, errors = await _load(*args, **kw)
    return latencies, errors, time.perf_counter() - started


async def _load(
    port: int,
    path: str,
    conversations: int,
    turns: int,
    headers: dict[str, str],
    stateless: bool,
    tag: str,
    think_ms: float = 0.0,
) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    rng = random.Random(f"{tag}-{conversations}-{turns}")

    async def one(n: int) -> None:
        nonlocal errors
        conn = _Conn(port)
        history: list[dict[str, str]] = [{"role": "system", "content": "You are Mika, a cat."}]
        await asyncio.sleep(rng.uniform(0, 2 * think_ms) / 1000)  # users do not start at once
        try:
            for t in range(turns):
                if t:
                    await asyncio.sleep(rng.uniform(0, 2 * think_ms) / 1000)
                user = {"role": "user", "content": f"{tag} conversation {n} turn {t}: how are you?"}
                msgs = [*history, user] if stateless else [history[0], user]
                body = {"model": "fake", "messages": msgs, "max_tokens": 64}
                started = time.perf_counter()
                try:
                    status = await conn.post(
                        path, body, {**headers, "x-kioku-conversation": f"{tag}-{n}"}
                    )
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    conn.close()
                    conn = _Conn(port)
                latencies.append((time.perf_counter() - started) * 1000)
                if status != 200:
                    errors += 1
                history += [
                    user,
                    {"role": "assistant", "content": f"(reply to: {user['content']})"},
                ]
        finally:
            conn.close()

    async with asyncio.timeout(DEADLINE_S):
        await asyncio.gather(*(one(n) for n in range(conversations)))
    return latencies, errors


def _serve_child(db: str, upstream: str, port: int, workers: int) -> None:
    import logging

    from kioku.config import Settings
    from kioku.service.serving import serve

    logging.disable(logging.WARNING)
    settings = Settings(db=db, llm_url=upstream)
    serve(settings, port=port, workers=workers, log_level="error", access_log=False)


def _start(db: str, upstream: str, workers: int) -> tuple[subprocess.Popen[bytes], int]:
    from kioku.service.loopback import free_port, wait_until_answers

    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "kioku.service.bench", "--serve", db, upstream, str(port)]
        + [str(workers)]
    )
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        if not wait_until_answers(url, alive=lambda: child.poll() is None):
            raise RuntimeError("kioku serve did not start for the benchmark")
    except BaseException:
        child.kill()
        raise
    return child, port


def _stop(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)


PATH = "/v1/chat/completions"


async def _phases(
    port: int,
    upstream_port: int,
    auth: dict[str, str],
    tag: str,
    warm: int,
    n: int,
    m: int,
    think_ms: float,
    *,
    paced: bool,
    saturated: bool,
) -> dict[str, Any]:
    # warm both paths (imports, pools, pages) before measuring
    await _load(upstream_port, PATH, warm, 2, {}, False, f"warm-{tag}")
    await _load(port, PATH, warm, 2, auth, False, f"warm-{tag}")
    out: dict[str, Any] = {}
    if paced:
        out["direct"] = await _load(upstream_port, PATH, n, m, {}, False, "d", think_ms)
        out["stateful"] = await _load(port, PATH, n, m, auth, False, f"sf{tag}", think_ms)
        out["stateless"] = await _load(port, PATH, n, m, auth, True, f"sl{tag}", think_ms)
        if saturated:
            out["sat_direct"] = await _timed_load(upstream_port, PATH, n, m, {}, False, "sd")
    if saturated:
        out["sat_kioku"] = await _timed_load(port, PATH, n, m, auth, False, f"sk{tag}")
    return out


def _added(via: list[float], direct: list[float]) -> dict[str, float]:
    return {
        "p50": round(_pct(via, 0.5) - _pct(direct, 0.5), 2),
        "p95": round(_pct(via, 0.95) - _pct(direct, 0.95), 2),
    }


def _report(
    results: dict[str, Any],
    by_count: dict[str, dict[str, Any]],
    counts: list[int],
    *,
    conversations: int,
    turns: int,
    think_ms: float,
    upstream_ms: float,
    url: str,
    load_before: float,
    saturated: bool,
) -> dict[str, Any]:
    """The figures of the phases `run` measured, with the floor they are held to."""
    direct, direct_errors = results["direct"]
    via, via_errors = results["stateful"]
    sl, sl_errors = results["stateless"]
    added = _added(via, direct)
    report: dict[str, Any] = {
        "conversations": conversations,
        "turns": turns,
        "think_ms": think_ms,
        "database": "postgresql" if url.startswith("postgresql") else "sqlite",
        "upstream_ms": {"configured": upstream_ms, **_summary(direct)},
        "via_kioku_ms": _summary(via),
        "added_ms": added,
        "errors": direct_errors + via_errors,
        "stateless": {
            "via_kioku_ms": _summary(sl),
            "added_ms": _added(sl, direct),
            "errors": sl_errors,
        },
        "floor": {
            "added_p50_ms": FLOOR_ADDED_P50_MS,
            "ok": added["p50"] <= FLOOR_ADDED_P50_MS and direct_errors + via_errors == 0,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
    }
    if saturated:
        sd, _, sd_wall = results["sat_direct"]
        first = by_count[str(counts[0])]
        report["saturated"] = {
            "upstream_ms": {**_summary(sd), "turns_per_s": round(len(sd) / sd_wall, 1)},
            # the first process count, as before; every count under "processes"
            "via_kioku_ms": first["via_kioku_ms"],
            "added_ms": first["added_ms"],
            "errors": first["errors"],
            "processes": by_count,
        }
    return report


def run(
    conversations: int = 20,
    turns: int = 20,
    upstream_ms: float = 20.0,
    think_ms: float = DEFAULT_THINK_MS,
    saturated: bool = True,
    processes: Sequence[int] = (1,),
    db: str | None = None,
) -> dict[str, Any]:
    """The paced load through one process; the saturated load through each process count."""
    from kioku.service.keys import create_key
    from kioku.service.loopback import FakeUpstream
    from kioku.store import Store

    counts = list(dict.fromkeys(processes)) or [1]
    run_id = uuid.uuid4().hex[:6]  # conversations of this run, on a database that may be shared
    load_before = os.getloadavg()[0]
    n, m = conversations, turns
    results: dict[str, Any] = {}
    by_count: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, FakeUpstream(delay_s=upstream_ms / 1000) as up:
        url = db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = Store.open(url)
        _, key = create_key(store, "bench")
        store.close()
        auth = {"authorization": f"Bearer {key}"}
        for i, count in enumerate(counts):
            child, port = _start(url, up.url, count)
            try:
                phase = asyncio.run(
                    _phases(
                        port,
                        up.port,
                        auth,
                        f"{run_id}-p{count}",
                        4 * count,
                        n,
                        m,
                        think_ms,
                        paced=i == 0,
                        saturated=saturated,
                    )  # fmt: skip
                )
            finally:
                _stop(child)
            if i == 0:
                results = phase
            if saturated:
                sk, errors, wall = phase["sat_kioku"]
                by_count[str(count)] = {
                    "via_kioku_ms": _summary(sk),
                    "added_ms": _added(sk, results["sat_direct"][0]),
                    "errors": errors,
                    "turns_per_s": round(len(sk) / wall, 1),
                }
    return _report(
        results,
        by_count,
        counts,
        conversations=conversations,
        turns=turns,
        think_ms=think_ms,
        upstream_ms=upstream_ms,
        url=url,
        load_before=load_before,
        saturated=saturated,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(json.dumps(run(), indent=1))
