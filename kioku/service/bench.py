"""`kioku bench serve`: kioku's added latency per turn, on loopback.

A fake OpenAI-compatible upstream answers every chat completion after a fixed delay (20 ms).
N conversations run concurrently, each M turns in a row: a turn is sent when the previous
reply has arrived and the user has "read" it for a think time drawn uniformly from
[0, 2 × think_ms] (500 ms on average: still ten times faster than people type). The same load
runs straight against the upstream, then through `kioku serve` (its own process, SQLite, the
production wiring: layers, embedded worker), in the same run. Added latency = kioku's
percentile minus the direct one. Both a stateful client (only the new message) and a
stateless one (the whole transcript every turn, as SillyTavern does) are measured, and, for
information, the saturated case (think time 0: N requests always in flight, which on a 2-core
machine measures queueing behind kioku's CPU time per turn, not its latency).

The load generator is a minimal asyncio HTTP/1.1 client (one keep-alive connection per
conversation) so that the measuring costs little of the CPU kioku runs on. Everything binds
127.0.0.1; every loop is bounded by the turn count and a deadline.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
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


def _serve_child(db: str, upstream: str, port: int) -> None:
    import logging

    import uvicorn

    from kioku.config import Settings
    from kioku.service.app import create_app

    logging.disable(logging.WARNING)
    app = create_app(Settings(db=db, llm_url=upstream))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def _wait_ready(port: int, deadline_s: float = 60.0) -> None:
    import httpx

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("kioku serve did not start for the benchmark")


def run(
    conversations: int = 20,
    turns: int = 20,
    upstream_ms: float = 20.0,
    think_ms: float = DEFAULT_THINK_MS,
    saturated: bool = True,
) -> dict[str, Any]:
    from kioku.service.keys import create_key
    from kioku.service.loopback import FakeUpstream, free_port
    from kioku.store import Store

    with tempfile.TemporaryDirectory() as tmp, FakeUpstream(delay_s=upstream_ms / 1000) as up:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}"
        _, key = create_key(Store.open(db), "bench")
        port = free_port()
        child = subprocess.Popen(
            [sys.executable, "-m", "kioku.service.bench", "--serve", db, up.url, str(port)]
        )
        try:
            _wait_ready(port)
            auth = {"authorization": f"Bearer {key}"}

            async def all_phases() -> dict[str, tuple[list[float], int]]:
                # warm both paths (imports, connection pools, SQLite pages) before measuring
                await _load(up.port, "/v1/chat/completions", 4, 2, {}, False, "warm")
                await _load(port, "/v1/chat/completions", 4, 2, auth, False, "warm")
                path, n, m, th = "/v1/chat/completions", conversations, turns, think_ms
                out = {
                    "direct": await _load(up.port, path, n, m, {}, False, "d", th),
                    "stateful": await _load(port, path, n, m, auth, False, "sf", th),
                    "stateless": await _load(port, path, n, m, auth, True, "sl", th),
                }
                if saturated:
                    out["sat_direct"] = await _load(up.port, path, n, m, {}, False, "sd")
                    out["sat_kioku"] = await _load(port, path, n, m, auth, False, "sk")
                return out

            results = asyncio.run(all_phases())
        finally:
            child.terminate()
            child.wait(10)
    direct, direct_errors = results["direct"]
    via, via_errors = results["stateful"]
    sl, sl_errors = results["stateless"]
    d50, d95 = _pct(direct, 0.5), _pct(direct, 0.95)
    added = {"p50": round(_pct(via, 0.5) - d50, 2), "p95": round(_pct(via, 0.95) - d95, 2)}
    report: dict[str, Any] = {
        "conversations": conversations,
        "turns": turns,
        "think_ms": think_ms,
        "upstream_ms": {"configured": upstream_ms, **_summary(direct)},
        "via_kioku_ms": _summary(via),
        "added_ms": added,
        "errors": direct_errors + via_errors,
        "stateless": {
            "via_kioku_ms": _summary(sl),
            "added_ms": {
                "p50": round(_pct(sl, 0.5) - d50, 2),
                "p95": round(_pct(sl, 0.95) - d95, 2),
            },
            "errors": sl_errors,
        },
        "floor": {
            "added_p50_ms": FLOOR_ADDED_P50_MS,
            "ok": added["p50"] <= FLOOR_ADDED_P50_MS and direct_errors + via_errors == 0,
        },
    }
    if saturated:
        sd, _ = results["sat_direct"]
        sk, sk_errors = results["sat_kioku"]
        report["saturated"] = {
            "upstream_ms": _summary(sd),
            "via_kioku_ms": _summary(sk),
            "added_ms": {
                "p50": round(_pct(sk, 0.5) - _pct(sd, 0.5), 2),
                "p95": round(_pct(sk, 0.95) - _pct(sd, 0.95), 2),
            },
            "errors": sk_errors,
        }
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        print(json.dumps(run(), indent=1))
