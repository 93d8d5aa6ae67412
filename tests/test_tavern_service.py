"""SillyTavern's chat kinds through the service, as its requests and its extension's REST calls
look (issue 22), without a browser: group chats, branches and checkpoints, renames, edits and
deletes beyond what a request resends, the card's changing parts and in-chat injections where
SillyTavern put them, example speakers, Test Message and the forgotten header.
`tests/test_sillytavern.py` drives the same through the real SillyTavern."""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import quote

import httpx

from kioku.alternation import alternate
from kioku.memory import coverage_gaps
from kioku.revisions import versions
from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service

MAIN = "Write Seraphina's next reply in a fictional chat between Seraphina and Alex."
DESCRIPTION = "Seraphina is a guardian of the forest glade, gentle and watchful."
MARKER = "[Start a new Chat]"
GREETING = "*Seraphina smiles.* Welcome to the glade, traveller."


def enc(value: str) -> str:
    return "utf-8''" + quote(value, safe="")


def headers(cid: str, generation: str = "normal", **more: str) -> dict[str, str]:
    h = {
        "X-Kioku-Conversation": enc(cid),
        "X-Kioku-Character": "Seraphina",
        "X-Kioku-User": "Alex",
        "X-Kioku-Generation": generation,
    }
    return {**h, **more}


def post(service: Harness, messages: list[dict[str, Any]], h: dict[str, str]) -> httpx.Response:
    with service.http() as client:
        r = client.post("/v1/chat/completions", headers=h, json={"messages": messages})
    service.idle()
    return r


def card(*middle: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": MAIN},
        *middle,
        {"role": "system", "content": DESCRIPTION},
        {"role": "system", "content": MARKER},
    ]


def chat_of(service: Harness, cid: str, turns: int, **h: str) -> list[dict[str, Any]]:
    """A SillyTavern chat of `turns` exchanges after the greeting; returns the transcript."""
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    for i in range(turns):
        chat.append({"role": "user", "content": support.words(i)})
        r = post(service, [*card(), *chat], headers(cid, **h))
        assert r.status_code == 200, r.text
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return chat


def visible(service: Harness, cid: str) -> list[tuple[str, str, str]]:
    key = service.store.find_conversation("acme", cid).id
    return [
        (e.role, e.message.author, e.text)
        for e in service.store.entries(key)
        if not e.message.is_empty()
    ]


def folded(service: Harness, cid: str, chat: list[dict[str, Any]], more: int) -> None:
    """Go on until memory has folded (jobs run between turns)."""
    for i in range(more):
        chat.append({"role": "user", "content": support.words(100 + i)})
        r = post(service, [*card(), *chat], headers(cid))
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        service.run_jobs()
    key = service.store.find_conversation("acme", cid).id
    assert service.store.conversation(key).raw_start > 0, "the test needs memory"


# generation types, names, Test Message ------------------------------------------------------


def test_a_branch_name_and_group_chat_turns_get_replies(service: Harness) -> None:
    name = "Branch #60 - 2026-12-01@18h34m47s"
    chat_of(service, name, 2, **{"X-Kioku-Generation": "group_chat"})
    assert [r for r, _, _ in visible(service, name)] == ["assistant", *["user", "assistant"] * 2]
    with service.http() as client:
        r = client.get(f"/v1/conversations/{quote(name, safe='')}/status")
    assert r.status_code == 200 and r.json()["messages"] == 5


def test_test_message_is_answered_without_memory(service: Harness) -> None:
    chat = chat_of(service, "tv-test", 3)
    before = visible(service, "tv-test")
    r = post(service, [{"role": "user", "content": "Hi"}], headers("tv-test", "quiet"))
    assert r.status_code == 200 and r.headers["X-Kioku-Stored"] == "false"
    assert service.up.chats()[-1]["messages"] == [{"role": "user", "content": "Hi"}]
    assert visible(service, "tv-test") == before and len(chat) == 7


def test_a_named_chat_that_shares_only_the_greeting_is_refused(service: Harness) -> None:
    chat_of(service, "tv-forgot", 3)
    before = visible(service, "tv-forgot")
    other = [{"role": "assistant", "content": GREETING}]
    other += [{"role": "user" if k % 2 == 0 else "assistant", "content": f"another chat {k}"}
              for k in range(7)]  # fmt: skip
    r = post(service, [*card(), *other], headers("tv-forgot"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "transcript_conflict"
    assert "shares only the opening greeting" in r.json()["error"]["message"]
    assert visible(service, "tv-forgot") == before
    # the user's own edit of the last exchange, then a new message, is still an edit
    edited = [
        {"role": "assistant", "content": GREETING},
        *[{"role": m["role"], "content": m["content"]} for m in _chat(before[1:])],
    ]
    edited[-1]["content"] += " (edited)"
    edited.append({"role": "user", "content": "and then?"})
    assert post(service, [*card(), *edited], headers("tv-forgot")).status_code == 200


def _chat(rows: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [{"role": r, "content": t} for r, _, t in rows]


# the card's parts, where SillyTavern put them ----------------------------------------------------


def test_world_info_goes_after_the_chat_and_is_not_a_card_change(service: Harness) -> None:
    """A keyword-triggered lorebook entry changes from turn to turn: kioku keeps it out of the
    card (the prefix-cache base) and sends it after the chat, so each prompt the upstream gets
    starts with the whole previous one but for that entry and the user's new message."""
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    for i in range(4):
        chat.append({"role": "user", "content": support.words(i)})
        wi = {"role": "system", "content": f"[Eldoria lore entry {i % 2}: the forest of {i}]"}
        h = headers("tv-wi", **{"X-Kioku-Volatile": "1"})
        r = post(service, [*card(wi), *chat], h)
        assert r.status_code == 200, r.text
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    sent = [c["messages"] for c in service.up.chats()[-4:]]
    key = service.store.find_conversation("acme", "tv-wi").id
    assert service.store.conversation(key).system_prompt == f"{MAIN}\n\n{DESCRIPTION}\n\n{MARKER}"
    assert not service.store.counters(key).get("card_changes")
    for k, body in enumerate(sent):
        assert "lore entry" not in body[0]["content"]  # not in the system prompt
        assert body[-1]["role"] == "user" and f"the forest of {k}" in body[-1]["content"]
        assert body[-1]["content"].startswith(support.words(k))  # after the user's message
    for a, b in itertools.pairwise(sent):
        # the previous prompt, up to its last message, is a prefix of the next one
        assert b[: len(a) - 1] == a[:-1]


def test_an_in_chat_injection_stays_at_its_depth(service: Harness) -> None:
    """SillyTavern's Author's Note "in-chat @ depth 4" sits four messages from the end; kioku
    keeps it there (it used to move it in front of the last user message), on a continue too."""
    chat = chat_of(service, "tv-depth", 4)
    note = {"role": "system", "content": "[Author's note: it is raining.]"}
    chat.append({"role": "user", "content": "What now?"})
    body = [*card(), *chat[:-4], note, *chat[-4:]]
    assert post(service, body, headers("tv-depth")).status_code == 200
    sent = service.up.chats()[-1]["messages"]
    at = next(k for k, m in enumerate(sent) if "it is raining" in str(m["content"]))
    assert [m["content"] for m in sent[at + 1 :]] == [m["content"] for m in chat[-4:]]
    # a continue: the reply being continued stays last, the note four messages up
    reply = service.store.entries(service.store.find_conversation("acme", "tv-depth").id)[-1]
    chat.append({"role": "assistant", "content": reply.text})
    nudge = {"role": "system", "content": "[Continue the following message.]"}
    body = [*card(), *chat[:-4], note, *chat[-4:], nudge]
    assert post(service, body, headers("tv-depth", "continue")).status_code == 200
    sent = alternate(service.up.chats()[-1]["messages"])
    assert sent[-2] == {"role": "assistant", "content": reply.text}  # the reply continued
    assert sent[-1]["content"] == "[Continue the following message.]"  # SillyTavern's nudge
    at = next(k for k, m in enumerate(sent) if "it is raining" in str(m["content"]))
    assert len([m for m in sent[at:] if m["role"] == "assistant"]) == 2


def test_example_dialogue_keeps_its_speakers_and_is_pinned_while_pushed_out(
    service: Harness,
) -> None:
    examples = [
        {"role": "system", "content": "[Example Chat]"},
        {"role": "system", "content": "Who are you?", "name": "example_user"},
        {"role": "system", "content": "*bows* The glade's keeper.", "name": "example_assistant"},
        {"role": "system", "content": "[Example Chat]"},
        {"role": "system", "content": "Is it safe?", "name": "example_user"},
        {"role": "system", "content": "Here, always.", "name": "example_assistant"},
    ]
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    # SillyTavern pushes them out as the chat grows, dialogue by dialogue: a line that no longer
    # fits is dropped, and a later dialogue's first line may still fit
    for i, shown in enumerate([range(6), range(6), [0, 1, 3, 4], [0, 1], []]):
        chat.append({"role": "user", "content": support.words(i)})
        h = headers("tv-examples", **{"X-Kioku-Examples": "gradual"})
        sent = [examples[k] for k in shown]
        r = post(service, [{"role": "system", "content": MAIN}, *sent,
                           {"role": "system", "content": MARKER}, *chat], h)  # fmt: skip
        chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    system = service.up.chats()[-1]["messages"][0]["content"]
    assert "Alex: Who are you?" in system and "Seraphina: *bows* The glade's keeper." in system
    assert "Alex: Is it safe?" in system  # still there: pushed out by SillyTavern's context only
    key = service.store.find_conversation("acme", "tv-examples").id
    assert not service.store.counters(key).get("card_changes")
    # the user's own card edit is a card change
    chat.append({"role": "user", "content": "next"})
    h = headers("tv-examples", **{"X-Kioku-Examples": "gradual"})
    post(service, [{"role": "system", "content": MAIN + " Be brief."},
                   {"role": "system", "content": MARKER}, *chat], h)  # fmt: skip
    assert service.store.counters(key)["card_changes"] == 1


def test_the_clients_own_parts_are_counted_in_the_prompt(service: Harness) -> None:
    chat = chat_of(service, "tv-count", 2)
    chat.append({"role": "user", "content": "and the lore?"})
    lore = {"role": "system", "content": support.words(7, 200)}
    r = post(service, [*card(lore), *chat], headers("tv-count", **{"X-Kioku-Volatile": "1"}))
    with_lore = int(r.headers["X-Kioku-Prompt-Tokens"])
    r = post(service, [*card(), *chat], headers("tv-count", "swipe"))
    assert with_lore - int(r.headers["X-Kioku-Prompt-Tokens"]) > 150


# group chats ---------------------------------------------------------------------------------


def test_a_group_chat_keeps_who_said_what(service: Harness) -> None:
    members = json.dumps(["Seraphina", "Mika"])
    chat: list[dict[str, Any]] = [
        {"role": "assistant", "content": f"Seraphina: {GREETING}"},
        {"role": "assistant", "content": "Mika: *waves from the tree.* Hi!"},
    ]
    for i, speaker in enumerate(["Mika", "Seraphina", "Mika"]):
        chat.append({"role": "user", "content": support.words(i)})
        h = headers("tv-group", "group_chat", **{"X-Kioku-Speakers": enc(members)})
        h["X-Kioku-Character"] = speaker
        nudge = {"role": "system", "content": f"[Write the next reply only as {speaker}.]"}
        r = post(service, [*card(), *chat, nudge], h)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
        chat.append({"role": "assistant", "content": f"{speaker}: {text}"})  # as ST sends it
    rows = visible(service, "tv-group")
    authors = [a for r, a, _ in rows if r == "assistant"]
    assert authors == ["Seraphina", "Mika", "Mika", "Seraphina", "Mika"]
    assert all(t.startswith(f"{a}: ") for r, a, t in rows if r == "assistant")
    assert {a for r, a, _ in rows if r == "user"} == {"Alex"}
    from kioku.generations import chapter_task

    key = service.store.find_conversation("acme", "tv-group").id
    task = chapter_task(service.store.entries(key), support.SERVICE_PROFILE, character="Mika")
    assert task.character == "Seraphina and Mika" and task.user_name == "Alex"


# branches and checkpoints -------------------------------------------------------------------


def test_a_branch_starts_with_its_parents_memory_up_to_the_branch_point(service: Harness) -> None:
    parent = "tv-parent"
    chat = chat_of(service, parent, 2)
    folded(service, parent, chat, 14)
    pkey = service.store.find_conversation("acme", parent).id
    pinfo = service.store.conversation(pkey)
    shared = [i for i in service.store.items(pkey, "active")]
    # SillyTavern's branch of message N holds messages 0..N; its first request adds one
    n = len(chat) - 4
    branch = [*chat[: n + 1], {"role": "user", "content": "In the branch, I take the other path."}]
    name = f"Branch #{n} - 2026-12-01@18h34m47s"
    jobs_before = len(service.store.jobs(pkey))
    r = post(service, [*card(), *branch], headers(name, **{"X-Kioku-Parent": enc(parent)}))
    assert r.status_code == 200, r.text
    key = service.store.find_conversation("acme", name).id
    info = service.store.conversation(key)
    items = service.store.items(key, "active")
    assert info.raw_start == pinfo.raw_start > 0 and info.memory_version >= 1
    # shared as written (same texts, ranges, sources), not summarized again
    assert [(i.first_seq, i.last_seq, i.text, i.source) for i in items] == [
        (i.first_seq, i.last_seq, i.text, i.source) for i in shared
    ]
    assert not service.store.jobs(key, "queued", "running", "done")
    assert coverage_gaps(items, info.raw_start) == []
    rows = visible(service, name)
    assert [t for _, _, t in rows] == [m["content"] for m in branch[:-1]] + [
        branch[-1]["content"],
        r.json()["choices"][0]["message"]["content"],
    ]
    # the memory exchange is the parent's: its prompt starts as the parent's did
    sent = service.up.chats()[-1]["messages"]
    assert sent[1] == service.up.chats()[-2]["messages"][1]
    # the parent is untouched
    assert service.store.conversation(pkey).next_seq == pinfo.next_seq
    assert len(service.store.jobs(pkey)) == jobs_before
    [logged] = [e for e in service.store.log_entries(key) if e["event"] == "branch"]
    assert f"branched from {parent!r} at #{n + 1}" in logged["detail"]
    # later turns of the branch are its own
    branch.append({"role": "assistant", "content": rows[-1][2]})
    branch.append({"role": "user", "content": "Further down the other path."})
    r = post(service, [*card(), *branch], headers(name, **{"X-Kioku-Parent": enc(parent)}))
    assert service.store.conversation(key).next_seq == n + 5


def test_a_branch_before_the_raw_window_shares_what_lies_below_it() -> None:
    """Branched inside what a synopsis covers: the synopsis reaches past the branch point, so
    the chapters it folded stand in for it as far as they stay below; the rest is raw again."""
    from kioku.branches import inherited
    from kioku.memory import MemoryItem

    def item(id_: int, kind: str, lo: int, hi: int, status: str, replaces=()) -> MemoryItem:
        return MemoryItem(kind, lo, hi, f"{kind} {lo}-{hi}", 10, id=id_, status=status,  # type: ignore[arg-type]
                          replaces=tuple(replaces))  # fmt: skip

    items = [
        item(1, "chapter", 0, 9, "retired"),
        item(2, "chapter", 10, 19, "retired"),
        item(3, "chapter", 20, 29, "retired"),
        item(4, "synopsis", 0, 29, "active", (1, 2, 3)),
        item(5, "chapter", 30, 39, "active"),
        item(6, "chapter", 40, 49, "ready"),
    ]
    inh = inherited(items, 25)
    assert [(i.first_seq, i.last_seq) for i in inh.active] == [(0, 9), (10, 19)]
    assert inh.raw_start == 20 and inh.ready == ()
    inh = inherited(items, 45)
    assert [i.id for i in inh.active] == [4, 5] and inh.raw_start == 40
    inh = inherited(items, 60)
    assert [i.id for i in inh.ready] == [6]
    assert inherited(items, 5).raw_start == 0


# renames, and edits and deletes beyond the request ------------------------------------------------


def test_a_renamed_chat_keeps_its_conversation(service: Harness) -> None:
    chat = chat_of(service, "tv-old-name", 3)
    key = service.store.find_conversation("acme", "tv-old-name").id
    chat_of(service, "tv-taken", 1)
    with service.http() as client:
        r = client.post("/v1/conversations/tv-old-name/rename", json={"id": "tv-taken"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"
        r = client.post("/v1/conversations/tv-old-name/rename", json={"id": "Trip #2 - ok?"})
        assert r.status_code == 200 and r.json() == {
            "id": "Trip #2 - ok?",
            "previous": "tv-old-name",
        }
        assert client.get("/v1/conversations/tv-old-name/status").status_code == 404
    chat.append({"role": "user", "content": "After the rename."})
    assert post(service, [*card(), *chat], headers("Trip #2 - ok?")).status_code == 200
    assert service.store.find_conversation("acme", "Trip #2 - ok?").id == key
    assert service.store.conversation(key).next_seq == 9  # went on, not a new conversation
    assert not service.store.counters(key).get("edits")


def test_an_edit_and_a_delete_older_than_the_request_reach_kioku(service: Harness) -> None:
    cid = "tv-sync"
    chat = chat_of(service, cid, 2)
    folded(service, cid, chat, 16)
    key = service.store.find_conversation("acme", cid).id
    memory = service.store.items(key, "active")
    target = next(i for i in memory if i.kind == "chapter")
    seq = target.first_seq + 1
    old = chat[seq]["content"]
    whole = [dict(m) for m in chat]
    whole[seq]["content"] = "I never had a lantern; I carried a torch."
    gone = chat[seq + 2]["content"]
    del whole[seq + 2]
    with service.http() as client:
        r = client.post(f"/v1/conversations/{cid}/sync", json={"messages": whole})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["edited"] == [seq] and out["deleted"] == [seq + 2] and out["appended"] == []
    assert target.id in out["stale"]
    assert [v["text"] for v in versions(service.store, key, seq)] == [old]
    assert [v["text"] for v in versions(service.store, key, seq + 2)] == [gone]
    # a request that resends only the last messages still sees the corrected log
    whole.append({"role": "user", "content": "What did I carry?"})
    r = post(service, [*card(), *whole[-4:]], headers(cid))
    assert r.status_code == 200
    prompt = "\n".join(str(m["content"]) for m in service.up.chats()[-1]["messages"])
    assert "I carried a torch" in prompt and gone not in prompt
    # the same sync again changes nothing
    with service.http() as client:
        whole.append({"role": "assistant", "content": service.store.entries(key)[-1].text})
        again = client.post(f"/v1/conversations/{cid}/sync", json={"messages": whole}).json()
    assert again == {"edited": [], "deleted": [], "appended": [], "stale": []}


def test_the_panels_calls(service: Harness) -> None:
    cid = "tv-panel"
    chat = chat_of(service, cid, 2)
    folded(service, cid, chat, 16)
    key = service.store.find_conversation("acme", cid).id
    with service.http() as client:
        whole = [m for k, m in enumerate(chat) if k != 3]
        client.post(f"/v1/conversations/{cid}/sync", json={"messages": whole})
        status = client.get(f"/v1/conversations/{cid}/status").json()
        info = service.store.conversation(key)
        assert status["profile"] == "service-test" and status["window"] == 4096
        assert status["shown"] == info.next_seq - 1  # one deleted
        assert status["raw_start_position"] == info.raw_start - 1
        pos = client.get(f"/v1/conversations/{cid}/positions", params={"seq": [2, 3, 5]}).json()
        assert pos == {"positions": {"2": 2, "3": 3, "5": 4}}
        # summarize now: a chapter of what lies beyond the minimum raw window
        written = [i for i in service.store.items(key, "ready") if i.kind == "chapter"]
        start = max([info.raw_start, *(i.last_seq + 1 for i in written)])
        r = client.post(f"/v1/conversations/{cid}/summarize").json()
        assert r["scheduled"] and r["scheduled"][0][0] == start  # after what is written
        assert r["scheduled"][-1][1] < info.next_seq - 1  # the minimum raw window stays
        service.run_jobs()
        ready = [i.first_seq for i in service.store.items(key, "ready") if i.kind == "chapter"]
        assert start in ready
        # re-summarize a chapter: it is rewritten from its messages
        chapter = next(i for i in service.store.items(key, "active") if i.kind == "chapter")
        r = client.post(f"/v1/conversations/{cid}/memory/{chapter.id}/resummarize")
        assert r.status_code == 200 and r.json()["stale"] == [chapter.id]
        assert [j.kind for j in service.store.jobs(key, "queued")] == ["revision"]
        synopsis = next(
            (i for i in service.store.items(key, "active") if i.kind == "synopsis"), None
        )
        if synopsis is not None:
            r = client.post(f"/v1/conversations/{cid}/memory/{synopsis.id}/resummarize")
            assert r.status_code == 400


def test_a_whole_chat_sync_keeps_the_images_it_does_not_carry(service: Harness) -> None:
    """The extension sends each message's text; a message that came with an image keeps it."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
    chat.append({"role": "user", "content": [{"type": "text", "text": "Look at this."}, image]})
    r = post(service, [*card(), *chat], headers("tv-image"))
    chat.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    whole = [chat[0], {"role": "user", "content": "Look at this."}, {**chat[2]}]
    whole[0] = {"role": "assistant", "content": GREETING + " (edited)"}
    with service.http() as client:
        out = client.post("/v1/conversations/tv-image/sync", json={"messages": whole}).json()
    assert out["edited"] == [0]
    key = service.store.find_conversation("acme", "tv-image").id
    [looked] = service.store.entries(key, 1, 1)
    assert [p.kind for p in looked.message.parts] == ["text", "image"]


def test_the_ablation_keeps_the_card_as_sent(tmp_path: Any) -> None:
    """`kioku serve --card-as-sent`: the marked parts stay in the card, each change counted."""
    with support.running(f"sqlite:///{tmp_path / 'k.db'}", card_as_sent=True) as h:
        chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]
        for i in range(2):
            chat.append({"role": "user", "content": support.words(i)})
            wi = {"role": "system", "content": f"[lore entry {i}]"}
            r = post(h, [*card(wi), *chat], headers("tv-as-sent", **{"X-Kioku-Volatile": "1"}))
            chat.append(
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
            )
        assert "[lore entry 1]" in h.up.chats()[-1]["messages"][0]["content"]
        assert h.store.counters("tv-as-sent")["card_changes"] == 1
