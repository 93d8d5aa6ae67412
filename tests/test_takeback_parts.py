"""The parts of taking a message back (`kioku.takeback`), without a server: the notes ledger,
the recall index, a stale item's stand-in, a summary job that read the old text, the REST
route's edges, and the name a user message is stored under. The floors, through `kioku
serve`, are in test_takeback.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kioku.cast import as_recorded, same_name, user_author
from kioku.engine import Kioku
from kioku.errors import NotFound
from kioku.generations import chapter_task
from kioku.layers import Layers
from kioku.memory import MemoryItem
from kioku.messages import LogEntry, Message
from kioku.note import NoteDraft
from kioku.notes import add_notes, current_notes, retract_sources, update_notes
from kioku.revisions import stand_in
from kioku.service.keys import create_key
from kioku.store import Store
from kioku.summarizer import ExtractiveSummarizer, Summary, SummaryTask
from kioku.sync import Incoming, forget, sync, to_message
from kioku.tokens import ScriptEstimator
from kioku.transcript import render_transcript
from tests import test_service_support as support
from tests.test_service_support import SERVICE_PROFILE, Harness, words

harness = support.harness

TINY = replace(SERVICE_PROFILE, name="tiny", connect_timeout_s=10.0, reply_timeout_s=120.0)
SECRET = "My sister Anna lives in Kyoto."


def conversation(n: int = 24) -> tuple[Kioku, list[tuple[str, str]]]:
    """A stateless client's chat with the secret at seq 2, folded into memory."""
    store = Store.open("sqlite://")
    kk = Kioku(store, profile=TINY, layers=Layers(store))
    conv = kk.conversation("c", system_prompt="card", character="Mika")
    chat: list[tuple[str, str]] = []
    for i in range(n):
        chat.append(("user", SECRET if i == 1 else words(i)))
        synced = sync(conv, [Incoming(r, t) for r, t in chat], stateful=False)  # type: ignore[arg-type]
        conv.prepare_for(synced.entry)
        reply = f"reply {i}: " + words(i + 100, 20)
        conv.record(reply)
        chat.append(("assistant", reply))
        kk.worker.run_until_idle()
    assert conv.info().raw_start > 3, "the test needs seq 2 in memory"
    return kk, chat


def test_a_deleted_messages_notes_are_retracted_with_the_reason_and_shown_no_more() -> None:
    kk, _ = conversation()
    store = kk.store
    [note] = [n for n in current_notes(store.note_ledger("c")) if n.source_seq == 2]
    assert "Anna" in store.notes_snapshot("c")
    done = forget(kk.conversation("c"), 2)
    assert done.deleted and done.retracted
    tomb = next(e for e in store.note_ledger("c") if e.id == done.retracted[0])
    assert tomb.retracted and tomb.supersedes == note.id
    assert tomb.origin == "retracted: message #2 deleted"
    assert not [n for n in current_notes(store.note_ledger("c")) if n.source_seq == 2]
    assert "Anna" not in store.notes_snapshot("c")
    assert forget(kk.conversation("c"), 2).deleted is False  # deleted already: nothing more
    with pytest.raises(NotFound):
        forget(kk.conversation("c"), 10_000)


def test_a_note_the_operator_wrote_is_never_retracted_by_a_delete() -> None:
    store = Store.open("sqlite://")
    kk = Kioku(store, profile=TINY)
    kk.conversation("o")
    [extracted] = add_notes(store, "o", [NoteDraft("Anna", "relation", "sister", 2)])
    [mine] = add_notes(store, "o", [NoteDraft("Ben", "relation", "friend", 2)], author="operator")
    assert retract_sources(store, "o", {2: "edit"})
    live = {n.id for n in current_notes(store.note_ledger("o"))}
    assert extracted not in live and mine in live


def test_a_retracted_correction_gives_back_the_fact_it_replaced() -> None:
    store = Store.open("sqlite://")
    Kioku(store, profile=TINY).conversation("s")
    add_notes(store, "s", [NoteDraft("Anna", "fact", "lives in Osaka", 10, slot="home")])
    add_notes(store, "s", [NoteDraft("Anna", "fact", "lives in Kyoto", 40, slot="home")])
    assert [n.text for n in current_notes(store.note_ledger("s"))] == ["lives in Kyoto"]
    [tomb] = retract_sources(store, "s", {40: "edit"})
    [back] = current_notes(store.note_ledger("s"))
    assert (back.text, back.source_seq, back.slot) == ("lives in Osaka", 10, "home")
    assert back.origin == "restored: retracted: message #40 edited"
    # both statements taken back: nothing is left
    assert retract_sources(store, "s", {10: "delete"})
    assert not current_notes(store.note_ledger("s"))


def test_the_recall_index_forgets_a_deleted_message_in_every_process() -> None:
    kk, _ = conversation()
    store = kk.store
    assert 2 in {h.seq for h in kk.layers.search("c", "Kyoto sister", 5)}
    other = Layers(store)  # another process's index, loaded before the delete
    assert 2 in {h.seq for h in other.search("c", "Kyoto sister", 5)}
    other.indexes.flush("c")  # type: ignore[union-attr]
    assert store.recall_segments("c")
    before = store.conversation("c").revision
    forget(kk.conversation("c"), 2)
    assert store.conversation("c").revision == before + 1
    assert all(g.last_seq < 2 for g in store.recall_segments("c"))
    for layers in (kk.layers, other):
        assert 2 not in {h.seq for h in layers.search("c", "Kyoto", 5)}  # type: ignore[attr-defined]


def test_a_stale_items_stand_in_leaves_out_what_a_changed_message_said() -> None:
    kk, _ = conversation()
    store = kk.store
    item = next(i for i in store.items("c", "active") if i.first_seq <= 2 <= i.last_seq)
    assert "Kyoto" in item.text
    forget(kk.conversation("c"), 2)
    stale = next(i for i in store.items("c", "active") if i.id == item.id)
    assert stale.stale
    # no room for the corrected messages: the stale text, less what seq 2 said, then errata
    tight = replace(TINY, ceiling=TINY.prompt_budget)
    shown = stand_in(store, "c", stale, tight)
    assert "Kyoto" not in shown.text and "#2" in shown.text


def test_a_summary_that_read_a_message_deleted_meanwhile_is_not_stored() -> None:
    store = Store.open("sqlite://")
    kk = Kioku(store, profile=TINY, layers=Layers(store))
    conv = kk.conversation("j", system_prompt="card", character="Mika")
    for i in range(3):
        conv.append(Message.of("user", SECRET if i == 1 else words(i)))
    store.enqueue_job("j", "chapter", 0, 2, 0.0)

    class DeletesMidway:
        """A chronicler during whose call the user deletes seq 1."""

        def summarize(self, task: SummaryTask) -> Summary:
            forget(conv, 1)
            return kk.summarizer.summarize(task)

    kk.worker.summarizer = DeletesMidway()  # type: ignore[assignment]
    [outcome] = [kk.worker.run_once("j")]
    assert outcome is not None and outcome.status == "overtaken"
    assert not [i for i in store.items("j") if isinstance(i, MemoryItem) and i.status == "ready"]
    assert not current_notes(store.note_ledger("j"))


def test_a_user_is_never_stored_under_the_characters_name() -> None:
    assert same_name("Mika", " mika ") and same_name("Ｍｉｋａ", "mika")
    assert same_name("Mi\u200bka", "Mika") and same_name("「Mika」", "Mika")
    assert same_name("Mika:", "Mika") and same_name("Mika  Rose", "mika rose")
    assert not same_name("", "") and not same_name("Mika", "Mikan")
    assert user_author("Mika", "Mika") == "Mika (user)"
    assert user_author("mika  ", "Mika") == "mika (user)"
    assert user_author("Rin", "Mika", ("Rin", "Sora")) == "Rin (user)"
    assert user_author("Alex", "Mika") == "Alex"
    assert to_message(Incoming("user", "hi", "Mika"), "Mika").author == "Mika (user)"
    assert to_message(Incoming("user", "hi"), "Mika", user="Mika").author == "Mika (user)"
    assert to_message(Incoming("assistant", "hi"), "Mika").author == "Mika"
    # a row stored before the rule: read as the user's wherever a range is read for memory
    old = [
        LogEntry(0, Message.of("user", SECRET, author="Mika")),
        LogEntry(1, Message.of("assistant", "How sweet!", author="Mika")),
    ]
    assert [e.message.author for e in as_recorded(old)] == ["Mika (user)", "Mika"]
    store = Store.open("sqlite://")
    Kioku(store, profile=TINY).conversation("old")
    assert update_notes(store, "old", old)
    assert {n.said_by for n in store.note_ledger("old")} == {"Mika (user)"}
    shown = render_transcript(as_recorded(old))
    assert "Mika (user)\n" in shown and "(user) (user)" not in shown
    lines = ExtractiveSummarizer(ScriptEstimator()).summarize(chapter_task(old, TINY)).data
    assert {ln["speaker"] for ln in lines["lines"] if ln["seq"] == 0} == {"Mika (user)"}


def test_the_delete_route_is_the_operators_and_says_what_it_did(harness: Harness) -> None:
    cid = "route-forget"
    with harness.http() as h:
        for text in ("hello", SECRET):
            body = {"model": "m", "messages": [{"role": "user", "content": text}]}
            r = h.post("/v1/chat/completions", headers={"X-Kioku-Conversation": cid}, json=body)
            assert r.status_code == 200, r.text
        harness.idle()
        seq = next(e.seq for e in harness.store.entries(cid) if e.text == SECRET)
        chat_only = create_key(harness.store, "acme", scopes=("chat",))[1]
        r = h.delete(
            f"/v1/conversations/{cid}/messages/{seq}",
            headers={"Authorization": f"Bearer {chat_only}"},
        )
        assert r.status_code == 403
        r = h.delete(f"/v1/conversations/{cid}/messages/{seq}")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert harness.store.entries(cid, seq, seq)[0].message.is_empty()
        again = h.delete(f"/v1/conversations/{cid}/messages/{seq}")
        assert again.status_code == 200 and again.json()["deleted"] is False
        assert h.delete(f"/v1/conversations/{cid}/messages/999").status_code == 404
        assert h.delete("/v1/conversations/nobody/messages/0").status_code == 404
        assert h.delete(f"/v1/conversations/{cid}/messages/-1").status_code in (400, 422)
