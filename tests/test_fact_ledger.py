"""The fact ledger: what survives forced cuts, supersession by slot, mentions and ranking."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.memory import render_memory
from kioku.messages import LogEntry, Message
from kioku.notes import Note, NoteDraft, add_notes, ledger, notes, rank, render_notes
from kioku.profiles import get_profile
from kioku.store import Store
from kioku.story import story
from kioku.tokens import ScriptEstimator
from tests.helpers import Clock

HANAKO = (
    "Oh, and before I forget: my sister is Hanako, her birthday is March 3rd, and I promise "
    "to bake her a strawberry cake this year."
)


def test_a_fast_client_loses_nothing_the_ledger_would_keep() -> None:
    """150 turns sent in 3 s: no summary is ever ready, every fold is a forced extractive cut,
    and the planted line must still be in memory at the end, in the notes too."""
    t = story("en", 400)
    users = [m for m in t.messages if m.role == "user"]
    replies = [m for m in t.messages if m.role == "assistant"]
    clock = Clock(1_700_000_000.0)
    store = Store.open("sqlite://")
    layers = Layers(store, recall=False, tics=False)
    kk = Kioku(store, profile=get_profile("local-64k", 4096), clock=clock, layers=layers)
    conv = kk.conversation("fast", character="Mina")
    for turn in range(150):
        clock.advance(0.02)
        conv.prepare(HANAKO if turn == 5 else replace(users[turn], at=None))
        conv.record(replace(replies[turn], at=None))
    counters = kk.store.counters("fast")
    assert counters["forced_cuts"] >= 2
    assert counters["folds"] == counters["forced_cuts"]  # every fold was a forced cut
    assert counters.get("chapters_written", 0) == 0  # no summary job ever finished
    assert conv.info().raw_start > 100  # the planted turn left the raw window long ago
    shown, _ = render_memory(conv.memory(), "en")
    assert "Hanako" in shown and "March 3rd" in shown and "strawberry cake" in shown
    kept = {(n.subject, n.kind, n.text) for n in notes(kk.store, "fast")}
    assert ("user", "relation", "sister is Hanako") in kept
    assert ("Hanako", "anniversary", "birthday is March 3rd") in kept
    assert any(k == "promise" and "bake Hanako a strawberry cake" in t for _, k, t in kept)
    assert "## ⟦Notes⟧" in shown and "sister is Hanako" in shown.split("## ⟦Notes⟧")[1]
    kk.close()


def test_a_newer_fact_in_a_slot_supersedes_the_older(tmp_path) -> None:
    """ "Mina likes the clouds / heat / fog / rain": one weather at a time, the rest marked."""
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    day = datetime(2024, 5, 1, 18, 0)
    es = [
        LogEntry(
            i,
            Message.assistant(
                f"I like the {w}. It makes the tea taste better.", "Mina", day + timedelta(days=i)
            ),
        )
        for i, w in enumerate(["clouds", "heat", "fog", "rain"])
    ]
    from kioku.notes import update_notes

    for e in es:
        update_notes(store, "c", [e])
    in_force = [n for n in notes(store, "c") if n.kind == "preference"]
    assert [n.text for n in in_force] == ["likes the rain"]
    assert in_force[0].on_date == "2024-05-04"
    history = [n for n in ledger(store, "c") if n.kind == "preference"]
    assert len(history) == 4 and all(n.supersedes for n in history[1:])  # marked, kept
    # a polarity change supersedes too: the object is the slot
    update_notes(store, "c", [LogEntry(9, Message.assistant("I like jasmine tea.", "Mina"))])
    update_notes(store, "c", [LogEntry(10, Message.assistant("I don't like jasmine tea.", "Mina"))])
    texts = {n.text for n in notes(store, "c")}
    assert "dislikes jasmine tea" in texts and "likes jasmine tea" not in texts
    store.close()


def test_a_fact_stated_again_is_a_mention_and_ranks_higher() -> None:
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    swim = NoteDraft("CP", "preference", "泳ぐことが好き", 1, said_by="CP", slot="pref:泳ぐこと")
    book = NoteDraft("CP", "preference", "本が好き", 2, said_by="CP", slot="pref:本")
    add_notes(store, "c", [book, swim])
    for seq in (10, 20, 30):
        assert add_notes(store, "c", [NoteDraft("CP", "preference", "泳ぐことが好き", seq)]) == []
    by_text = {n.text: n for n in notes(store, "c")}
    assert by_text["泳ぐことが好き"].mentions == 4 and by_text["本が好き"].mentions == 1
    assert [n.text for n in rank(list(by_text.values()))][0] == "泳ぐことが好き"
    assert store.note_mention_seqs("c")[by_text["泳ぐことが好き"].id] == [1, 10, 20, 30]
    store.close()


def test_rank_prefers_the_person_of_the_whole_conversation_over_a_one_off_partner() -> None:
    ns = [
        Note(1, "AC", "preference", "ビールが好き", mentions=1),
        Note(2, "CP", "preference", "本が好き", mentions=1),
        Note(3, "CP", "preference", "ミステリーが好き", mentions=3),
        Note(4, "CP", "relation", "子供が2人いる", mentions=1),
    ]
    order = [n.id for n in rank(ns)]
    assert order.index(2) < order.index(1) and order[0] in (3, 4)


def test_notes_show_their_date_and_who_said_them() -> None:
    n = Note(1, "CPの子供", "preference", "もつ鍋が好き", said_by="CP", on_date="2022-08-02")
    assert n.shown("ja") == "- [preference] CPの子供: もつ鍋が好き (2022年8月2日, CPの話)"
    own = Note(2, "Aki", "anniversary", "birthday is 3 May", said_by="Aki", on_date="2023-05-08")
    assert own.shown("en") == "- [anniversary] Aki: birthday is 3 May (8 May 2023)"
    r = render_notes([n, own], 10_000, ScriptEstimator(), "ja")
    assert "2022年8月2日" in r.text and r.kept == 2
    # the operator's editable text stays `- [kind] subject: text`
    assert own.line() == "- [anniversary] Aki: birthday is 3 May"
