"""Generation types through the proxy, as the SillyTavern extension names them: quiet and
impersonate store nothing, continue extends the last reply, swipe replaces it; Test Message
without the extension; card changes counted; the user's name; roles alternate upstream."""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import quote

import httpx

from kioku.alternation import OPENING
from kioku.importer import import_transcript
from kioku.revisions import versions
from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service

CARD = "You are Seraphina, a guardian of the forest glade."
GREETING = "*Seraphina smiles.* Welcome to the glade, traveller."


def headers(cid: str, generation: str | None = None, **more: str) -> dict[str, str]:
    h = {"X-Kioku-Conversation": cid, "X-Kioku-Character": "Seraphina"}
    if generation:
        h["X-Kioku-Generation"] = generation
    return {**h, **more}


def post(
    service: Harness, messages: list[dict[str, Any]], h: dict[str, str], **body: Any
) -> httpx.Response:
    with service.http() as client:
        r = client.post("/v1/chat/completions", headers=h, json={"messages": messages, **body})
    service.idle()
    return r


def tavern(cid: str, service: Harness, turns: int, generation: str | None = "normal") -> list[Any]:
    """A stateless client's chat: the greeting, then `turns` exchanges; returns the transcript."""
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    for i in range(turns):
        chat.append({"role": "user", "content": support.words(i)})
        r = post(service, [{"role": "system", "content": CARD}, *chat], headers(cid, generation))
        assert r.status_code == 200, r.text
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return chat


def stored(service: Harness, cid: str) -> list[tuple[str, str]]:
    return [(e.role, e.text) for e in service.store.entries(cid) if not e.message.is_empty()]


def test_quiet_answers_with_memory_and_stores_nothing(service: Harness) -> None:
    counter = itertools.count()
    service.up.reply = lambda body: f"answer {next(counter)}: " + support.words(900, 40)
    chat = tavern("gen-quiet", service, 12)
    service.run_jobs()
    chat.append({"role": "user", "content": "and now?"})
    post(service, [{"role": "system", "content": CARD}, *chat], headers("gen-quiet", "normal"))
    chat.append({"role": "assistant", "content": service.store.entries("gen-quiet")[-1].text})
    assert service.store.conversation("gen-quiet").raw_start > 0, "memory is needed here"
    before = stored(service, "gen-quiet")
    counters = service.store.counters("gen-quiet")
    quiet = [{"role": "system", "content": CARD}, *chat,
             {"role": "system", "content": "[Summarize the chat so far in one line.]"}]  # fmt: skip
    r = post(service, quiet, headers("gen-quiet", "quiet"))
    assert r.status_code == 200 and r.headers["X-Kioku-Stored"] == "false"
    assert stored(service, "gen-quiet") == before
    assert service.store.counters("gen-quiet") == counters
    sent = service.up.chats()[-1]["messages"]
    assert sent[0]["content"] == CARD
    assert "[Summarize the chat so far in one line.]" in sent[-1]["content"]
    # the memory the last turn had (the same memory exchange), the raw window, then the request
    assert sent[1:3] == service.up.chats()[-2]["messages"][1:3]
    assert sent[-2] == {"role": "assistant", "content": chat[-1]["content"]}


def test_impersonate_is_never_stored_as_the_characters_reply(service: Harness) -> None:
    chat = tavern("gen-imp", service, 2)
    before = stored(service, "gen-imp")
    service.up.reply = lambda body: "I lean on my staff and ask about the glade."
    imp = [{"role": "system", "content": CARD}, *chat,
           {"role": "system", "content": "[Write your next reply from the point of view of the user.]"}]  # fmt: skip
    r = post(service, imp, headers("gen-imp", "impersonate"))
    assert r.status_code == 200
    assert stored(service, "gen-imp") == before
    # the user sends the impersonated text as their own message: stored once, as the user's
    service.up.reply = support.default_reply
    chat.append({"role": "user", "content": "I lean on my staff and ask about the glade."})
    r = post(service, [{"role": "system", "content": CARD}, *chat], headers("gen-imp", "normal"))
    assert stored(service, "gen-imp")[-2] == ("user", chat[-1]["content"])
    assert not service.store.counters("gen-imp").get("edits")


def test_continue_extends_the_last_reply(service: Harness) -> None:
    chat = tavern("gen-cont", service, 3)
    n = service.store.conversation("gen-cont").next_seq
    last = chat[-1]["content"]
    service.up.reply = lambda body: "and then she laughed."
    nudge = {"role": "system", "content": f"[Continue your last message: {last}]"}
    r = post(
        service,
        [{"role": "system", "content": CARD}, *chat, nudge],
        headers("gen-cont", "continue"),
    )
    assert r.status_code == 200 and r.headers["X-Kioku-Continued"] == str(n - 1)
    rows = service.store.entries("gen-cont")
    assert len(rows) == n and rows[-1].text == f"{last} and then she laughed."
    assert [v["change"] for v in versions(service.store, "gen-cont", n - 1)] == ["continue"]
    # what the upstream saw: the reply to continue, then the nudge, as the user's turn
    sent = service.up.chats()[-1]["messages"]
    assert sent[-2] == {"role": "assistant", "content": last}
    assert sent[-1]["role"] == "user" and sent[-1]["content"] == nudge["content"]
    # SillyTavern shows the joined text (with its own whitespace): not an edit
    service.up.reply = support.default_reply
    chat[-1]["content"] = f"{last}  and then she laughed."
    chat.append({"role": "user", "content": "What is so funny?"})
    post(service, [{"role": "system", "content": CARD}, *chat], headers("gen-cont", "normal"))
    assert not service.store.counters("gen-cont").get("edits")
    assert len(service.store.entries("gen-cont")) == n + 2


def test_swipe_replaces_the_last_reply(service: Harness) -> None:
    chat = tavern("gen-swipe", service, 3)
    n = service.store.conversation("gen-swipe").next_seq
    service.up.reply = lambda body: "Another version."
    r = post(
        service, [{"role": "system", "content": CARD}, *chat[:-1]], headers("gen-swipe", "swipe")
    )
    assert r.headers["X-Kioku-Regenerated"] == str(n - 1)
    assert service.store.entries("gen-swipe")[-1].text == "Another version."
    assert service.store.conversation("gen-swipe").next_seq == n


def test_test_message_on_a_long_conversation_is_not_stored(service: Harness) -> None:
    """SillyTavern's Test Message sends [user "Hi"] under the chat's header: without the
    extension it is a side request of a client that sends transcripts."""
    tavern("gen-test", service, 3, generation=None)
    before = stored(service, "gen-test")
    r = post(service, [{"role": "user", "content": "Hi"}], headers("gen-test"))
    assert r.status_code == 200 and r.headers["X-Kioku-Stored"] == "false"
    assert stored(service, "gen-test") == before
    assert service.up.chats()[-1]["messages"][-1] == {"role": "user", "content": "Hi"}
    # a stateful client's one-message turns are stored as before
    r = post(service, [{"role": "user", "content": "Hi"}], headers("gen-stateful"))
    r = post(service, [{"role": "user", "content": "Hi again"}], headers("gen-stateful"))
    assert [t for _, t in stored(service, "gen-stateful")][::2] == ["Hi", "Hi again"]


def test_a_quiet_request_without_a_conversation_passes_through(service: Harness) -> None:
    r = post(service, [{"role": "user", "content": "Hi"}], {"X-Kioku-Generation": "quiet"})
    assert r.status_code == 200
    assert service.up.chats()[-1]["messages"] == [{"role": "user", "content": "Hi"}]
    # a quiet request under an id nobody used creates nothing
    r = post(service, [{"role": "user", "content": "Hi"}], headers("gen-none", "quiet"))
    assert r.status_code == 200
    with service.http() as client:
        assert client.get("/v1/conversations/gen-none/status").status_code == 404


def test_group_chat_and_unknown_generation_types_are_turns(service: Harness) -> None:
    """SillyTavern names a group member's turn `group_chat`, and may add types: each is a turn
    (the reply stored); only a value that is not one word is refused."""
    chat = tavern("gen-group", service, 1, generation="group_chat")
    assert [r for r, _ in stored(service, "gen-group")] == ["assistant", "user", "assistant"]
    chat.append({"role": "user", "content": "an extension's own kind of turn"})
    r = post(service, [{"role": "system", "content": CARD}, *chat], headers("gen-group", "ask_v2"))
    assert r.status_code == 200 and "X-Kioku-Stored" not in r.headers
    assert stored(service, "gen-group")[-1][1] == r.json()["choices"][0]["message"]["content"]
    r = post(service, [{"role": "user", "content": "Hi"}], headers("gen-bad", "side ways!"))
    assert r.status_code == 400 and "X-Kioku-Generation" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "X-Kioku-Generation"


def test_a_chat_reopened_without_switching_the_header_is_a_clear_409(service: Harness) -> None:
    chat2 = tavern("gen-switch", service, 2, generation=None)
    before = stored(service, "gen-switch")
    chat3 = [chat2[0], {"role": "user", "content": "a different first line"}]
    r = post(service, [{"role": "system", "content": CARD}, *chat3], headers("gen-switch"))
    assert r.status_code == 409
    message = r.json()["error"]["message"]
    assert "install the kioku extension" in message and "X-Kioku-Conversation" in message
    assert stored(service, "gen-switch") == before


def test_card_changes_are_counted_and_shown(service: Harness) -> None:
    chat = tavern("gen-card", service, 2)
    chat.append({"role": "user", "content": "one more"})
    examples = CARD + "\n\n[Example Chat]\n<START>\nSeraphina: *waves*"
    post(service, [{"role": "system", "content": examples}, *chat], headers("gen-card", "normal"))
    assert service.store.counters("gen-card")["card_changes"] == 1
    [logged] = [e for e in service.store.log_entries("gen-card") if e["event"] == "card"]
    assert f"first difference at char {len(CARD)}" in logged["detail"]
    with service.http() as client:
        status = client.get("/v1/conversations/gen-card/status").json()
        metrics = client.get("/metrics").text
    assert status["card_changes"] == 1 and status["messages"] == 7
    assert any(line.startswith("kioku_card_changes_total{") and not line.endswith(" 0")
               for line in metrics.splitlines())  # fmt: skip
    assert 'conversation="gen-card"} 1' in metrics


def test_user_name_from_the_extension_and_non_ascii_headers(service: Harness) -> None:
    cid = "セラフィナとの旅"
    h = {
        "X-Kioku-Conversation": "utf-8''" + quote(cid),
        "X-Kioku-Character": "utf-8''" + quote("セラフィナ"),
        "X-Kioku-User": "utf-8''" + quote("アレックス"),
        "X-Kioku-Generation": "normal",
    }
    chat = [{"role": "assistant", "content": "ようこそ"}, {"role": "user", "content": "こんにちは"}]
    r = post(service, [{"role": "system", "content": CARD}, *chat], h)
    assert r.status_code == 200
    rows = service.store.entries(cid)
    assert [e.message.author for e in rows] == ["セラフィナ", "アレックス", "セラフィナ"]
    # a later request without the user header keeps the conversation's name for the user
    chat += [{"role": "assistant", "content": rows[-1].text}, {"role": "user", "content": "またね"}]
    without_user = {k: v for k, v in h.items() if k != "X-Kioku-User"}
    post(service, [{"role": "system", "content": CARD}, *chat], without_user)
    assert service.store.entries(cid)[3].message.author == "アレックス"


def test_roles_alternate_upstream_after_folds_and_failures(service: Harness) -> None:
    counter = itertools.count()
    service.up.reply = lambda body: f"answer {next(counter)}: " + support.words(900, 40)
    chat = tavern("gen-alt", service, 10)
    service.run_jobs()
    # a failed turn leaves the user's message stored without a reply
    service.up.fail = lambda body: 500
    chat.append({"role": "user", "content": "first try"})
    assert (
        post(
            service, [{"role": "system", "content": CARD}, *chat], headers("gen-alt", "normal")
        ).status_code
        == 502
    )
    service.up.fail = None
    chat.append({"role": "user", "content": "second try"})
    post(service, [{"role": "system", "content": CARD}, *chat], headers("gen-alt", "normal"))
    for body in service.up.chats():
        sent = body["messages"]
        if sent and sent[0]["content"] != CARD:
            continue
        body_roles = [m["role"] for m in sent[1:]]
        assert body_roles == ["user", "assistant"] * (len(body_roles) // 2) + ["user"] * (
            len(body_roles) % 2
        )
    first = service.up.chats()[0]["messages"]
    assert first[1] == {"role": "user", "content": OPENING}
    last = service.up.chats()[-1]["messages"][-1]["content"]
    assert last.startswith("first try\n\n") and last.endswith("second try")


def test_an_imported_chat_continues_with_the_same_user_name(
    service: Harness, tmp_path: Any
) -> None:
    """Import (names from the file) and proxy (no name from a header-less client) store the
    user the same way."""
    path = tmp_path / "imported.jsonl"
    lines = [{"user_name": "Alex", "character_name": "Seraphina"},
             {"name": "Seraphina", "is_user": False, "mes": GREETING},
             {"name": "Alex", "is_user": True, "mes": "hello"},
             {"name": "Seraphina", "is_user": False, "mes": "hi Alex"}]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    import_transcript(service.svc.kioku("acme"), path, "sillytavern", progress=False)
    chat = [{"role": "assistant", "content": GREETING}, {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi Alex"}, {"role": "user", "content": "again"}]  # fmt: skip
    r = post(service, [{"role": "system", "content": CARD}, *chat], headers("imported"))
    assert r.status_code == 200
    authors = [e.message.author for e in service.store.entries("imported")]
    assert authors == ["Seraphina", "Alex", "Seraphina", "Alex", "Seraphina"]
