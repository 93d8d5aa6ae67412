"""Issue 43.5's floor through a real `kioku serve`: secrets told in every phrasing the attack used
(and others of the same kinds) reach no summarizer's input, no chapter, no note and no
recollection; the log keeps them. SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.store import Store
from kioku.tls import tls_context
from tests.killable import Server
from tests.pg import BACKENDS, backend_url
from tests.test_sensitive import SAID, VALUES
from tests.test_service_support import words

CID = "vault"
SERVE = ("--profile", "local-8k", "--window", "2048", "--summary-delay", "0")


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


def turn(h: httpx.Client, text: str) -> str:
    r = h.post(
        "/v1/chat/completions",
        headers={"X-Kioku-Conversation": CID},
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
    )
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def settled(h: httpx.Client) -> bool:
    folding = h.get(f"/v1/conversations/{CID}/status").json()["folding"]
    return not folding["queued"] and not folding["running"]


def wait_settled(h: httpx.Client, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not settled(h):
        assert time.monotonic() < deadline, "the worker never finished its jobs"
        time.sleep(0.05)


def text_of(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request.get("messages", []))


def test_a_secret_told_to_kioku_serve_reaches_no_summarizer_memory_or_recollection(
    db: str, tmp_path: Path
) -> None:
    store = Store.open(db)
    # a reply that says nothing back: a reply that repeats a value alone, with no keyword, is
    # not caught (docs/service.md)
    with FakeUpstream(reply=lambda body: "Mika nods.") as up, FakeUpstream() as summarizer:
        args = (*SERVE, "--summarizer-upstream", summarizer.url)
        server = Server(db, up.url, tmp_path / "serve.log", create_key(store, "acme")[1], args)
        server.start()
        auth = {"Authorization": f"Bearer {server.key}"}
        try:
            with httpx.Client(
                base_url=server.url, headers=auth, timeout=60, verify=tls_context()
            ) as h:
                # past the window: chapters fold as they come due, the worker keeping up (no
                # forced cut: the chronicler and the notes model read the secrets' range)
                for said in [*SAID, *(f"turn {n}: " + words(n, 40) for n in range(30))]:
                    turn(h, said)
                    wait_settled(h)
                # a chapter now (written, and its notes taken, by the summarizer's model), then
                # a cut of the rest, so that only memory and recall hold any of it
                assert h.post(f"/v1/conversations/{CID}/summarize").status_code == 200
                wait_settled(h)
                assert h.post(f"/v1/conversations/{CID}/cut").status_code == 200
                wait_settled(h)
                turn(h, "Do you remember my password?")
                memory = h.get(f"/v1/conversations/{CID}/memory").text
        finally:
            server.stop()
    asked = text_of(up.chats()[-1])
    assert "Do you remember my password?" in asked
    assert "withheld" in asked  # recall brought the told lines back, as the mark
    inputs = [text_of(r) for r in summarizer.chats()]
    # the chronicler and the notes model were asked, of the messages the secrets were told in
    notes_inputs = [t for t in inputs if re.search(r"^⟦\d+⟧ [^:\n]+: ", t, re.MULTILINE)]
    assert any("withheld" in t for t in notes_inputs)  # the notes model read the secrets' range
    assert any("withheld" in t for t in inputs if t not in notes_inputs)  # and the chronicler
    key = store.find_conversation("acme", CID).id
    notes = "\n".join(f"{n.subject} {n.text}" for n in store.note_ledger(key))  # every note ever
    for value in VALUES:
        plain = unicodedata.normalize("NFKC", value)
        for where, text in [("prompt", asked), ("memory", memory), ("notes", notes)] + [
            ("summarizer input", t) for t in inputs
        ]:
            assert value not in text and plain not in text, (where, value)
    entries = [e.text for e in store.entries(key)]
    assert all(said in entries for said in SAID)  # the log keeps every message as written
    store.close()
