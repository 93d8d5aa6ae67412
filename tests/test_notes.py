from __future__ import annotations

import json

import pytest

from kioku.errors import BadSummary, InputError
from kioku.messages import LogEntry, Message
from kioku.models import Completion, ScriptedModel
from kioku.notes import (
    NOTES_PROMPT_VERSION,
    BadNotes,
    Note,
    NoteDraft,
    NotesExtractor,
    add_notes,
    apply_edit,
    current_notes,
    extract_notes_heuristic,
    ledger,
    notes,
    parse_lines,
    render_editable,
    render_notes,
    update_notes,
)
from kioku.store import Store
from kioku.tokens import ScriptEstimator


@pytest.fixture
def store():
    st = Store.open("sqlite://")
    st.ensure_conversation("c1")
    st.ensure_conversation("c2")
    yield st
    st.close()


def entries(*texts: str) -> list[LogEntry]:
    out = []
    for i, t in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        out.append(LogEntry(i, Message.of(role, t, author="Aki" if role == "user" else "Mika")))
    return out


def test_a_superseded_note_stays_in_the_ledger_but_leaves_the_rendering(store):
    (old,) = add_notes(store, "c1", [NoteDraft("Aki", "preference", "likes green tea", 3)])
    (new,) = add_notes(
        store, "c1", [NoteDraft("Aki", "preference", "likes hojicha now", 40, supersedes=old)]
    )
    assert [n.id for n in ledger(store, "c1")] == [old, new]
    assert [n.id for n in notes(store, "c1")] == [new]
    text = render_editable(notes(store, "c1"))
    assert "- [preference] Aki: likes hojicha now" in text and "green tea" not in text
    assert notes(store, "c2") == []  # conversations do not see each other's notes


def test_operator_edit_wins_over_a_later_extracted_note(store):
    add_notes(store, "c1", [NoteDraft("Aki", "anniversary", "birthday is 3 May", 5)])
    base = render_editable(notes(store, "c1"))
    result = apply_edit(store, "c1", base.replace("3 May", "5 March"), base)
    assert len(result.changed) == 1 and not result.added and not result.retracted
    # the extractor later misreads the same subject and kind
    add_notes(store, "c1", [NoteDraft("aki", "anniversary", "birthday is 3 May", 90)])
    shown = render_editable(notes(store, "c1"))
    assert "birthday is 5 March" in shown and "3 May" not in shown
    assert len(ledger(store, "c1")) == 3  # it is recorded all the same
    # other subjects and kinds are unaffected
    add_notes(store, "c1", [NoteDraft("Aki", "preference", "likes jazz", 91)])
    assert "likes jazz" in render_editable(notes(store, "c1"))


def test_an_extracted_entry_cannot_supersede_an_operator_entry():
    ledger_ = [
        Note(1, "Aki", "relation", "sister is Yuki", author="operator"),
        Note(2, "Aki", "fact", "sister is Yuka", author="extractor", supersedes=1),
    ]
    assert [n.id for n in current_notes(ledger_)] == [1]


def test_edit_adds_changes_and_retracts(store):
    add_notes(
        store,
        "c1",
        [
            NoteDraft("Aki", "preference", "likes green tea", 1),
            NoteDraft("Mika", "habit", "walks by the river every evening", 2),
            NoteDraft("Aki", "relation", "sister is Yuki", 3),
        ],
    )
    base = render_editable(notes(store, "c1"))
    edited = (
        base.replace("- [habit] Mika: walks by the river every evening\n", "").replace(
            "likes green tea", "likes hojicha"
        )
        + "- [promise] Mika: will bake a cake for Aki's birthday\n"
    )
    result = apply_edit(store, "c1", edited, base)
    assert (len(result.added), len(result.changed), len(result.retracted)) == (1, 1, 1)
    now = render_editable(notes(store, "c1"))
    assert "river" not in now and "likes hojicha" in now and "bake a cake" in now
    assert "sister is Yuki" in now
    assert len(ledger(store, "c1")) == 6  # 3 extracted + added + change + tombstone
    assert all(n.author == "operator" for n in ledger(store, "c1")[3:])


def test_edit_against_its_base_leaves_notes_added_meanwhile(store):
    add_notes(store, "c1", [NoteDraft("Aki", "preference", "likes green tea", 1)])
    base = render_editable(notes(store, "c1"))
    add_notes(store, "c1", [NoteDraft("Aki", "relation", "sister is Yuki", 8)])  # meanwhile
    apply_edit(store, "c1", base.replace("green tea", "oolong"), base)
    now = render_editable(notes(store, "c1"))
    assert "sister is Yuki" in now and "oolong" in now


def test_a_bad_edit_line_writes_nothing(store):
    add_notes(store, "c1", [NoteDraft("Aki", "preference", "likes green tea", 1)])
    with pytest.raises(InputError, match="line 3"):
        apply_edit(store, "c1", "# header\n- [preference] Aki: likes tea\nthis is not a note\n")
    with pytest.raises(InputError, match="kind"):
        apply_edit(store, "c1", "- [mood] Aki: grumpy\n")
    assert len(ledger(store, "c1")) == 1


def test_parse_lines_accepts_what_render_writes():
    drafts = [
        NoteDraft("Aki", "name", "is called Aki-chan"),
        NoteDraft("ミカ", "preference", "猫が好き"),
    ]
    text = render_editable([Note(i, d.subject, d.kind, d.text) for i, d in enumerate(drafts, 1)])
    assert [(d.subject, d.kind, d.text) for d in parse_lines(text)] == [
        (d.subject, d.kind, d.text) for d in drafts
    ]


def test_render_notes_fits_the_budget_and_keeps_operator_notes_first():
    counter = ScriptEstimator()
    ns = [Note(i, "Aki", "habit", f"habit number {i} " + "x " * 10) for i in range(1, 30)]
    ns.append(Note(99, "Aki", "fact", "the operator's note", author="operator"))
    r = render_notes(ns, 60, counter)
    assert r.tokens <= 60 and counter.count(r.text) == r.tokens
    assert "the operator's note" in r.text
    assert r.kept + r.dropped == len(ns) and r.dropped > 0
    everything = render_notes(ns, 10_000, counter)
    assert everything.dropped == 0 and everything.text.count("\n") == len(ns) - 1
    assert render_notes(ns, 0, counter).text == ""


def test_heuristic_extraction_english_and_japanese():
    es = entries(
        "Hi! My name is Aki Tanaka and I really love strawberry shortcake.",
        "I promise to bring you the book.",
        "My birthday is on 3 May, by the way. My sister is called Yuki.",
        "私の誕生日は五月三日だよ。ラーメンが大好き。",
        "来週また会おうって約束したよね。",
        "I usually jog before breakfast.",
    )
    got = {(d.subject, d.kind, d.text, d.source_seq) for d in extract_notes_heuristic(es)}
    assert ("Aki", "name", "is called Aki Tanaka", 0) in got
    assert ("Aki", "preference", "likes strawberry shortcake", 0) in got
    assert ("Mika", "promise", "promised: bring Aki the book", 1) in got  # "you" keeps its referent
    assert ("Aki", "anniversary", "birthday is 3 May", 2) in got
    assert ("Aki", "relation", "sister is Yuki", 2) in got
    assert ("Mika", "anniversary", "誕生日は五月三日", 3) in got
    assert ("Mika", "preference", "ラーメンが大好き", 3) in got
    assert any(k == "promise" and "来週また会おう" in t for _, k, t, _ in got)
    assert ("Mika", "habit", "usually jog before breakfast", 5) in got
    assert extract_notes_heuristic(entries("It rained.", "The train was late.")) == []
    # a pointer, a reaction, a question or a fragment is not a fact a reader would keep
    none = entries(
        "I promise to remember that.", "I love that you chose pottery.", "なにが好き？", "のが好き"
    )
    assert extract_notes_heuristic(none) == []


def test_update_notes_without_a_model_uses_the_heuristic(store):
    ids = update_notes(store, "c1", entries("My name is Aki.", "ok"))
    assert len(ids) == 1 and notes(store, "c1")[0].origin.startswith("notes-heuristic")
    assert update_notes(store, "c1", entries("My name is Aki.", "ok")) == []  # no duplicates


def reply(*objs: dict) -> str:
    return "\n".join(json.dumps(o, ensure_ascii=False) for o in objs)


def test_model_extraction_stores_parsed_notes_and_shows_the_prompt(store):
    (old,) = add_notes(store, "c1", [NoteDraft("Aki", "preference", "likes green tea", 0)])
    model = ScriptedModel(
        [
            "```json\n"
            + reply(
                {"subject": "Aki", "kind": "anniversary", "text": "birthday is 3 May", "seq": 10},
                {
                    "subject": "Aki",
                    "kind": "preference",
                    "text": "switched to hojicha",
                    "seq": 11,
                    "supersedes": old,
                },
            )
            + "\n```"
        ]
    )
    es = [
        LogEntry(10, Message.user("My birthday is 3 May.", author="Aki")),
        LogEntry(11, Message.user("I switched to hojicha.", author="Aki")),
    ]
    ids = update_notes(store, "c1", es, NotesExtractor(model))
    assert len(ids) == 2
    shown = render_editable(notes(store, "c1"))
    assert "birthday is 3 May" in shown and "hojicha" in shown and "green tea" not in shown
    (req,) = model.history
    assert req.purpose == "notes" and req.messages[0].role == "system"
    prompt = model.prompts("notes")[0]
    assert "⟦10⟧ Aki: My birthday is 3 May." in prompt
    assert f"#{old} [preference] Aki: likes green tea" in prompt
    assert "NONE" in prompt and "catchphrases" in prompt
    assert notes(store, "c1")[-1].origin == f"{NOTES_PROMPT_VERSION}-en"


def test_model_says_none(store):
    model = ScriptedModel(["NONE"])
    assert update_notes(store, "c1", entries("hello", "hi"), NotesExtractor(model)) == []


@pytest.mark.parametrize(
    "bad",
    [
        "Aki's birthday is 3 May.",  # prose instead of JSON lines
        reply({"subject": "Aki", "kind": "anniversary", "text": "birthday is 3 May", "seq": 0})
        + "\nand also she likes tea",
        reply({"subject": "Aki", "kind": "mood", "text": "happy", "seq": 0}),
        reply({"subject": "Aki", "kind": "fact", "text": "x", "seq": 999}),
        reply({"subject": "Aki", "kind": "fact", "text": "x", "seq": 0, "supersedes": 12345}),
        reply({"subject": "", "kind": "fact", "text": "x", "seq": 0}),
        "[1, 2]",
        "",
    ],
)
def test_bad_model_output_is_never_parsed_and_the_model_free_extractor_stands_in(store, bad):
    model = ScriptedModel([bad])
    with pytest.raises(BadNotes) as info:
        NotesExtractor(model).extract(entries("My name is Aki.", "ok"))
    assert isinstance(info.value, BadSummary)
    # the notes miss nothing the extractor can see: it reads the same messages (issue 21)
    update_notes(
        store, "c1", entries("My name is Aki.", "ok"), NotesExtractor(ScriptedModel([bad]))
    )
    (note,) = notes(store, "c1")
    assert note.kind == "name" and note.origin.startswith("notes-heuristic")
    assert store.counters("c1")["notes_fallbacks"] == 1
    assert [e["outcome"] for e in store.log_entries("c1") if e["event"] == "notes"] == ["fallback"]


def test_a_cut_reply_is_not_parsed(store):
    good = reply({"subject": "Aki", "kind": "name", "text": "is called Aki", "seq": 0})
    model = ScriptedModel([Completion(good, finish_reason="length")])
    with pytest.raises(BadNotes, match="max_tokens"):
        NotesExtractor(model).extract(entries("My name is Aki.", "ok"))
    assert ledger(store, "c1") == []


def test_japanese_prompt():
    model = ScriptedModel(["NONE"])
    NotesExtractor(model, lang="ja").extract(entries("私の誕生日は五月三日だよ。"))
    assert "NONE" in model.prompts()[0] and "口癖" in model.prompts()[0]


def test_a_note_the_messages_do_not_bear_out_never_enters_the_ledger(store):
    """The 1.5B model's kinds of invention, as notes: a stranger's name, a fact of one person
    filed under the other, a detail the message does not have. Each is dropped and logged."""
    es = [
        LogEntry(10, Message.user("My birthday is 3 May.", author="Aki")),
        LogEntry(
            11, Message("assistant", Message.user("I moved to Otaru last spring.").parts, "Mina")
        ),
    ]
    model = ScriptedModel(
        [
            reply(
                {"subject": "Aki", "kind": "anniversary", "text": "birthday is 3 May", "seq": 10},
                {"subject": "Aoi", "kind": "anniversary", "text": "birthday is 3 May", "seq": 10},
                {"subject": "Aki", "kind": "fact", "text": "moved to Otaru last spring", "seq": 11},
                {
                    "subject": "Mina",
                    "kind": "fact",
                    "text": "moved to Sapporo with her sister",
                    "seq": 11,
                },
            )
        ]
    )
    ids = update_notes(store, "c1", es, NotesExtractor(model))
    assert len(ids) == 1
    (kept,) = notes(store, "c1")
    assert (kept.subject, kept.text) == ("Aki", "birthday is 3 May")
    logged = [e["event"] for e in store.log_entries("c1")]
    assert sorted(x for x in logged if x.startswith("note_dropped")) == [
        "note_dropped_author",  # Mina's move filed under Aki
        "note_dropped_name",  # Aoi is nobody here
        "note_dropped_name",  # Sapporo is nowhere in the messages
    ]
