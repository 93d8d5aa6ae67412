"""A conversation is held by its store key, found by its name once per request (issue 43):
after a rename the old name is unknown everywhere; a name with `/` (or over 200 characters) is
reachable by every REST route percent-encoded; and a client that sent transcripts and now sends
lone messages gets a 409 that says what to do, while Test Message stays a side request."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from kioku.ids import key_for
from kioku.service import client_api
from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service

CARD = "You are Mika, who runs a tea shop."


def turn(
    service: Harness, cid: str, messages: list[dict[str, Any]], **headers: str
) -> httpx.Response:
    with service.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": cid, **headers},
            json={"messages": messages},
        )
    service.idle()
    return r


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def stateful(service: Harness, cid: str, text: str) -> httpx.Response:
    r = turn(service, cid, user(text), **{"X-Kioku-Mode": "stateful"})
    assert r.status_code == 200, r.text
    return r


def test_after_a_rename_the_old_name_is_unknown_and_starts_a_new_conversation(
    service: Harness,
) -> None:
    stateful(service, "nm-old", "first words")
    key = service.store.find_conversation("acme", "nm-old").id
    with service.http() as h:
        r = h.post("/v1/conversations/nm-old/rename", json={"id": "nm-new"})
        assert r.status_code == 200, r.text
        assert h.get("/v1/conversations/nm-old/messages").status_code == 404
        assert h.post("/v1/conversations/nm-old/summarize").status_code == 404
        sync = h.post("/v1/conversations/nm-old/sync", json={"messages": user("x")})
        assert sync.status_code == 404
    # the cached conversation of this process is the renamed one's, never the old name's
    stateful(service, "nm-old", "a new chat under the old name")
    stateful(service, "nm-new", "more of the renamed chat")
    fresh = service.store.find_conversation("acme", "nm-old").id
    assert fresh != key and service.store.find_conversation("acme", "nm-new").id == key
    assert [e.text for e in service.store.entries(fresh)][0] == "a new chat under the old name"
    assert [e.role for e in service.store.entries(key)] == ["user", "assistant"] * 2
    assert service.store.entries(key)[2].text == "more of the renamed chat"
    renames = [e for e in service.store.log_entries(key) if e["event"] == "rename"]
    assert len(renames) == 1 and "nm-new" in renames[0]["detail"]


def test_a_name_with_a_slash_or_over_200_characters_is_reachable_by_every_route(
    service: Harness,
) -> None:
    for name in ("nm a/b", "nm/" + "x" * 230):
        r = stateful(service, name, "hello from a chat with an odd name")
        kept = r.headers["X-Kioku-Conversation"]
        assert kept == quote(key_for(name), safe="")
        path = f"/v1/conversations/{quote(name, safe='')}"
        with service.http() as h:
            for route in ("/messages", "/memory", "/status", "/transcript", "/log", "/jobs"):
                got = h.get(path + route)
                assert got.status_code == 200, (name[:8], route, got.text)
            versions = h.get(path + "/messages/0/versions")
            assert versions.status_code == 200, versions.text
            assert h.get(path + "/positions", params={"seq": [0, 1]}).status_code == 200
            # the same chat under the id it is kept under
            assert h.get(f"/v1/conversations/{kept}/messages").json()["data"][0]["seq"] == 0
            # a client's calls too, with the scopes a chat key has
            said = r.json()["choices"][0]["message"]["content"]
            whole = [*user("hello from a chat with an odd name"),
                     {"role": "assistant", "content": said}, *user("and one more")]  # fmt: skip
            synced = h.post(path + "/sync", json={"messages": whole})
            assert synced.status_code == 200 and synced.json()["appended"] == [2], synced.text
            renamed = h.post(path + "/rename", json={"id": name + "/2"})
            assert renamed.status_code == 200, renamed.text
            again = h.get(f"/v1/conversations/{quote(name + '/2', safe='')}/messages")
            assert again.status_code == 200 and len(again.json()["data"]) == 3
            assert h.get(path + "/messages").status_code == 404


def test_lone_messages_after_transcripts_are_refused_once_the_client_switched(
    service: Harness,
) -> None:
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": "Welcome in."}]
    for i in range(2):
        chat.append({"role": "user", "content": support.words(i)})
        r = turn(service, "nm-switch", [{"role": "system", "content": CARD}, *chat])
        assert r.status_code == 200, r.text
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    key = service.store.find_conversation("acme", "nm-switch").id
    before = len(service.store.entries(key))
    # Test Message (one user message, no card), pressed twice: answered, nothing stored
    for _ in range(2):
        r = turn(service, "nm-switch", user("Hi"))
        assert r.status_code == 200 and r.headers["X-Kioku-Stored"] == "false"
    # another lone message: the client sends one message at a time now; every one would be
    # lost, so it is refused with what to do, and nothing is stored
    r = turn(service, "nm-switch", user("So, about the tea we talked about?"))
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "mode_unclear" and "X-Kioku-Mode: stateful" in error["message"]
    assert len(service.store.entries(key)) == before
    # the header it names stores it
    r = turn(service, "nm-switch", user("So, about the tea?"), **{"X-Kioku-Mode": "stateful"})
    assert r.status_code == 200 and "X-Kioku-Stored" not in r.headers
    assert service.store.entries(key)[-2].text == "So, about the tea?"
    # a transcript in between starts over: the next Test Message is a side request again
    r = turn(service, "nm-switch", user("Hi"))
    assert r.status_code == 200 and r.headers["X-Kioku-Stored"] == "false"


def test_a_branch_refused_for_its_content_creates_nothing(service: Harness) -> None:
    chat: list[dict[str, Any]] = []
    for i in range(4):
        chat.append({"role": "user", "content": support.words(i)})
        r = turn(service, "nm-parent", [{"role": "system", "content": CARD}, *chat])
        assert r.status_code == 200, r.text
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    parent = service.store.find_conversation("acme", "nm-parent").id
    before = [e.text for e in service.store.entries(parent)]
    huge = {"role": "user", "content": support.words(99, 60_000)}
    branch = [{"role": "system", "content": CARD}, *chat[:4], huge]
    r = turn(service, "nm-branch", branch, **{"X-Kioku-Parent": "nm-parent"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert service.svc.conversation_key("acme", "nm-branch") is None  # no row, no copy
    assert [e.text for e in service.store.entries(parent)] == before
    # the same branch with a message that fits is whole, from its first request
    branch[-1] = {"role": "user", "content": "a shorter way to go"}
    r = turn(service, "nm-branch", branch, **{"X-Kioku-Parent": "nm-parent"})
    assert r.status_code == 200, r.text
    key = service.store.find_conversation("acme", "nm-branch").id
    assert [e.text for e in service.store.entries(key)][:5] == [*before[:4], "a shorter way to go"]
    assert [e["event"] for e in service.store.log_entries(key)].count("branch") == 1
    # a plain new conversation refused for its first message leaves nothing either
    r = turn(service, "nm-plain", [huge])
    assert r.status_code == 400 and service.svc.conversation_key("acme", "nm-plain") is None


def test_a_rename_waits_for_the_turn_in_flight_at_most_its_own_while(
    service: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that gives up on a rename (the extension, after 20 s) must not find it done
    later: a rename that waited `RENAME_WAIT_S` for a turn is 409, and nothing is renamed."""
    stateful(service, "nm-busy", "first words")
    monkeypatch.setattr(client_api, "RENAME_WAIT_S", 0.2)
    service.up.delay_s = 1.5
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(stateful, service, "nm-busy", "a slow one")
        deadline = time.monotonic() + 10
        while not any(b["messages"][-1]["content"] == "a slow one" for b in service.up.chats()):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with service.http() as h:
            r = h.post("/v1/conversations/nm-busy/rename", json={"id": "nm-busy-2"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "turn_in_progress"
        slow.result()
    assert [e.text for e in service.store.entries("nm-busy")][-1] == "(reply to: a slow one)"
    assert service.svc.conversation_key("acme", "nm-busy-2") is None
