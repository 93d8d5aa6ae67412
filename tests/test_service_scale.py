"""Scale-out: `kioku serve --workers 2` (two processes on one socket) on one PostgreSQL, with
conversations, double submits and stateless transcripts landing on either process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, free_port, wait_until_answers
from kioku.store import Store
from tests.pg import fresh_schema

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, Store, FakeUpstream, int]]:
    # the upstream takes long enough that a turn's two copies are surely both in flight on a
    # loaded machine (a copy that arrives after the first has answered is a new turn)
    with fresh_schema() as url, FakeUpstream(delay_s=0.5) as up:
        store = Store.open(url)
        key = create_key(store, "acme")[1]
        port = free_port()
        log = (tmp_path / "serve.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-c", "from kioku.cli import main; main()", "serve", "--db", url,
             "--upstream", up.url, "--port", str(port), "--workers", "2", "--no-worker"],
            stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/healthz"
            wait_until_answers(url, alive=lambda: proc.poll() is None, timeout_s=180)
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            yield f"http://127.0.0.1:{port}", key, store, up, proc.pid
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()
            store.close()


def test_two_processes_serve_one_database_as_one(
    served: tuple[str, str, Store, FakeUpstream, int],
) -> None:
    url, key, store, up, pid = served
    assert len(children(pid)) >= 2  # the supervisor's two serving processes

    def talk(n: int) -> None:
        chat: list[dict[str, str]] = []
        # a fresh connection per turn: the kernel may hand each to either process
        for t in range(4):
            chat.append({"role": "user", "content": f"conversation {n}, turn {t}"})
            body = {"messages": chat if n % 2 else chat[-1:]}
            headers = {"Authorization": f"Bearer {key}", "X-Kioku-Conversation": f"scale-{n}"}
            with ThreadPoolExecutor(2) as pool:  # every turn submitted twice at once
                sent = [
                    pool.submit(
                        httpx.post,
                        f"{url}/v1/chat/completions",
                        json=body,
                        headers=headers,
                        timeout=60,
                    )
                    for _ in range(2)
                ]
                rs = [f.result() for f in sent]
            assert [r.status_code for r in rs] == [200, 200], rs[0].text
            replies = {r.json()["choices"][0]["message"]["content"] for r in rs}
            assert len(replies) == 1
            chat.append({"role": "assistant", "content": replies.pop()})
        texts = [e.text for e in store.entries(f"scale-{n}")]
        assert texts == [m["content"] for m in chat]

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(talk, range(6)))
