from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kioku.datasets import load_locomo
from kioku.errors import ContextOverflow
from kioku.eval import locomo, phases
from kioku.eval.answers import normalize
from kioku.eval.cli import HEADLINE_DEFAULT, register
from kioku.eval.plots import answer_by_age
from kioku.eval.report import markdown
from kioku.eval.strategies import HEADLINE, Context
from kioku.models import ChatMessage, ChatRequest, ScriptedModel
from kioku.profiles import get_profile
from kioku.tokens import ScriptEstimator

SESSIONS = 20
CUES = [
    *("amber", "birch", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo"),
    *("juniper", "kestrel", "lotus", "maple", "nectar", "onyx", "pepper", "quartz", "raven"),
    *("saffron", "tundra"),
]
FILLER = [
    "The weather was mild and the park was crowded with families walking their dogs.",
    "Work has been busy, lots of meetings and emails, but the weekend is close.",
    "I tried a new recipe for dinner and it turned out better than expected.",
    "We should plan something fun for the holidays, maybe a short trip somewhere.",
    "Traffic this morning was terrible, it took an hour to get across town.",
]


def write_locomo(path: Path, conversations: int = 6) -> Path:
    data = []
    for c in range(conversations):
        conv: dict = {"speaker_a": "Ann", "speaker_b": "Bob"}
        qa = []
        for s in range(1, SESSIONS + 1):
            cue = CUES[s - 1]
            turns = []
            for t in range(12):
                who = "Ann" if t % 2 == 0 else "Bob"
                # said once each: the same sentence said again and again is a habit, which
                # memory leaves out (`kioku.worth`), and real chats do not repeat theirs so
                text = f"On day {s}, turn {t}: {FILLER[(s + t + c) % len(FILLER)].lower()}"
                if t == 2:
                    text = f"At the {cue} market I bought a kite called Zorblat{c}x{s}."
                turns.append({"speaker": who, "dia_id": f"D{s}:{t + 1}", "text": text})
            conv[f"session_{s}"] = turns
            conv[f"session_{s}_date_time"] = f"1:56 pm on {s} May, 2023"
            qa.append(
                {
                    "question": f"What kite did Ann buy at the {cue} market?",
                    "answer": f"Zorblat{c}x{s}",
                    "evidence": [f"D{s}:3"],
                    "category": 1 + s % 4,
                }
            )
        qa.append(
            {"question": "Unanswerable?", "adversarial_answer": "x", "evidence": [], "category": 5}
        )
        data.append({"sample_id": f"conv-{c}", "conversation": conv, "qa": qa})
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_locomo(tmp_path_factory.mktemp("locomo") / "locomo.json")


def _options(**kw) -> locomo.Options:
    return locomo.Options(**{"budget": 2048, "conversations": (0, 5), **kw})


@pytest.fixture(scope="module")
def result(data: Path):
    return locomo.run(data, _options(samples=4), counter=ScriptEstimator(), progress=False)


@pytest.mark.slow
def test_json_shape(result) -> None:
    assert result["kind"] == "kioku.eval.locomo/2"
    assert result["questions"] == 2 * SESSIONS  # category 5 is left out
    assert result["age_buckets"] == ["0-2", "3-5", "6-9", "10-14", "15-19", "20+"]
    assert result["arms"] == [
        "generational",
        "generational-norecall",
        "rolling",
        "rolling+recall",
        "rolling-long",
        "truncation",
        "retrieval",
    ]
    assert result["reference"] == "full"
    keys = {"answer_in_context", "f1", "bag_of_words", "by_age", "old", "context_tokens"}
    for s in result["strategies"].values():
        for part in (s, s["dev"], s["heldout"]):
            assert keys | {"by_category", "old_f1", "old_bag_of_words", "prompt"} <= set(part)
            assert set(part["by_age"]) <= set(result["age_buckets"])
        assert s["dev"]["questions"] == s["heldout"]["questions"] == SESSIONS
        assert s["old_questions"] == 2 * 10  # sessions 1..10 are 10+ sessions before session 20
    assert [c["split"] for c in result["conversations"]] == ["dev", "heldout"]
    assert result["pins"]["data"]["sha256"]


@pytest.mark.slow
def test_the_arithmetic(result) -> None:
    s = result["strategies"]
    assert s["full"]["answer_in_context"] == 1.0  # everything kept, every answer verbatim
    assert s["truncation"]["old"] == 0.0  # the window holds only the last sessions
    assert s["truncation"]["by_age"]["0-2"] == 1.0
    # archive recall finds old evidence the memory folded away
    assert s["generational"]["old"] > s["truncation"]["old"]
    assert s["generational"]["old"] >= s["rolling"]["old"]
    assert s["generational"]["old"] >= s["generational-norecall"]["old"]
    assert s["rolling+recall"]["old"] >= s["rolling"]["old"]
    # each answer is in exactly one turn, which the question names: retrieval finds them all
    assert s["retrieval"]["answer_in_context"] == 1.0
    for name in result["arms"]:
        assert s[name]["context_tokens_max"] + 256 <= 2048, name
        for split in ("dev", "heldout"):
            d = s[name][split]
            # strict ≤ bag of words; F1 is 1.0 on every strict hit
            assert d["answer_in_context"] <= d["bag_of_words"] + 1e-9
            assert d["f1"] >= d["answer_in_context"] - 1e-9
    assert s["full"]["context_tokens"] > 2048
    # rates are means of the rows: dev and heldout average to the whole here (same sizes)
    g = s["generational"]
    assert g["answer_in_context"] == pytest.approx(
        (g["dev"]["answer_in_context"] + g["heldout"]["answer_in_context"]) / 2, abs=1e-3
    )


@pytest.mark.slow
def test_the_diagnosis_says_where_answers_come_from(result) -> None:
    d = result["diagnosis"]["dev"]
    gen = d["sources"]["generational"]["old"]
    assert gen["hits"] > 0
    # every hit is found somewhere, and "only" in at most one part
    assert max(gen["memory"], gen["raw"], gen["recall"]) > 0
    assert gen["only_memory"] + gen["only_raw"] + gen["only_recall"] <= 1.0 + 1e-9
    assert d["sources"]["generational-norecall"]["all"]["recall"] == 0.0
    assert d["sources"]["truncation"]["all"]["only_raw"] == 1.0
    v = d["vs_retrieval"]["truncation"]
    assert v["only_other"] > 0 and v["questions"] == SESSIONS
    lost = v["lost"]
    assert sum(lost["by_evidence_rank"].values()) == v["only_other"]
    assert lost["evidence_in"] == {"nowhere": v["only_other"]}  # the window never had it
    ranks = d["evidence_rank"]["retrieval"]
    assert ranks["1-3"]["questions"] == SESSIONS and ranks["1-3"]["hit"] == 1.0
    prompt = result["strategies"]["generational"]["dev"]["prompt"]
    assert prompt["memory"] > 0 and prompt["recollections"] > 0
    assert prompt["unused"] >= 0
    m = result["margins"]["heldout"]
    assert set(m) >= {"minus_retrieval", "minus_truncation", "share_of_full"}


@pytest.mark.slow
def test_samples_show_each_arm_around_the_answer(result) -> None:
    samples = result["samples"]
    assert len(samples) == 4  # two per conversation
    s = samples[0]
    assert {"question", "answer", "evidence", "evidence_rank", "arms"} <= set(s)
    full = s["arms"]["full"]
    assert full["strict"] and full["found_in"] == ["raw"]
    assert normalize(s["answer"]) in full["around"]


def test_a_prompt_over_the_budget_is_an_error_not_a_row(data: Path) -> None:
    t = load_locomo(data, 0)
    questions = locomo.questions_of(t, 0, limit=1)
    assert questions[0].evidence == (2,)  # D1:3, the third message

    class Greedy:
        name = "truncation"

        def context(self, q: str) -> Context:
            return Context(self.name, (ChatMessage("user", q),), q, tokens=10_000)

    conv = locomo.ConversationRun(0, t, questions)
    with pytest.raises(ContextOverflow, match="exceeds the budget"):
        conv.ask({"truncation": Greedy()}, get_profile("local-64k", 2048), None, lambda: None)
    assert conv.rows == []


@pytest.mark.slow
def test_plot_and_report(result, tmp_path: Path) -> None:
    png = answer_by_age(result, tmp_path / "locomo.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    md = markdown(result)
    assert "## Dev (conversations 0–4)" in md and "## Held out (5–9)" in md
    assert "| strategy | strict | f1 | bag |" in md
    assert "What each arm loses against retrieval (dev)" in md


def _answerer(r: ChatRequest) -> str:
    system = r.messages[0].content
    text = "\n".join(m.content for m in r.messages)
    if "You grade answers" in system:
        gold = re.search(r"Gold answer: (.*)", text)
        given = re.search(r"Answer given: (.*)", text)
        assert gold and given
        return json.dumps({"correct": gold.group(1) == given.group(1)})
    q = re.search(r"at the (\w+) market\?", r.messages[-1].content)
    assert q is not None
    m = re.search(rf"At the {q.group(1)} market I bought a kite called (Zorblat\w+)", text)
    return m.group(1) if m else "unknown"


def test_with_a_model_answers_are_scored_by_f1_and_judge(data: Path) -> None:
    model = ScriptedModel(default=_answerer)
    judge = ScriptedModel(default=_answerer, name="judge")
    r = locomo.run(
        data,
        _options(conversations=(0,), strategies=("truncation", "full")),
        counter=ScriptEstimator(),
        models=locomo.Models(answer=model, judge=judge),
        progress=False,
    )
    full, trunc = r["strategies"]["full"], r["strategies"]["truncation"]
    assert full["answer_f1"] == 1.0 and full["judge"] == 1.0
    assert trunc["answer_f1_old"] == 0.0 and trunc["judge"] < 1.0
    assert len(model.history) == 2 * SESSIONS and len(judge.history) == 2 * SESSIONS
    asked = model.history[0].messages[-1].content
    assert "Question about the conversation so far: What kite did Ann buy" in asked
    assert r["pins"]["models"] == {"answer": {"name": "scripted"}, "judge": {"name": "judge"}}


@pytest.mark.slow
def test_cli(data: Path, tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    png = tmp_path / "out.png"
    res = CliRunner().invoke(
        app,
        [
            "eval", "locomo", "--data", str(data), "--budget", "2048", "--conversations", "5",
            "--strategies", "generational,truncation", "--json", "--plot", str(png),
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["strategies"]) == {"generational", "truncation"}
    assert "dev" not in out["strategies"]["generational"]
    assert png.exists()
    res = CliRunner().invoke(
        app, ["eval", "locomo", "--data", str(data), "--strategies", "generational,bogus"]
    )
    assert res.exit_code != 0 and "bogus" in str(res.exception)


def test_the_cli_default_is_every_headline_arm() -> None:
    assert HEADLINE_DEFAULT.split(",") == list(HEADLINE)


def test_evidence_age() -> None:
    assert locomo.evidence_age(["D3:5", "D7:1"], 20) == 13
    assert locomo.evidence_age(["D:11:26"], 20) is None  # a malformed id names no session
    assert locomo.evidence_age([], 20) is None
    assert locomo.age_bucket(0) == "0-2" and locomo.age_bucket(25) == "20+"


@pytest.mark.slow
def test_a_replay_that_starts_later_keeps_the_questions_and_loses_what_came_before(
    data: Path,
) -> None:
    # three sessions of twelve messages: the folds fall elsewhere for kioku
    r = locomo.run(
        data,
        _options(strategies=("generational", "retrieval", "full"), start_at=36, samples=0),
        counter=ScriptEstimator(),
        progress=False,
    )
    assert r["start_at"] == 36
    assert r["questions"] == 2 * SESSIONS  # the questions stay
    s = r["strategies"]
    # what sessions 1-3 said is gone for every arm, the reference too
    assert s["full"]["answer_in_context"] == pytest.approx((SESSIONS - 3) / SESSIONS)
    for arm in ("generational", "retrieval"):
        assert s[arm]["answer_in_context"] <= s["full"]["answer_in_context"]


def _phase(start: int, dev: float | None, heldout: float) -> dict:
    return {
        "start_at": start,
        "budget": 4096,
        "arms": ["generational", "retrieval"],
        "margins": {
            "dev": {"minus_retrieval": dev},
            "heldout": {"minus_retrieval": heldout, "share_of_full": 0.9},
        },
        "strategies": {
            "generational": {
                "dev": {"answer_in_context": 0.4},
                "heldout": {"answer_in_context": 0.5},
            },
            "retrieval": {"heldout": {"answer_in_context": 0.48}},
        },
    }


def test_phases_read_each_margin_as_its_mean_and_its_worst() -> None:
    out = phases.summarize([_phase(0, 0.01, 0.03), _phase(8, None, 0.01), _phase(16, 0.02, 0.02)])
    assert out["start_at"] == [0, 8, 16]
    assert out["margins_mean"]["heldout"] == {"minus_retrieval": 0.02, "share_of_full": 0.9}
    assert out["margins_min"]["heldout"]["minus_retrieval"] == 0.01
    # a margin one phase could not measure is no mean at all, not the mean of the others
    assert "dev" not in out["margins_mean"] and "dev" not in out["margins_min"]
    assert out["phases"][1]["answer_in_context"]["retrieval"] == {"heldout": 0.48}


@pytest.mark.slow
def test_phases_are_whole_runs_from_each_start(data: Path) -> None:
    opts = _options(strategies=("generational", "retrieval"), samples=3)
    out = phases.over_phases(data, opts, [0, 36], counter=ScriptEstimator(), progress=False)
    alone = locomo.run(
        data, replace(opts, start_at=36, samples=0), counter=ScriptEstimator(), progress=False
    )
    assert out["kind"] == "locomo-phases" and out["start_at"] == [0, 36]
    assert out["phases"][1]["margins"] == alone["margins"]
    both = [p["margins"]["heldout"]["minus_retrieval"] for p in out["phases"]]
    assert out["margins_mean"]["heldout"]["minus_retrieval"] == pytest.approx(
        sum(both) / 2, abs=1e-4
    )
    assert out["margins_min"]["heldout"]["minus_retrieval"] == min(both)


@pytest.mark.slow
def test_the_cli_reads_phases_and_refuses_what_they_cannot_mean(data: Path, tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    base = ["eval", "locomo", "--data", str(data), "--budget", "2048", "--conversations", "5"]
    base += ["--strategies", "generational,retrieval"]
    res = CliRunner().invoke(app, [*base, "--phases", "0,24", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["start_at"] == [0, 24]
    for extra, said in (
        (["--phases", "0,24", "--start-at", "8"], "--start-at"),
        (["--phases", "0,24", "--plot", str(tmp_path / "p.png")], "--plot"),
        (["--phases", "0,x"], "0,x"),
        (["--phases", "0,-8"], "0,-8"),
        (["--phases", ","], "one or more"),
    ):
        res = CliRunner().invoke(app, [*base, *extra])
        assert res.exit_code != 0 and said in str(res.exception), (extra, res.output)
