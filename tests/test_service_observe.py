"""A real `kioku serve` says what happened (issue 42.6): in front of a chronicler's model that
answers prose instead of the chronicler's format, each summary job leaves one line in the serve
log saying it fell back to extractive and why, each fold a line naming the stand-in it took in,
and `/memory` marks those chapters; `/readyz` names the upstream when it is down and the
database when it cannot answer, and `serve` says at start that its upstream is unreachable
(and starts all the same)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, free_port
from kioku.store import Store
from kioku.tls import tls_context
from tests.killable import Server
from tests.pg import fresh_schema
from tests.test_service_support import words

pytestmark = pytest.mark.slow

SERVE = ("--profile", "local-8k", "--window", "1536", "--summary-delay", "0")
PROSE = "What a lovely conversation! They talked about the lighthouse and many other things."
WHY = "the replies' lines were not borne out by the messages they cite"
LATE = "the summaries were late at the prompt's ceiling"
CID = "observed"


def wait(cond: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"waiting for {what}")


def client(server: Server) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        timeout=30,
        verify=tls_context(),
        headers={"Authorization": f"Bearer {server.key}"},
    )


@pytest.fixture
def chronicler() -> Iterator[FakeUpstream]:
    with FakeUpstream(reply=lambda _body: PROSE) as up:
        yield up


def test_serve_logs_each_fallback_and_fold_and_memory_marks_the_stand_ins(
    tmp_path: Path, chronicler: FakeUpstream
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    store = Store.open(db)
    key = create_key(store, "acme")[1]
    log = tmp_path / "serve.log"
    up = FakeUpstream().start()  # stopped on the way, to see /readyz say so
    up_running = True
    args = (*SERVE, "--summarizer-upstream", chronicler.url)
    server = Server(db, up.url, log, key, args=args)
    server.start()
    try:
        with client(server) as h:
            # ready: both models and the database answer
            r = h.get("/readyz")
            assert r.status_code == 200, r.text
            assert r.json() == {
                "ok": True,
                "down": [],
                "checks": {n: {"ok": True} for n in ("upstream", "database", "chronicler")},
            }

            def memory() -> dict[str, Any]:
                r = h.get(f"/v1/conversations/{CID}/memory")
                assert r.status_code == 200, r.text
                return dict(r.json())

            # turns until a chapter the chronicler's model could not write is in memory
            for turn in range(80):
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": words(turn, 60)}],
                }
                r = h.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"X-Kioku-Conversation": CID, "X-Kioku-Mode": "stateful"},
                )
                assert r.status_code == 200, r.text
                # each summary is written before the next turn: the fold takes the
                # chronicler's chapter in, not a stand-in for a late one
                cid = store.find_conversation("acme", CID).id
                wait(lambda c=cid: not store.jobs(c, "queued", "running"), "the summary jobs")
                if memory()["chapters"]:
                    break
            mem = memory()
            assert mem["chapters"], "the conversation should have folded"
            # every chapter stands in for the model's: most because its replies were not
            # borne out; a forced cut's because the summaries were late at the ceiling
            marks = {c["stand_in"] for c in mem["chapters"]}
            assert WHY in marks and marks <= {WHY, LATE}, marks
            for chapter in mem["chapters"]:
                assert chapter["source"] == "extractive"
                reason = chapter["data"]["fallback"]["reason"]
                assert reason == ("ungrounded" if chapter["stand_in"] == WHY else "late")
        assert chronicler.chats(), "the chronicler's model was asked"

        # one line per summary job that fell back, each with why; one per fold
        cid = store.find_conversation("acme", CID).id
        fell_back = [
            i for i in store.items(cid) if i.data.get("fallback", {}).get("reason") == "ungrounded"
        ]

        def job_lines() -> list[str]:
            return [ln for ln in log.read_text().splitlines() if "kioku.worker:" in ln]

        wait(lambda: len(job_lines()) >= len(fell_back), "a line per summary job")
        lines = job_lines()
        assert len(lines) == len(fell_back), lines
        for item in fell_back:
            (line,) = [ln for ln in lines if f"(seq {item.first_seq}–{item.last_seq})" in ln]
            assert re.search(rf"chapter job \d+ of '{cid}'", line), line
            assert f"fell back to extractive, {WHY} (3 attempts" in line, line
        folds = [ln for ln in log.read_text().splitlines() if "kioku.compaction: fold" in ln]
        assert folds and f"(stand-in: {WHY})" in folds[0], folds
        assert "raw window starts at" in folds[0]

        # the upstream goes down: not ready, and /readyz says which (no URL, no key needed)
        up.stop()
        up_running = False
        r = httpx.get(f"{server.url}/readyz", timeout=30, verify=tls_context())
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["down"] == ["upstream"] and body["ok"] is False
        assert body["checks"]["upstream"]["error"].startswith("cannot connect")
        assert body["checks"]["database"] == {"ok": True}
        assert "127.0.0.1" not in r.text
        assert httpx.get(f"{server.url}/healthz", verify=tls_context()).status_code == 200
    finally:
        server.stop()
        store.close()
        if up_running:
            up.stop()


def test_serve_starts_against_an_unreachable_upstream_and_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    server = Server(db, dead, tmp_path / "serve.log", args=("--no-worker",))
    server.start()  # it serves: /healthz answers
    try:
        said = server.log.read_text()
        (line,) = [ln for ln in said.splitlines() if "unreachable" in ln]
        assert f"the upstream at {dead} is unreachable: cannot connect" in line
        assert "/readyz" in line
        r = httpx.get(f"{server.url}/readyz", timeout=30, verify=tls_context())
        assert r.status_code == 503 and r.json()["down"] == ["upstream"]
    finally:
        server.stop()


def test_readyz_names_the_database_when_it_cannot_answer(tmp_path: Path) -> None:
    with fresh_schema() as db, FakeUpstream() as up:
        server = Server(db, up.url, tmp_path / "serve.log", args=("--no-worker",))
        server.start()
        try:
            r = httpx.get(f"{server.url}/readyz", timeout=30, verify=tls_context())
            assert r.status_code == 200, r.text
            # kioku's schema goes away under the running service
            schema = re.search(r"search_path%3D(\w+)|search_path=(\w+)", db)
            assert schema is not None
            name = schema.group(1) or schema.group(2)
            admin = create_engine("postgresql+psycopg://" + db.split("://", 1)[1].split("?", 1)[0])
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
                conn.execute(text(f'CREATE SCHEMA "{name}"'))  # fresh_schema drops it again
            admin.dispose()
            r = httpx.get(f"{server.url}/readyz", timeout=30, verify=tls_context())
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["down"] == ["database"]
            assert body["checks"]["database"]["error"].startswith("the database cannot answer")
            assert "kioku" not in body["checks"]["database"]["error"]  # no user, no URL
        finally:
            server.stop()
