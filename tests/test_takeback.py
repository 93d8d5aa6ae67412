"""What the user takes back is gone from what any model reads; authorship comes from the role
(issue 43, points 2 and 4), through a real `kioku serve` over HTTP, on SQLite and PostgreSQL.

The upstream is a scripted double that answers the chat, the chronicler (a chapter in its own
words over the secret, else a refusal: the chapter is written extractively) and the notes model
(a note for each message that names a sister or a cat), and records every request. A message a chapter, a note and a recollection came from is
deleted (by a client's sync, by its next transcript, by REST, by `kioku forget`) or edited away: the next five prompts
the upstream receives hold none of its words, and the ledger shows its note retracted with the
change as the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.context import RECALL_KEY
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.store import Store
from kioku.tls import tls_context
from tests.killable import ROOT, Server
from tests.pg import BACKENDS, backend_url
from tests.test_service_support import words

pytestmark = pytest.mark.slow

SERVE = ("--profile", "local-8k", "--summary-delay", "0")
CARD = "You are Mika, a cheerful friend from the coast."
SECRET = "My sister is called Anna and she lives in Kyoto."
SECRET_WORDS = ("Anna", "Kyoto")
QUESTION = "Do you remember where my sister lives?"
DEADLINE_S = 120.0
USER = "mika (user)"  # how a user who borrows the character's name is stored


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


def notes_reply(prompt: str) -> str:
    """The notes model: a note for each message that names a sister or a cat, citing it."""
    out = []
    for m in re.finditer(r"⟦(\d+)⟧ ([^:\n]+): (.*)", prompt):
        seq, said = int(m[1]), m[3]
        if "sister" in said and "Anna" in said:
            out.append({"subject": "Anna", "kind": "relation", "text": "Anna lives in Kyoto"})
        elif "Tofu" in said:
            out.append({"subject": "Tofu", "kind": "fact", "text": "Tofu is a cat"})
        else:
            continue
        out[-1]["seq"] = seq
    return "\n".join(json.dumps(o) for o in out) or "NONE"


def chronicle(prompt: str) -> str:
    """The chronicler: a chapter in its own words (a recollection brings back what memory does
    not quote), or a refusal (the chapter is written extractively)."""
    if "Anna" in prompt:
        return "- Anna is the sister of the user and lives in Kyoto."
    return "I'm sorry, but I can't help with that."


def reply(body: dict[str, Any]) -> str:
    messages = body.get("messages") or [{"content": ""}]
    first = str(messages[0]["content"])
    if first.startswith("You keep the notes"):
        return notes_reply(str(messages[-1]["content"]))
    if "chronicler" in first[:300]:
        return chronicle(str(messages[-1]["content"]))
    return "Mika smiles. " + words(len(messages), 22)


class Chat:
    """One conversation through the proxy and the REST routes, and what the store holds."""

    def __init__(self, server: Server, store: Store, cid: str, headers: dict[str, str]) -> None:
        self.server, self.store, self.cid = server, store, cid
        self.headers = {"X-Kioku-Conversation": cid, **headers}
        self.http = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {server.key}"},
            timeout=60,
            verify=tls_context(),
        )

    @property
    def key(self) -> str:
        return self.store.find_conversation("acme", self.cid).id

    def turn(self, text: str, **message: Any) -> None:
        self.send([{"role": "user", "content": text, **message}])

    def send(self, chat: list[dict]) -> None:
        """A turn: one new message (a stateful client) or the whole chat (a stateless one)."""
        body = {"model": "m", "messages": [{"role": "system", "content": CARD}, *chat]}
        r = self.http.post("/v1/chat/completions", headers=self.headers, json=body)
        assert r.status_code == 200, r.text
        self.settle()

    def transcript(self, change: Callable[[int, str], str | None] = lambda q, t: t) -> list[dict]:
        """The chat as a client shows it, each message through `change` (None: left out)."""
        out = []
        for e in self.store.entries(self.key):
            if e.message.is_empty():
                continue
            text = change(e.seq, e.text)
            if text is not None:
                out.append({"role": e.role, "content": text})
        return out

    def sync(self, messages: list[dict]) -> dict[str, Any]:
        r = self.http.post(f"/v1/conversations/{self.cid}/sync", json={"messages": messages})
        assert r.status_code == 200, r.text
        self.settle()
        return dict(r.json())

    def settle(self) -> None:
        """Wait until the worker has written every summary and note it has to write."""
        end = time.monotonic() + DEADLINE_S
        while any(j.status in ("queued", "running") for j in self.store.jobs(self.key)):
            assert time.monotonic() < end, "the worker did not finish"
            time.sleep(0.02)

    def close(self) -> None:
        self.http.close()


def serve(db: str, tmp_path: Path, up: FakeUpstream, store: Store) -> Server:
    # the double is named the chronicler outright: `local-8k` alone keeps chapters extractive
    args = (*SERVE, "--summarizer-upstream", up.url)
    server = Server(db, up.url, tmp_path / "serve.log", create_key(store, "acme")[1], args)
    server.start()
    return server


def told(chat: Chat) -> None:
    """The secret at seq 2, then enough talk that it is folded into a chapter, a note is
    taken from it, and a question brings it back as a recollection."""
    chat.turn("Hi Mika, how are you today?")
    history = chat.transcript()
    history.append({"role": "user", "content": SECRET})
    history.append({"role": "assistant", "content": "What a lovely place to live!"})
    for i in range(220):
        role = "user" if i % 2 == 0 else "assistant"
        history.append({"role": role, "content": words(i, 25)})
    chat.sync(history)
    end = time.monotonic() + DEADLINE_S
    while chat.store.conversation(chat.key).raw_start <= 3 or not notes_from(chat, 2):
        assert time.monotonic() < end, "seq 2 was never folded into memory"
        chat.turn(words(len(history), 25))


def notes_from(chat: Chat, seq: int) -> list[Any]:
    from kioku.notes import current_notes

    return [n for n in current_notes(chat.store.note_ledger(chat.key)) if n.source_seq == seq]


def recalled(chat: Chat, seq: int) -> bool:
    """Whether the last user message was shown a recollection that holds `seq`."""
    last = chat.store.tail(chat.key, 1, role="user")[0]
    got = (last.meta or {}).get(RECALL_KEY, {}).get("got") or []
    return any(a <= seq <= b for a, b in got)


def prompts_after(up: FakeUpstream, start: int) -> list[str]:
    return [json.dumps(r["messages"], ensure_ascii=False) for r in up.chats()[start:]]


def forget_by_cli(db: str, cid: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIOKU_TENANT": "acme", "KIOKU_DB": db}
    code = "from kioku.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "forget", cid, "2", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"] is True


@pytest.mark.parametrize("how", ["sync", "turn", "rest", "cli", "edit"])
def test_a_message_taken_back_is_in_no_later_prompt(db: str, tmp_path: Path, how: str) -> None:
    store = Store.open(db)
    with FakeUpstream(reply=reply) as up:
        server = serve(db, tmp_path, up, store)
        chat = Chat(server, store, f"takeback-{how}", {"X-Kioku-Character": "Mika"})
        try:
            told(chat)
            chat.turn(QUESTION)
            # what it was the source of, before: a chapter line, a note, a recollection
            chapter = next(
                i for i in store.items(chat.key, "active") if i.first_seq <= 2 <= i.last_seq
            )
            assert "Kyoto" in chapter.text
            (note,) = notes_from(chat, 2)
            assert recalled(chat, 2)
            assert "Kyoto" in prompts_after(up, len(up.chats()) - 1)[0]
            start = len(up.chats())
            if how == "sync":
                out = chat.sync(chat.transcript(lambda q, t: None if q == 2 else t))
                assert out["deleted"] == [2]
            elif how == "turn":  # a stateless client's next turn shows the chat without it
                chat.send(
                    chat.transcript(lambda q, t: None if q == 2 else t)
                    + [{"role": "user", "content": QUESTION}]
                )
                assert chat.store.entries(chat.key, 2, 2)[0].message.is_empty()
            elif how == "edit":
                edited = "My sister is doing well."
                out = chat.sync(chat.transcript(lambda q, t: edited if q == 2 else t))
                assert out["edited"] == [2]
            elif how == "rest":
                r = chat.http.delete(f"/v1/conversations/{chat.cid}/messages/2")
                assert r.status_code == 200, r.text
                assert r.json()["deleted"] is True and r.json()["retracted"]
            else:
                forget_by_cli(db, chat.cid)
            for k in range(5):
                chat.turn(QUESTION if k % 2 == 0 else words(1000 + k, 20))
            later = prompts_after(up, start)
            assert len(later) >= 5
            leaked = [w for p in later for w in SECRET_WORDS if w in p]
            assert not leaked, leaked
            ledger = store.note_ledger(chat.key)
            why = "edited" if how == "edit" else "deleted"
            tomb = [e for e in ledger if e.supersedes == note.id and e.retracted]
            assert [e.origin for e in tomb] == [f"retracted: message #2 {why}"]
            assert not notes_from(chat, 2)
            # the log keeps the old text as a version for the operator
            versions = store.message_versions(chat.key, 2)
            assert [v["text"] for v in versions] == [SECRET]
        finally:
            chat.close()
            server.stop()
    store.close()


def test_a_user_borrowing_the_characters_name_is_never_filed_as_the_character(
    db: str, tmp_path: Path
) -> None:
    """X-Kioku-Character: Mika, X-Kioku-User: Mika, and a user message named Mika: what the user
    typed reaches the notes model, the chapters and the ledger as the user's."""
    store = Store.open(db)
    with FakeUpstream(reply=reply) as up:
        server = serve(db, tmp_path, up, store)
        headers = {"X-Kioku-Character": "Mika", "X-Kioku-User": "Mika"}
        chat = Chat(server, store, "borrowed", headers)
        try:
            chat.turn("I adopted a cat named Tofu last week.", name="Mika")
            end = time.monotonic() + DEADLINE_S
            n = 0
            while store.conversation(chat.key).raw_start == 0 or not store.note_ledger(chat.key):
                assert time.monotonic() < end, "nothing was folded"
                chat.turn(words(n, 25), name="Mika" if n % 2 else "mika ")
                n += 1
            entries = store.entries(chat.key)
            users = {e.seq for e in entries if e.role == "user"}
            assert {e.message.author.casefold() for e in entries if e.seq in users} == {USER}
            # the notes model's input
            notes_inputs = [
                str(r["messages"][-1]["content"])
                for r in up.chats()
                if str(r["messages"][0]["content"]).startswith("You keep the notes")
            ]
            assert notes_inputs
            for text in notes_inputs:
                for m in re.finditer(r"⟦(\d+)⟧ ([^:\n]+):", text):
                    if int(m[1]) in users:
                        assert m[2].casefold() == USER, m[0]
            # the ledger
            ledger = store.note_ledger(chat.key)
            assert any(n.subject == "Tofu" for n in ledger)
            for n in ledger:
                if n.source_seq in users:
                    assert n.said_by.casefold() == USER, n
            # the extractive chapters
            chapters = [i for i in store.items(chat.key, "active") if i.kind == "chapter"]
            assert chapters
            for item in chapters:
                for line in item.data.get("lines", []):
                    if line.get("seq") in users:
                        assert "(user)" in str(line.get("speaker")), line
                assert not re.search(r"(?m)^.*Mika: I adopted", item.text)
        finally:
            chat.close()
            server.stop()
    store.close()
