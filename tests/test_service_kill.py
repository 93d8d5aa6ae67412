"""`kill -9` of `kioku serve` at random points of a turn, on SQLite and PostgreSQL.

A client talks to a real `kioku serve` process (the CLI, every layer on) in front of a fake
upstream. Turns alternate stateful and stateless clients, streamed and not, each sent with an
Idempotency-Key and sent again, after a restart, until it is answered. At random points the
server is killed: while the upstream is answering, in the middle of a stream, right after the
response arrived, or at a random moment after the upstream got the request (which sometimes
falls between storing the reply and sending it). Afterwards the log must hold every user message
once and every reply the client received once, right after its message, with gap-free seqs.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine

from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, free_port, wait_until_answers
from kioku.store import Store
from tests.pg import BACKENDS, backend_url
from tests.test_service_support import words

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TURNS = 14
CID = "kill-1"
KILLS = ("upstream", "stream", "after", "random", "slow-db", None)
SLOW_DB_S = 1.0


# A parent that imports kioku once, then forks `kioku serve` (the CLI's `main`) on each line it
# reads: a restart costs a fork, not the 2 s of CPU the imports take. The forked server is
# killed with SIGKILL all the same; the parent ignores SIGCHLD so the kernel reaps it at once.
ZYGOTE = """
import json, os, signal, sys
import uvicorn
from kioku.cli import main, register_extensions
import kioku.service.app
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
for line in sys.stdin:
    args, log = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = ["kioku", *args]
        try:
            main()
        finally:
            os._exit(0)
    print(pid, flush=True)
"""


@dataclass
class Server:
    db: str
    upstream: str
    log: Path
    key: str = ""
    port: int = field(default_factory=free_port)
    pid: int | None = None
    zygote: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def start(self) -> None:
        if self.zygote is None:
            self.zygote = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        assert self.zygote.stdin is not None and self.zygote.stdout is not None
        args = ["serve", "--db", self.db, "--upstream", self.upstream, "--port", str(self.port)]
        self.zygote.stdin.write(json.dumps([[*args, "--no-worker"], str(self.log)]) + "\n")
        self.zygote.stdin.flush()
        self.pid = int(self.zygote.stdout.readline())
        if wait_until_answers(f"{self.url}/healthz", alive=self.alive, poll_s=0.02):
            return
        if not self.alive():
            raise RuntimeError(f"kioku serve exited: {self.log.read_text()[-2000:]}")
        raise RuntimeError("kioku serve did not start")

    def kill(self) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        while self.alive():
            time.sleep(0.005)

    def stop(self) -> None:
        if self.alive():
            assert self.pid is not None
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.alive():
                self.kill()
        if self.zygote is not None:
            self.zygote.kill()
            self.zygote.wait(10)


def wait_for(up: FakeUpstream, user: str) -> None:
    deadline = time.monotonic() + 30
    while not upstream_got(up, user) and time.monotonic() < deadline:
        time.sleep(0.005)


def hold(db: str, seconds: float = SLOW_DB_S) -> None:
    """Keep the database from taking a new message for `seconds`, as a stalled disk would."""
    engine = create_engine(pg_driver(db) if db.startswith("postgresql") else db)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql("LOCK TABLE messages IN SHARE MODE")
            time.sleep(seconds)
            conn.rollback()
    finally:
        engine.dispose()


def pg_driver(url: str) -> str:
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def reply(body: dict[str, Any]) -> str:
    """A reply naming the message it answers, in words that do not repeat (no tic alerts)."""
    user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    turn = re.findall(r"turn (\d+):", user)
    return f"About «{user[-24:]}»: " + words(int(turn[-1]) if turn else 99, 14)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


def upstream_got(up: FakeUpstream, text: str) -> bool:
    """Whether the upstream was asked to answer `text` (the last user message of a prompt)."""
    for b in up.chats():
        users = [m["content"] for m in b["messages"] if m["role"] == "user"]
        if users and users[-1].endswith(text):
            return True
    return False


def send(
    server: Server,
    key: str,
    body: dict[str, Any],
    kill: str | None,
    up: FakeUpstream,
    rng: random.Random,
) -> str | None:
    """One attempt at a turn: the reply's text, or None if the server died first."""
    headers = {
        "Authorization": f"Bearer {server.key}",
        "X-Kioku-Conversation": CID,
        "Idempotency-Key": key,
        # the mode said, as a client mixing both must (one message alone in a conversation
        # whose client sends transcripts is a side request, SillyTavern's Test Message)
        "X-Kioku-Mode": "stateless" if len(body["messages"]) > 1 else "stateful",
    }
    user = body["messages"][-1]["content"]
    killer: threading.Thread | None = None
    killed_midstream = False
    if kill == "slow-db":
        # the database stalls while the upstream answers: a reply stored after the response
        # (as kioku once did) is still waiting for it when the server dies
        killer = threading.Thread(target=lambda: (wait_for(up, user), hold(server.db)))
        killer.start()
    if kill in ("upstream", "random"):
        delay = 0.15 if kill == "upstream" else rng.uniform(0.0, 0.6)

        def kill_when_asked() -> None:
            wait_for(up, user)
            time.sleep(delay)
            server.kill()

        killer = threading.Thread(target=kill_when_asked)
        killer.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as h:
            if body.get("stream"):
                parts: list[str] = []
                with h.stream("POST", "/v1/chat/completions", headers=headers, json=body) as r:
                    assert r.status_code == 200, r.read()
                    done = False
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            choice = json.loads(line[6:])["choices"][0]
                            parts.append(choice["delta"].get("content") or "")
                            if kill == "stream" and parts and not killed_midstream:
                                server.kill()  # mid-stream, after the first content
                                killed_midstream = True
                        done = done or line == "data: [DONE]"
                    if not done:
                        return None
                text = "".join(parts)
            else:
                r = h.post("/v1/chat/completions", headers=headers, json=body)
                assert r.status_code == 200, r.text
                text = r.json()["choices"][0]["message"]["content"]
        if kill in ("after", "slow-db"):
            server.kill()
        return text
    except (httpx.TransportError, json.JSONDecodeError):
        return None
    finally:
        if killer is not None and killer.is_alive():
            killer.join(60)


def test_kill_9_at_any_point_loses_no_reply_and_stores_nothing_twice(
    db: str, tmp_path: Path
) -> None:
    rng = random.Random(11)
    store = Store.open(db)
    received: list[tuple[str, str]] = []  # (user message, the reply the client got)
    kills = 0
    with FakeUpstream(delay_s=0.3, chunk_delay_s=0.03) as up:
        up.reply = reply
        server = Server(db, up.url, tmp_path / "serve.log", create_key(store, "acme")[1])
        server.start()
        try:
            for turn in range(TURNS):
                user = f"turn {turn}: what now?"
                stateless = turn % 2 == 1
                history = [
                    {"role": r, "content": t}
                    for u, rep in received
                    for r, t in (("user", u), ("assistant", rep))
                ]
                messages = (
                    [*history, {"role": "user", "content": user}]
                    if stateless
                    else [{"role": "user", "content": user}]
                )
                body = {"model": "m", "messages": messages, "stream": turn % 3 == 0}
                kill = KILLS[turn % len(KILLS)]
                if kill == "stream" and not body["stream"]:
                    kill = "upstream"
                text = None
                for attempt in range(6):
                    text = send(
                        server, f"turn-{turn}", body, kill if attempt == 0 else None, up, rng
                    )
                    if not server.alive():
                        kills += 1
                        server.start()
                    if text is not None:
                        break
                assert text is not None, f"turn {turn} was never answered"
                received.append((user, text))
                # what the client got is in the log now, dead server or not (a stateless
                # client's next turn would store a lost reply again: check before it can)
                logged = [e.text for e in store.entries(CID)]
                assert logged == [t for pair in received for t in pair], (turn, kill, logged)
        finally:
            server.stop()
    assert kills >= TURNS * 3 // 5, kills
    entries = store.entries(CID)
    assert [e.seq for e in entries] == list(range(len(entries)))
    texts = [e.text for e in entries]
    assert texts == [t for pair in received for t in pair], (texts, received)
    store.close()
