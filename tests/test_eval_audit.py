from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from kioku.eval.audit import audit_store, content_terms, count_phrases, tic_phrases
from kioku.eval.cli import register
from kioku.eval.report import markdown
from kioku.eval.strategies import CONVERSATION_ID, KiokuArm, close_all, replay
from kioku.memory import MemoryItem
from kioku.messages import Message, Part
from kioku.models import ScriptedModel
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.story import story
from kioku.structure import FORMAT
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator

TIC = "Steady as the tide, you know."


def _conversation(store: Store, cid: str) -> None:
    store.ensure_conversation(cid, character="Mina")
    say = lambda t: Part("speech", t, "Mina")  # noqa: E731
    msgs = [
        Message.user("I moved here from Otaru.", "Ren"),
        Message(
            "assistant",
            (say("I'm only 19 years old."), Part("thought", "I'm 27 really.", "Mina")),
            "Mina",
        ),
        Message.user("Will you take me to the festival?", "Ren"),
        Message("assistant", (say("I promise I'll take you to the lantern festival."),), "Mina"),
        Message.user("Is tonight the night?", "Ren"),
        Message(
            "assistant",
            (Part("narration", "They went to the lantern festival."), say("Told you.")),
            "Mina",
        ),
    ]
    for i in range(24):
        msgs.append(Message.user(f"Evening number {i}, any news about the boats?", "Ren"))
        opener = ("Yes", "Well", "Hmm", "Oh")[i % 4]
        msgs.append(Message("assistant", (say(f"{opener}, boat {i} came in late. {TIC}"),), "Mina"))
    for m in msgs:
        store.append(cid, m, 10)


def _item(
    kind: str, first: int, last: int, text: str, status: str, data: dict | None = None
) -> MemoryItem:
    return MemoryItem(
        kind,  # type: ignore[arg-type]
        first,
        last,
        text,
        20,
        source="llm" if data else "extractive",
        data=data or {},
        status=status,  # type: ignore[arg-type]
    )


def _record(**parts: list) -> dict:
    base = {
        "format": FORMAT,
        "lang": "en",
        "events": [],
        "claims": [],
        "threads": [],
        "user_facts": [],
        "key_lines": [],
    }
    return {**base, **parts}


def test_extractive_chapters_are_checked_line_by_line() -> None:
    store = Store.open("sqlite://")
    _conversation(store, "x")
    text = "\n".join(
        [
            "[0] Ren: I moved here from Otaru.",
            "[1] narration: I'm only 19 years old.",  # speech shown as what happened
            "[1] Mina (thought): I'm 27 really.",
            "Mina is 19 years old, an established fact.",  # no attribution at all
            "[3] Mina: I promise I'll take you to the lantern festival.",
            "[7] Mina: Yes, boat 0 came in late.",
        ]
    )
    store.add_item("x", _item("chapter", 0, 59, text, "active"))
    r = audit_store(store, "x")
    (row,) = r["items"]
    assert row["unattributed_lines"] == 1
    assert row["misattributed"] == 1
    assert row["narrated_speech"] == 1
    assert row["not_in_source"] == 0
    assert row["fact_phrases"] == 1
    t = r["totals"]
    assert t["quotes_unattributed"] == 1 and t["quotes_narrated_speech"] == 1
    assert t["fact_phrases_in_memory"] == 1
    # quotes state no claims and record no threads: nothing of that kind to judge
    assert t["claims_as_fact"] == "n/a" and t["resolved_left_open"] == "n/a"
    assert r["threads"]["tracked"] is False
    assert any("tide" in p.lower() for p in r["tics"]["phrases"])
    assert t["tic_phrases_in_memory"] == 0  # the extractive line above has no tic


def test_structured_chapters_threads_tics_and_attribution() -> None:
    store = Store.open("sqlite://")
    _conversation(store, "y")
    open_note = {
        "id": "festival",
        "title": "the lantern festival promise",
        "status": "open",
        "seq": 3,
    }
    c1 = _record(
        events=[{"seq": 1, "text": "Mina is only 19 years old."}],  # restates her speech as fact
        claims=[{"seq": 1, "speaker": "", "claim": "she is 19"}],  # a claim with no speaker
        threads=[open_note],
    )
    c2 = _record(
        events=[{"seq": 5, "text": "They went to the lantern festival."}],  # narration: fine
        threads=[{**open_note, "status": "resolved", "seq": 5}],
    )
    syn = _record(
        events=[{"seq": 7, "text": f"Mina keeps saying: {TIC}"}],
        claims=[
            {
                "seq": 1,
                "speaker": "Mina",
                "listener": "Ren",
                "claim": "she is 19",
                "actual": "she is 27",
            }
        ],
        threads=[open_note],  # the rewrite forgot that the promise was kept
    )
    store.add_item("y", _item("chapter", 0, 3, "c1", "retired", c1))
    store.add_item("y", _item("chapter", 4, 5, "c2", "retired", c2))
    store.add_item("y", _item("synopsis", 0, 5, "s", "active", syn))
    store.add_item("y", _item("chapter", 6, 59, "plain", "active"))
    model = ScriptedModel(
        default=json.dumps(
            {"claims_as_fact": [{"sentence": "x", "speaker": "Mina"}], "resolved_left_open": []}
        )
    )
    r = audit_store(store, "y", model=model)
    rows = {(x["kind"], x["first_seq"], x["last_seq"]): x for x in r["items"]}
    first = rows[("chapter", 0, 3)]
    assert first["claims_unattributed"] == 1
    assert first["events_restating_speech"] == 1
    assert first["claims_as_fact"] == 2
    assert rows[("chapter", 4, 5)]["claims_as_fact"] == 0
    assert r["threads"]["resolved_left_open"] == [
        {"id": "festival", "title": "the lantern festival promise", "resolved_at": 5}
    ]
    t = r["totals"]
    assert t["resolved_left_open"] == 1
    assert t["claims_as_fact"] == 2  # the structured items' (the plain chapter states none)
    assert t["quotes_unattributed"] == 1  # "plain" is not a quote
    assert t["tic_phrases_in_memory"] >= 1
    assert t["attribution_phrases_in_memory"] >= 1  # "Mina told Ren: …"
    assert t["llm_claims_as_fact"] == 3  # one per chapter the model read
    first_prompt = model.history[0].messages[-1].content
    assert "#1 · Mina (character)" in first_prompt and "c1" in first_prompt
    assert "Memory audit" in markdown(r)


@pytest.mark.slow
def test_lines_memory_holds_twice_and_habits_are_counted() -> None:
    store = Store.open("sqlite://")
    _conversation(store, "w")
    first = "[0] Ren: I moved here from Otaru.\n[7] Mina: Yes, boat 0 came in late."
    store.add_item("w", _item("chapter", 0, 9, first, "active"))
    again = f"[0] Ren: i moved here from Otaru!\n[9] Mina: {TIC}"  # folded alike; a habit
    store.add_item("w", _item("chapter", 10, 19, again, "active"))
    r = audit_store(store, "w")
    assert r["totals"]["lines_in_memory_twice"] == 1
    assert r["totals"]["habit_lines_in_memory"] == 1 and r["worth"]["habit_lines_in_memory"] == [
        TIC
    ]
    clean = Store.open("sqlite://")
    _conversation(clean, "w")
    clean.add_item("w", _item("chapter", 0, 9, first, "active"))
    assert audit_store(clean, "w")["totals"]["lines_in_memory_twice"] == 0
    assert audit_store(clean, "w")["totals"]["habit_lines_in_memory"] == 0


def test_audit_of_a_replayed_story() -> None:
    t = story("en", 700)
    counter = ScriptEstimator()
    arms = replay(
        t,
        profile=LOCAL_8K,
        counter=counter,
        summarizer=ExtractiveSummarizer(counter),
        strategies=["generational"],
    )
    arm = arms["generational"]
    assert isinstance(arm, KiokuArm)
    r = audit_store(arm.kk.store, CONVERSATION_ID)
    close_all(arms)
    t = r["totals"]
    assert t["claims_as_fact"] == "n/a"  # quotes, no claims
    assert t["quotes_unattributed"] == t["quotes_not_in_source"] == 0  # attributed, sourced
    assert all(x["not_in_source"] == 0 for x in r["items"])
    assert r["totals"]["tic_phrases_found"] >= 1
    assert t["lines_in_memory_twice"] == 0  # a line memory holds is not kept again


def test_quoted_questions_and_promises_whose_resolution_memory_lost() -> None:
    store = Store.open("sqlite://")
    _conversation(store, "q")
    text = "\n".join(
        [
            "[2] Ren: Will you take me to the festival?",  # answered at 3, which is kept
            "[3] Mina: I promise I'll take you to the lantern festival.",  # kept at 5: lost
        ]
    )
    store.add_item("q", _item("chapter", 0, 59, text, "active"))
    r = audit_store(store, "q")
    loose = r["quoted_threads"]
    assert loose["judged"] == 2 and loose["questions"] == 1 and loose["promises"] == 1
    (left,) = loose["examples"]
    assert left["kind"] == "promise" and left["seq"] == 3 and left["resolved_at"] == 5
    assert "went to the lantern festival" in left["resolution"]
    assert r["totals"]["quoted_threads_resolved_left_open"] == 1
    # with the keeping quoted too, nothing is left open
    kept = Store.open("sqlite://")
    _conversation(kept, "q")
    both = text + "\n[5] narration: They went to the lantern festival."
    kept.add_item("q", _item("chapter", 0, 59, both, "active"))
    assert audit_store(kept, "q")["totals"]["quoted_threads_resolved_left_open"] == 0


def test_memory_without_questions_or_promises_is_not_judged() -> None:
    store = Store.open("sqlite://")
    _conversation(store, "n")
    store.add_item("n", _item("chapter", 0, 59, "[0] Ren: I moved here from Otaru.", "active"))
    t = audit_store(store, "n")["totals"]
    assert t["quoted_threads"] == "n/a" and t["quoted_threads_resolved_left_open"] == "n/a"
    assert t["notes"] == 0 and t["notes_keep_share"] == "n/a"


def test_notes_are_audited() -> None:
    from kioku.notes import NoteDraft, add_notes

    store = Store.open("sqlite://")
    _conversation(store, "m")
    store.add_item("m", _item("chapter", 0, 59, "[0] Ren: I moved here from Otaru.", "active"))
    add_notes(
        store,
        "m",
        [
            NoteDraft("Ren", "fact", "moved here from Otaru", 0),
            NoteDraft("CP", "preference", "なにが好き"),  # a question
            NoteDraft("CP", "preference", "のが好き"),  # a fragment
            NoteDraft("AI", "preference", "つ鍋が子供が好き"),  # whose preference?
            NoteDraft("Caroline", "preference", "likes that you chose pottery"),  # no referent
            NoteDraft("CP", "preference", "ミステリーが好き"),
            NoteDraft("Mina", "fact", "runs the lighthouse", 0),  # not what message 0 says
        ],
        origin="test",
    )
    r = audit_store(store, "m")
    flags = {n["line"]: n["flags"] for n in r["notes"]}
    assert flags["- [fact] Ren: moved here from Otaru"] == []
    assert flags["- [preference] CP: ミステリーが好き"] == []
    assert "question" in flags["- [preference] CP: なにが好き"]
    assert "fragment" in flags["- [preference] CP: のが好き"]
    assert "owner_unclear" in flags["- [preference] AI: つ鍋が子供が好き"]
    assert "fragment" in flags["- [preference] Caroline: likes that you chose pottery"]
    assert "not_in_source" in flags["- [fact] Mina: runs the lighthouse"]
    t = r["totals"]
    assert t["notes"] == 7 and t["notes_flagged"] == 5
    assert t["notes_keep_share"] == pytest.approx(2 / 7, abs=1e-3)


def test_dataset_markup_is_not_a_verbal_tic() -> None:
    store = Store.open("sqlite://")
    store.ensure_conversation("p", character="Mel")
    for i in range(24):
        store.append("p", Message.user(f"What did you do on day {i}?", "Caro"), 10)
        store.append(
            "p",
            Message.assistant(
                f"Day {i} was about the {('garden', 'lake', 'market')[i % 3]} "
                f"number {i}. [shares a photo: a photo of a dog number {i}]",
                "Mel",
            ),
            10,
        )
    store.add_item(
        "p", _item("chapter", 0, 47, "[1] Mel: [shares a photo: a photo of a dog]", "active")
    )
    r = audit_store(store, "p")
    replies = [e.text for e in store.entries("p") if e.role == "assistant"]
    assert any("photo" in p for p in tic_phrases(replies))  # what the markup would look like
    assert not any("shares" in p or "photo" in p for p in r["tics"]["phrases"])


def test_cli_audits_a_story_and_a_database(tmp_path) -> None:
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["eval", "audit", "--format", "story", "--messages", "400", "--window", "8192", "--json"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["kind"] == "kioku.eval.audit/1"
    db = tmp_path / "k.db"
    store = Store.open(f"sqlite:///{db}")
    _conversation(store, "z")
    store.add_item("z", _item("chapter", 0, 59, "[0] Ren: I moved here from Otaru.", "active"))
    res = runner.invoke(app, ["eval", "audit", "z", "--db", f"sqlite:///{db}"])
    assert res.exit_code == 0, res.output
    assert "claims as fact" in res.stdout
    res = runner.invoke(app, ["eval", "audit"])
    assert res.exit_code != 0


def test_helpers() -> None:
    assert {"19", "years"} <= content_terms("I'm only 19 years old")
    assert "函館" in content_terms("函館の出身")
    assert count_phrases("Steady as the tide. steady AS the tide", ["steady as the tide,"]) == {
        "steady as the tide,": 2
    }


@pytest.mark.parametrize("lang", ["ja"])
def test_japanese_attribution_phrases(lang: str) -> None:
    from kioku.eval.audit import ATTRIBUTION, FACT_PHRASES

    assert ATTRIBUTION.search("ユキノは18歳だと言った")
    assert ATTRIBUTION.search("本人の主張")
    assert FACT_PHRASES.search("確定した事実として")
