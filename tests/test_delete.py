"""Deleting a conversation (issue 42.4): `kioku delete` and `DELETE /v1/conversations/{id}`
against a real `kioku serve` (summaries in the serving process, a small window so memory,
jobs and notes exist), on SQLite and PostgreSQL, while a turn of that conversation is in flight.

What must hold: the turn in flight finishes first (its client gets its reply) and the delete
waits for it; afterwards no table of the database (every table, read by SQLAlchemy's reflection,
so a table added later is covered) holds a row that names the conversation, its key or a word
only it said; its id starts a new, empty conversation; and the other conversation, which shares
a picture with it, is exactly as it was.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, select

from kioku.errors import NotFound
from kioku.messages import Message, Part
from kioku.note import NoteDraft
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.store import Store, schema
from kioku.store.db import make_engine
from tests.killable import ROOT, Server
from tests.pg import BACKENDS, backend_url
from tests.test_service_support import words

MARK = "zanzibar"  # said only in the conversation that is deleted
DOOMED, KEPT = "doomed-chat", "kept-chat"
SHARED = "https://pictures.invalid/shared-picture.png"  # sent in both conversations
SERVE = ("--profile", "local-8k", "--window", "1536", "--summary-delay", "0")
TURNS = 8
WAIT_S = 120.0


class GatedUpstream(FakeUpstream):
    """A fake upstream that holds every request asking for something `slowly` until `release`
    is set (`holding` says one arrived): a turn in flight for as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    async def _respond(self, method: str, path: str, raw: bytes, writer: Any) -> None:
        if b"slowly" in raw and not self.release.is_set():
            self.holding.set()
            while not self.release.is_set():
                await asyncio.sleep(0.005)
        await super()._respond(method, path, raw, writer)


def until(what: str, ok: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def rows_naming(url: str, *needles: str) -> dict[str, int]:
    """Per table of the database, the rows with a value holding one of `needles`."""
    engine = make_engine(url, readonly=True)
    meta = MetaData()
    meta.reflect(engine)
    assert {t.name for t in schema.metadata.sorted_tables} <= set(meta.tables)
    found: dict[str, int] = {}
    try:
        with engine.connect() as conn:
            for table in meta.sorted_tables:
                n = sum(
                    1 for row in conn.execute(select(table)) if any(_holds(v, needles) for v in row)
                )
                if n:
                    found[table.name] = n
    finally:
        engine.dispose()
    return found


def _holds(value: Any, needles: tuple[str, ...]) -> bool:
    if value is None:
        return False
    if isinstance(value, bytes | memoryview):
        data = bytes(value)
        return any(n.encode() in data for n in needles)
    return any(n in str(value) for n in needles)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def said(conversation: str, i: int) -> str:
    extra = f" {MARK} {MARK}s" if conversation == DOOMED else ""
    return f"{conversation[:4]} turn {i}: " + words(i * 5 + len(conversation), 50) + extra


def chat(
    client: httpx.Client,
    conversation: str,
    history: list[dict[str, Any]],
    content: Any,
    key: str,
) -> httpx.Response:
    """One stateless turn (the whole transcript), named by an Idempotency-Key."""
    body = {"model": "m", "messages": [*history, {"role": "user", "content": content}]}
    headers = {
        "X-Kioku-Conversation": conversation,
        "X-Kioku-Mode": "stateless",
        "Idempotency-Key": key,
    }
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    if r.status_code == 200:
        history += [
            {"role": "user", "content": content},
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
        ]
    return r


def populate(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    """Turns with pictures (one both conversations send) and an edit further back."""
    history: list[dict[str, Any]] = []
    own = f"https://pictures.invalid/{conversation}-{MARK if conversation == DOOMED else 'tea'}.png"
    for i in range(TURNS):
        content: Any = said(conversation, i)
        if i in (1, 2):
            content = [{"type": "text", "text": content}, image(SHARED if i == 1 else own)]
        if i == 4:  # the client edited its first message: the old one becomes a version
            history[0] = {**history[0], "content": history[0]["content"] + " (edited)"}
        r = chat(client, conversation, history, content, f"{conversation}-{i}")
        assert r.status_code == 200, r.text
    return history


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line, with no KIOKU_* variable set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIOKU_")}
    return subprocess.run(
        [sys.executable, "-m", "kioku.cli", *args],
        env={**env, "PYTHONPATH": str(ROOT), "KIOKU_PROFILE": "local-8k"},
        capture_output=True,
        text=True,
        input=stdin,
        timeout=WAIT_S,
    )


def quiet(url: str) -> Callable[[], bool]:
    """True once no summary job of either conversation is queued or running and nothing was
    written since the last call (notes follow a finished job)."""
    last: list[dict[str, int]] = []

    def check() -> bool:
        store = Store.open(url, readonly=True)
        try:
            keys = [c.id for c in store.conversations()]
            pending = any(store.jobs(k, "queued", "running") for k in keys)
        finally:
            store.close()
        now = rows_naming(url, DOOMED, KEPT)
        settled = not pending and last == [now]
        last[:] = [now]
        return settled

    return check


@pytest.fixture(params=BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Server, GatedUpstream]]:
    with backend_url(request.param, tmp_path) as url, GatedUpstream() as up:
        store = Store.open(url)
        _, key = create_key(store, "acme")
        store.close()
        server = Server(url, up.url, tmp_path / "serve.log", key=key, args=SERVE)
        server.start()
        try:
            yield url, server, up
        finally:
            server.stop()


@pytest.mark.parametrize("how", ["cli", "rest"])
def test_delete_during_a_turn_leaves_no_row_and_frees_the_id(
    served: tuple[str, Server, GatedUpstream], how: str
) -> None:
    url, server, up = served
    auth = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=WAIT_S) as client:
        populate(client, KEPT)
        history = populate(client, DOOMED)
        until("the summaries to settle", quiet(url))
        store = Store.open(url, readonly=True)
        key = store.find_conversation("acme", DOOMED).id
        store.close()
        before = rows_naming(url, DOOMED, key, MARK)
        # the rows the delete must find: every kind a served chat writes
        wanted = {"conversations", "messages", "message_versions", "memory_items", "jobs"}
        wanted |= {"compaction_log", "blobs", "turn_locks", "idempotency_keys"}
        assert wanted <= before.keys(), before
        kept = rows_naming(url, KEPT, "tea.png", SHARED)
        kept_export = cli("export", KEPT, "--db", url)
        assert kept_export.returncode == 0 and kept_export.stdout.count("\n") > TURNS * 2

        # a turn in flight: the upstream holds its reply
        answered: list[httpx.Response] = []
        turn = threading.Thread(
            target=lambda: answered.append(
                chat(client, DOOMED, list(history), f"say it slowly, {MARK}", "slow")
            )
        )
        turn.start()
        until("the turn to reach the upstream", up.holding.is_set)

        if how == "cli":
            proc = subprocess.Popen(
                [sys.executable, "-m", "kioku.cli", "delete", DOOMED, "--db", url, "--yes"],
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("KIOKU_")},
                    "PYTHONPATH": str(ROOT),
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert proc.stderr is not None
            note = proc.stderr.readline()  # the delete says it waits for the turn
            assert "waiting for the turn of 'doomed-chat' in flight" in note, note
            up.release.set()
            out, err = proc.communicate(timeout=WAIT_S)
            assert proc.returncode == 0, err
            assert out.startswith("deleted 'doomed-chat' (tenant 'acme'):"), out
        else:
            deleted: list[httpx.Response] = []
            gone = threading.Thread(
                target=lambda: deleted.append(client.delete(f"/v1/conversations/{DOOMED}"))
            )
            gone.start()
            log = Path(server.log)
            until("the delete to wait", lambda: "waiting for its turn in flight" in log.read_text())
            up.release.set()
            gone.join(WAIT_S)
            assert deleted[0].status_code == 200, deleted[0].text
            assert deleted[0].json()["deleted"]["messages"] == 2 * TURNS + 2
        turn.join(WAIT_S)
        assert answered[0].status_code == 200, answered[0].text  # the turn finished first

        assert rows_naming(url, DOOMED, key, MARK) == {}
        assert rows_naming(url, KEPT, "tea.png", SHARED) == kept  # the shared picture stays
        assert cli("export", KEPT, "--db", url).stdout == kept_export.stdout

        # the id is free: a new conversation, which knows nothing of the old one
        fresh: list[dict[str, Any]] = []
        r = chat(client, DOOMED, fresh, "Hello, who are you?", "again")
        assert r.status_code == 200, r.text
        assert MARK not in str(up.chats()[-1]["messages"])
        store = Store.open(url, readonly=True)
        assert store.find_conversation("acme", DOOMED).next_seq == 2
        store.close()
        r = client.delete(f"/v1/conversations/{DOOMED}")
        assert (
            r.status_code == 200 and client.delete(f"/v1/conversations/{DOOMED}").status_code == 404
        )


def fill(store: Store, conversation: str, word: str, picture: str) -> str:
    """A conversation with a row in each table the served test leaves empty (notes, facts,
    mentions, a reply's other choices, recall segments) and media; its key."""
    from kioku.store.segments import StoredSegment

    key = store.ensure_conversation(conversation, tenant="acme").id
    store.put_blobs({picture: f"picture of {word}".encode()})
    store.append(key, Message("user", (Part("text", word), Part("image", "", ref=picture))), 5)
    store.append(key, Message.assistant(f"a reply about {word}"), 5)
    store.set_choices(key, 1, [Message.assistant(f"another reply about {word}")])
    note = store.add_note(
        key, NoteDraft("Ren", "habit", f"likes {word}", 0), author="extractor", origin="t"
    )
    store.add_note_facts(key, note, said_by="Ren", on_date=None, slot="likes", seq=0)
    store.save_recall_segments(key, [StoredSegment(0, 1, "t", word.encode())])
    store.log(key, "chapter", "ok", detail=word)
    store.incr(key, "chapters_written")
    return key


def test_the_store_deletes_every_row_of_one_conversation(tmp_path: Path) -> None:
    for backend in BACKENDS:
        if backend == "postgresql" and not os.environ.get("KIOKU_TEST_PG"):
            continue  # the served test above needs (and in CI, has) it
        with backend_url(backend, tmp_path) as url:
            store = Store.open(url)
            key = fill(store, DOOMED, MARK, "1" * 64)
            kept = fill(store, KEPT, "tea", "2" * 64)
            store.put_blobs({"3" * 64: b"shared"})
            for cid in (key, kept):  # a picture both sent: it stays with the one that is kept
                store.append(cid, Message("user", (Part("image", "", ref="3" * 64),)), 1)
            before = rows_naming(url, DOOMED, MARK)
            assert {"notes_ledger", "note_facts", "note_mentions", "reply_choices"} <= set(before)
            assert {"recall_segments", "blobs", "counters", "compaction_log"} <= set(before)
            others = rows_naming(url, KEPT, "tea", "shared")
            deleted = store.delete_conversation(key)
            assert deleted["messages"] == 3 and deleted["blobs"] == 1
            assert rows_naming(url, DOOMED, MARK) == {}
            assert rows_naming(url, KEPT, "tea", "shared") == others
            # what a summary job that finishes late writes is not kept either
            store.log(key, "chapter", "ok")
            store.incr(key, "chapters_written")
            with pytest.raises(NotFound):
                store.add_note(
                    key, NoteDraft("Ren", "habit", "late", 0), author="extractor", origin="t"
                )
            assert rows_naming(url, DOOMED, MARK) == {}
            store.close()


def test_an_index_of_a_deleted_conversation_is_not_searched_for_the_next(tmp_path: Path) -> None:
    """`kioku delete` runs in another process than the server that indexed the conversation:
    the server's index must not lend its words to a new conversation under the same key."""
    from kioku.recall.indexes import RecallIndexes

    url = f"sqlite:///{tmp_path / 'k.db'}"
    served, elsewhere = Store.open(url), Store.open(url)
    key = served.ensure_conversation(DOOMED, tenant="acme").id
    for i in range(4):
        served.append(key, Message.user(f"{MARK} number {i}"), 5)
    indexes = RecallIndexes(served)
    assert indexes.sync(key).search(MARK)
    elsewhere.delete_conversation(key)
    again = elsewhere.ensure_conversation(DOOMED, tenant="acme").id
    assert again == key
    for i in range(8):  # longer than before: a log that only grew would look like the old one
        elsewhere.append(key, Message.user(f"tea number {i}"), 5)
    assert indexes.sync(key).search(MARK) == []
    assert indexes.sync(key).search("tea")
