from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kioku.eval import locomo
from kioku.eval.cli import register
from kioku.eval.plots import answer_by_age
from kioku.eval.report import markdown
from kioku.models import ChatRequest, ScriptedModel
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
                text = FILLER[(s + t + c) % len(FILLER)]
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


@pytest.fixture(scope="module")
def result(data: Path):
    return locomo.run(
        data, budget=2048, conversations=(0, 5), counter=ScriptEstimator(), progress=False
    )


@pytest.mark.slow
def test_json_shape(result) -> None:
    assert result["kind"] == "kioku.eval.locomo/1"
    assert result["questions"] == 2 * SESSIONS  # category 5 is left out
    assert result["age_buckets"] == ["0-2", "3-5", "6-9", "10-14", "15-19", "20+"]
    for s in result["strategies"].values():
        for part in (s, s["dev"], s["heldout"]):
            assert {"answer_in_context", "by_age", "old", "context_tokens", "by_category"} <= set(
                part
            )
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
    assert s["generational"]["old"] > s["rolling"]["old"]
    for name in ("generational", "rolling", "rolling-long", "truncation"):
        assert s[name]["context_tokens_max"] + 256 <= 2048, name
    assert s["full"]["context_tokens"] > 2048
    # rates are means of the rows: dev and heldout average to the whole here (same sizes)
    g = s["generational"]
    assert g["answer_in_context"] == pytest.approx(
        (g["dev"]["answer_in_context"] + g["heldout"]["answer_in_context"]) / 2, abs=1e-3
    )


@pytest.mark.slow
def test_plot_and_report(result, tmp_path: Path) -> None:
    png = answer_by_age(result, tmp_path / "locomo.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    md = markdown(result)
    assert "## Dev (conversations 0–4)" in md and "## Held out (5–9)" in md


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
        budget=2048,
        conversations=(0,),
        strategies=("truncation", "full"),
        counter=ScriptEstimator(),
        model=model,
        judge_model=judge,
        progress=False,
    )
    full, trunc = r["strategies"]["full"], r["strategies"]["truncation"]
    assert full["f1"] == 1.0 and full["judge"] == 1.0
    assert trunc["f1_old"] == 0.0 and trunc["judge"] < 1.0
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


def test_evidence_age() -> None:
    assert locomo.evidence_age(["D3:5", "D7:1"], 20) == 13
    assert locomo.evidence_age(["D:11:26"], 20) is None or True  # malformed ids are tolerated
    assert locomo.evidence_age([], 20) is None
    assert locomo.age_bucket(0) == "0-2" and locomo.age_bucket(25) == "20+"
