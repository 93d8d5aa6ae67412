"""`kill -9` of `kioku serve` over and over, on SQLite and PostgreSQL, across eight kinds of
client, with folds and summaries under way.

Real `kioku serve` processes (the CLI, every layer on, summaries in the serving process, a
small window so conversations fold every few turns) in front of a fake upstream; a second, slower
one is the chronicler's model (its replies are no chronicle, so each summary takes the
chronicler's three tries and its extractive fallback: summaries are running much of the time).
Eight conversations, one per kind of client, take turns; each turn is sent with an
Idempotency-Key and sent again, after a restart, until it is answered. The server is killed at
every few turns: while the upstream answers, in the middle of a stream, right after a response,
at a random moment, while the database stalls, and while a summary job runs.

What must hold (issue 21 added the last two): every user message is stored once and every reply
the client received once, right after its message, seqs gap-free; memory covers every seq
before the raw window exactly once; the conversations folded; and after the last kill every
conversation answers a short message with 200 (on 36c9307 a summary job whose worker died
jammed 7 of 8 conversations on SQLite with 400s).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine

from kioku.memory import coverage_gaps
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.store import Store
from kioku.tls import tls_context
from tests.killable import Server
from tests.pg import BACKENDS, backend_url
from tests.test_service_support import words

pytestmark = pytest.mark.slow

# kills wanted per backend (issue 21's floors), and the turns each conversation takes at least
KILLS = {"sqlite": 100, "postgresql": 50}
MIN_TURNS = {"sqlite": 12, "postgresql": 10}
WAYS = ("upstream", "stream", "after", "random", "slow-db", "job")
SLOW_DB_S = 0.5
# a window small enough that every conversation folds (and runs major GCs) within its turns
SERVE = ("--profile", "local-8k", "--window", "1536", "--summary-delay", "0")
SHORT = "After all that, tell me in one short line what you remember of today."  # ~16 tokens


@dataclass(frozen=True)
class Kind:
    """A kind of client: how it sends a turn."""

    name: str
    stateless: bool = False  # sends the whole transcript every time
    stream: bool = False
    card: str | None = None  # a system message first (the character card)
    headers: tuple[tuple[str, str], ...] = ()
    parts: bool = False  # the user message as a content-parts array
    names: bool = False  # messages carry `name`


KINDS = (
    Kind("openai-stateful"),
    Kind("openai-stateful-stream", stream=True),
    Kind("stateless", stateless=True),
    Kind("stateless-stream", stateless=True, stream=True),
    Kind(
        "sillytavern",
        stateless=True,
        stream=True,
        card="You are Mika, who runs a tea shop.",
        headers=(("X-Kioku-Generation", "normal"), ("X-Kioku-User", "Ren")),
        names=True,
    ),
    Kind("card-stateful", card="You are Mika.", headers=(("X-Kioku-Character", "Mika"),)),
    Kind("content-parts-stream", stream=True, parts=True),
    Kind("langchain-stateless", stateless=True, card="You are Mika.", names=True),
)


def reply(body: dict[str, Any]) -> str:
    """A reply naming the message it answers, in words that do not repeat (no tic alerts)."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    user = str(users[-1]) if users else ""
    turn = re.findall(r"turn (\d+):", user)
    return f"About «{user[-24:]}»: " + words(int(turn[-1]) if turn else 99, 60)


def said(n: int, kind: Kind) -> str:
    return f"{kind.name} turn {n}: " + words(n * 3 + len(kind.name), 60)


def body_of(kind: Kind, received: list[tuple[str, str]], user: str) -> dict[str, Any]:
    def message(role: str, text: str) -> dict[str, Any]:
        m: dict[str, Any] = {"role": role, "content": text}
        if kind.parts and role == "user":
            m["content"] = [{"type": "text", "text": text}]
        if kind.names:
            m["name"] = "Ren" if role == "user" else "Mika"
        return m

    messages = [{"role": "system", "content": kind.card}] if kind.card else []
    if kind.stateless:
        messages += [message(r, t) for u, a in received for r, t in (("user", u), ("assistant", a))]
    messages.append(message("user", user))
    return {"model": "m", "messages": messages, "stream": kind.stream}


def upstream_got(up: FakeUpstream, text: str) -> bool:
    """Whether the upstream was asked to answer `text` (the last user message of a prompt)."""
    for b in up.chats():
        users = [m["content"] for m in b["messages"] if m["role"] == "user"]
        if users and str(users[-1]).endswith(text):
            return True
    return False


def wait_for(up: FakeUpstream, user: str) -> None:
    deadline = time.monotonic() + 30
    while not upstream_got(up, user) and time.monotonic() < deadline:
        time.sleep(0.005)


def pg_driver(url: str) -> str:
    return "postgresql+psycopg://" + url.split("://", 1)[1]


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


def send(
    server: Server,
    cid: str,
    kind: Kind,
    key: str,
    body: dict[str, Any],
    way: str | None,
    up: FakeUpstream,
    rng: random.Random,
) -> str | None:
    """One attempt at a turn: the reply's text, or None if the server died first."""
    headers = {
        "Authorization": f"Bearer {server.key}",
        "X-Kioku-Conversation": cid,
        "Idempotency-Key": key,
        "X-Kioku-Mode": "stateless" if kind.stateless else "stateful",
        **dict(kind.headers),
    }
    user = body["messages"][-1]["content"]
    user = user[0]["text"] if isinstance(user, list) else user
    killer: threading.Thread | None = None
    if way == "slow-db":
        # the database stalls while the upstream answers: a reply stored after the response
        # (as kioku once did) is still waiting for it when the server dies
        killer = threading.Thread(target=lambda: (wait_for(up, user), hold(server.db)))
        killer.start()
    if way in ("upstream", "random"):
        delay = 0.05 if way == "upstream" else rng.uniform(0.0, 0.3)

        def kill_when_asked() -> None:
            wait_for(up, user)
            time.sleep(delay)
            server.kill()

        killer = threading.Thread(target=kill_when_asked)
        killer.start()
    killed_midstream = False
    try:
        with httpx.Client(base_url=server.url, timeout=60, verify=tls_context()) as h:
            if kind.stream:
                parts: list[str] = []
                with h.stream("POST", "/v1/chat/completions", headers=headers, json=body) as r:
                    assert r.status_code == 200, r.read()
                    done = False
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            event = json.loads(line[6:])
                            assert "error" not in event, event
                            parts.append(event["choices"][0]["delta"].get("content") or "")
                            if way == "stream" and parts and not killed_midstream:
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
        if way in ("after", "slow-db"):
            server.kill()
        return text
    except (httpx.TransportError, json.JSONDecodeError):
        return None
    finally:
        if killer is not None and killer.is_alive():
            killer.join(60)


def job_running(store: Store, cids: list[str]) -> bool:
    return any(j.status == "running" for c in cids for j in store.jobs(c))


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


def test_kill_9_again_and_again_loses_no_reply_stores_nothing_twice_and_never_jams(
    db: str, tmp_path: Path
) -> None:
    backend = "postgresql" if db.startswith("postgresql") else "sqlite"
    rng = random.Random(21)
    store = Store.open(db)
    cids = [f"kill-{k.name}" for k in KINDS]
    received: dict[str, list[tuple[str, str]]] = {c: [] for c in cids}
    kills = job_kills = 0
    started = time.monotonic()
    with (
        FakeUpstream(delay_s=0.08, chunk_delay_s=0.002) as up,
        FakeUpstream(delay_s=0.25) as chronicler,
    ):
        up.reply = reply
        key = create_key(store, "acme")[1]
        args = (*SERVE, "--summarizer-upstream", chronicler.url)
        server = Server(db, up.url, tmp_path / "serve.log", key, args=args)
        server.start()
        try:
            turn = 0
            while kills < KILLS[backend] or turn < MIN_TURNS[backend] * len(KINDS):
                kind = KINDS[turn % len(KINDS)]
                cid = cids[turn % len(KINDS)]
                n = turn // len(KINDS)
                # kill at most turns; every seventh turn is left alone
                way = None if turn % 7 == 6 else WAYS[(turn * 5) % len(WAYS)]
                if way == "stream" and not kind.stream:
                    way = "upstream"
                if way == "job":
                    # kill while a summary job runs, when one does; then the turn itself, on
                    # the restarted server (killed at a random moment if no job ran)
                    way = "random"
                    if job_running(store, cids):
                        server.restart()
                        kills += 1
                        job_kills += 1
                        way = None
                user = said(n, kind)
                body = body_of(kind, received[cid], user)
                text = None
                for attempt in range(6):
                    text = send(
                        server, cid, kind, f"{cid}-{n}", body, way if attempt == 0 else None,
                        up, rng,
                    )  # fmt: skip
                    if not server.alive():
                        kills += 1
                        server.start()
                    if text is not None:
                        break
                assert text is not None, f"{cid} turn {n} was never answered"
                received[cid].append((user, text))
                # what the client got is in the log now, dead server or not (a stateless
                # client's next turn would store a lost reply again: check before it can)
                logged = [e.text for e in store.entries(store.find_conversation("acme", cid).id)]
                assert logged == [t for pair in received[cid] for t in pair], (cid, n, way)
                turn += 1
            # after the last kill, every conversation still answers
            for kind, cid in zip(KINDS, cids, strict=True):
                plain = Kind(kind.name, stateless=kind.stateless, stream=False, card=kind.card)
                body = body_of(plain, received[cid], SHORT)
                text = send(server, cid, plain, f"{cid}-last", body, None, up, rng)
                assert text is not None
                received[cid].append((SHORT, text))
        finally:
            server.stop()
    assert kills >= KILLS[backend], kills
    assert job_kills >= 3, job_kills
    folds = major_gcs = 0
    for cid in cids:
        info = store.find_conversation("acme", cid)
        entries = store.entries(info.id)
        assert [e.seq for e in entries] == list(range(len(entries)))
        assert [e.text for e in entries] == [t for pair in received[cid] for t in pair]
        assert coverage_gaps(store.items(info.id, "active"), info.raw_start) == [], cid
        counters = store.counters(info.id)
        folds += counters.get("folds", 0)
        major_gcs += counters.get("major_gcs", 0)
    figures = dict(backend=backend, kills=kills, job_kills=job_kills, turns=turn, folds=folds)
    print(json.dumps({**figures, "major_gcs": major_gcs, "s": round(time.monotonic() - started)}))
    assert folds >= len(cids), folds
    store.close()
