"""The console's routes against the real service: archive search, the transcript with times,
pending jobs, conversations by last activity, and an operator's correction of a memory line —
stored append-only, shown as pending, in the prompt from the next fold on, and kept when a
client's edit has the item re-summarized."""

from __future__ import annotations

import time
from typing import Any

from kioku.corrections import apply_edits, carry, edits_of
from kioku.memory import MemoryItem
from tests import test_service_support as support
from tests.test_service_support import Harness, words

harness, service = support.harness, support.service


def chat(service: Harness, cid: str, text: str) -> Any:
    with service.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": cid},
            json={"messages": [{"role": "user", "content": text}]},
        )
    assert r.status_code == 200, r.text
    service.idle()
    return r


def grow(service: Harness, cid: str, n: int, first: str = "") -> None:
    for i in range(n):
        chat(service, cid, first if i == 0 and first else words(i))
        service.run_jobs()


def test_search_transcript_and_jobs(service: Harness) -> None:
    grow(service, "browse-1", 12, first="My sister Hana lives in Sapporo by the snow festival.")
    with service.http() as h:
        r = h.get("/v1/conversations/browse-1/search", params={"q": "Where does Hana live"})
        assert r.status_code == 200, r.text
        (top, *_) = r.json()["hits"]
        assert top["seq"] == 0 and "Sapporo" in top["text"] and top["stored_at"] > 0

        r = h.get("/v1/conversations/browse-1/transcript", params={"limit": 5})
        page = r.json()
        assert page["total"] == 24 and [m["seq"] for m in page["data"]] == [19, 20, 21, 22, 23]
        assert all(m["stored_at"] for m in page["data"])
        # each user turn says whether it was shown the past, and why (the console shows it)
        for m in page["data"]:
            note = m["recall"]
            assert (note is None) == (m["role"] != "user"), m
            assert note is None or (isinstance(note["on"], bool) and note["why"])
        r = h.get("/v1/conversations/browse-1/transcript", params={"before": 19, "limit": 5})
        assert [m["seq"] for m in r.json()["data"]] == [14, 15, 16, 17, 18]
        r = h.get("/v1/conversations/browse-1/transcript", params={"after": -1, "limit": 3})
        assert [m["seq"] for m in r.json()["data"]] == [0, 1, 2]
        r = h.get("/v1/conversations/browse-1/transcript", params={"after": 23})
        assert r.json()["data"] == [] and r.json()["total"] == 24

        r = h.get("/v1/conversations/browse-1/jobs")
        queued = service.store.jobs("browse-1", "queued", "running")
        assert [j["id"] for j in r.json()["data"]] == [j.id for j in queued]

        r = h.get("/v1/conversations/browse-1/search", params={"q": ""})
        assert r.status_code == 400


def test_conversations_by_last_activity_and_filter(service: Harness) -> None:
    chat(service, "act-old", "hello")
    time.sleep(0.05)
    chat(service, "act-new", "hello")
    with service.http() as h:
        ids = [c["id"] for c in h.get("/v1/conversations").json()["data"]]
        assert ids.index("act-new") < ids.index("act-old")
        found = h.get("/v1/conversations", params={"q": "ACT-O"}).json()["data"]
        assert [c["id"] for c in found] == ["act-old"] and found[0]["last_activity"] > 0


def test_an_operator_corrects_a_line_at_the_next_fold(service: Harness) -> None:
    grow(service, "fix-1", 30, first="My sister Hana lives in Sapporo by the snow festival.")
    kk = service.svc.kioku("acme")
    (chapter, *_) = [i for i in service.store.items("fix-1", "active") if i.kind == "chapter"]
    with service.http() as h:
        lines = h.get("/v1/conversations/fix-1/memory/lines").json()["items"]
        item = next(i for i in lines if i["id"] == chapter.id)
        wrong, gone = item["lines"][0], item["lines"][1]
        url = f"/v1/conversations/fix-1/memory/{chapter.id}/lines"
        r = h.post(url, json={"line": wrong, "text": "[0] Ken: My sister Hana lives in Otaru."})
        assert r.status_code == 200, r.text
        r = h.post(url, json={"line": gone, "text": None})  # retract a second line
        pending = r.json()
        assert pending["lines"][0] == "[0] Ken: My sister Hana lives in Otaru."
        assert gone.strip() not in [x.strip() for x in pending["lines"]]
        assert [e["text"] for e in pending["edits"]] == [
            "[0] Ken: My sister Hana lives in Otaru.",
            None,
        ]
        # nothing changed in the prompt yet: the edit waits for the fold
        before = service.store.conversation("fix-1").memory_version
        shown = h.get("/v1/conversations/fix-1/memory/lines").json()["items"]
        now = next(i for i in shown if i["id"] == chapter.id)
        assert now["lines"] == item["lines"] and now["pending"]["id"] == pending["id"]
        assert service.store.items("fix-1", "active")[0].text == chapter.text

        # refusals: a line that is not there, a multi-line correction, an item not in memory
        assert h.post(url, json={"line": "no such line", "text": "x"}).status_code == 400
        assert h.post(url, json={"line": wrong, "text": "a\nb"}).status_code == 400
        r = h.post("/v1/conversations/fix-1/memory/999999/lines", json={"line": wrong})
        assert r.status_code == 404

    chat(service, "fix-1", "and one more turn")  # the next turn folds the correction in
    info = service.store.conversation("fix-1")
    assert info.memory_version > before
    active = {i.id: i for i in service.store.items("fix-1", "active")}
    assert chapter.id not in active  # retired, still in the table: nothing is overwritten
    assert any(i.id == chapter.id and i.status == "retired" for i in service.store.items("fix-1"))
    fixed = next(i for i in active.values() if i.span == chapter.span)
    assert fixed.text.startswith("[0] Ken: My sister Hana lives in Otaru.")
    assert gone.strip() not in fixed.text
    prompt = kk.conversation("fix-1").prepare("what do you remember?")
    memory_message = next(m.content for m in prompt.messages if "story so far" in m.content)
    assert "lives in Otaru" in memory_message and gone.strip() not in memory_message
    with service.http() as h:
        shown = h.get("/v1/conversations/fix-1/memory/lines").json()["items"]
        assert len(next(i for i in shown if i["id"] == fixed.id)["edits"]) == 2
        log = h.get("/v1/conversations/fix-1/log").json()["data"]
        assert [e["event"] for e in log].count("operator_edit") == 2


def test_the_operators_edit_outlives_a_re_summary() -> None:
    old = MemoryItem(
        id=7,
        kind="chapter",
        first_seq=0,
        last_seq=9,
        text="[1] Ken: a\n[2] Mika: b\n[3] Ken: c",
        tokens=9,
        data={"operator_edits": [{"line": "[2] Mika: b", "text": None, "at": 1.0}]},
    )
    again = MemoryItem(
        kind="chapter", first_seq=0, last_seq=9, text="[1] Ken: a2\n[2] Mika: b", tokens=6
    )
    kept = carry(old, again)
    assert kept.text == "[1] Ken: a2" and edits_of(kept) == edits_of(old)
    # an edit of a line memory once showed with its seq finds it under its message's first
    old = [{"line": "- #4 Ken: d", "text": None, "at": 1.0}]
    assert (
        apply_edits("- #4 Ken: c\n       Ken: d\n- #5 Mika: d", old) == "- #4 Ken: c\n- #5 Mika: d"
    )
    fix = [{"line": "[3] Ken: c", "text": "[3] Ken: c, corrected", "at": 2.0}]
    assert apply_edits("[1] Ken: a", fix) == "[1] Ken: a\n[3] Ken: c, corrected"
