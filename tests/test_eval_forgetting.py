from __future__ import annotations

import json
import re

import pytest

from kioku.datasets import Transcript
from kioku.eval import forgetting
from kioku.eval.plots import forgetting_curve
from kioku.eval.report import markdown
from kioku.messages import Message
from kioku.models import ChatRequest, ScriptedModel
from kioku.profiles import get_profile
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator

PAIRS = 200


def keyed(pairs: int = PAIRS) -> Transcript:
    """Every user message plants one key → value; the answer to "what is key k" is in exactly
    one message, so which strategy still holds it is known exactly."""
    msgs = []
    for i in range(pairs):
        msgs.append(
            Message.user(
                f"Note {i}: key k{i:04d} is value v{i:04d}. The harbour was quiet today.", "Ren"
            )
        )
        msgs.append(Message.assistant(f"Noted, and the tea is ready. ({i})", author="Mina"))
    return Transcript(
        messages=tuple(msgs),
        meta=tuple({} for _ in msgs),
        user="Ren",
        character="Mina",
        system_prompt="You are Mina, who runs a tea shop.",
    )


def _text(r: ChatRequest) -> str:
    return "\n".join(m.content for m in r.messages)


def brain(r: ChatRequest) -> str:
    """Question writer, answerer and judge in one scripted model, chosen by the prompt."""
    system = r.messages[0].content
    if "You write a quiz" in system:
        keys = sorted(set(re.findall(r"k\d{4}", r.messages[1].content)))
        pick = [keys[round(j * (len(keys) - 1) / 7)] for j in range(8)]
        qs = [{"question": f"What is the value of key {k}?", "answer": "v" + k[1:]} for k in pick]
        return json.dumps({"questions": qs})
    if "You answer questions" in system:
        k = re.search(r"key (k\d{4})\?", r.messages[-1].content)
        assert k is not None
        m = re.search(rf"{k.group(1)} is value (v\d{{4}})", _text(r))
        return m.group(1) if m else "unknown"
    if "You grade answers" in system:
        gold = re.search(r"Gold answer: (.*)", r.messages[-1].content)
        given = re.search(r"Answer given: (.*)", r.messages[-1].content)
        assert gold and given
        return json.dumps({"correct": gold.group(1).strip() == given.group(1).strip()})
    raise AssertionError(f"unexpected request: {system[:80]}")


def _run(model: ScriptedModel, **kw):
    counter = ScriptEstimator()
    kw.setdefault("min_segment_tokens", 300)
    return forgetting.run(
        keyed(),
        model=model,
        counter=counter,
        profile=get_profile("local-64k", 4096),
        summarizer=ExtractiveSummarizer(counter),
        progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def result():
    model = ScriptedModel(default=brain)
    return model, _run(model, repeats=2, seed=7)


@pytest.mark.slow
def test_json_shape_and_pins(result) -> None:
    model, r = result
    assert r["kind"] == "kioku.eval.forgetting/1"
    assert r["failed_segments"] == 0
    segs = r["segments"]
    assert len(segs) >= 3
    assert segs[0]["first_seq"] == 0 and segs[-1]["tail"]
    for a, b in zip(segs, segs[1:], strict=False):
        assert b["first_seq"] == a["last_seq"] + 1  # contiguous, oldest first
    assert all(len(s["questions"]) == 8 for s in segs)
    assert set(r["strategies"]) == {"generational", "rolling", "rolling-long", "truncation", "full"}
    for s in r["strategies"].values():
        assert len(s["recall_per_segment"]) == len(segs)
        assert set(s["spread"]) == {"mean_recall", "memory_tokens", "memory_chars"}
        assert len(s["repeats"]) == 2
        assert s["spread"]["mean_recall"]["std"] == 0.0  # extractive: the same memory twice
    pins = r["pins"]
    assert pins["kioku_version"] and "commit" in pins["git"]
    assert pins["prompts"]["questions"] == "eval-questions-v1"
    assert pins["seed"] == 7 and pins["repeats"] == 2
    assert pins["profile"]["window"] == 4096
    assert pins["models"]["judge"] == {"name": "scripted"}


@pytest.mark.slow
def test_full_context_scores_one_and_truncation_zero_on_what_it_dropped(result) -> None:
    _, r = result
    full = r["strategies"]["full"]
    assert full["mean_recall"] == 1.0
    assert full["recall_per_segment"] == [1.0] * len(r["segments"])
    trunc = r["strategies"]["truncation"]["recall_per_segment"]
    assert trunc[0] == 0.0 and trunc[-1] == 1.0
    assert trunc == sorted(trunc)  # the window only holds the newest
    assert r["strategies"]["truncation"]["memory_tokens"] == 0
    gen = r["strategies"]["generational"]
    assert gen["memory_tokens"] > 0 and gen["memory_chars"] > 0
    assert gen["recall_per_segment"][-1] == 1.0


@pytest.mark.slow
def test_every_request_was_what_the_prompts_say(result) -> None:
    model, r = result
    questions = [h for h in model.history if "You write a quiz" in h.messages[0].content]
    assert len(questions) == len(r["segments"])  # once, not per repeat
    first = questions[0].messages[-1].content
    assert f"messages #0–#{r['segments'][0]['last_seq']}" in first
    assert "#0 · Ren (user)" in first and "Write the 8 questions" in first
    answers = [h for h in model.history if "You answer questions" in h.messages[0].content]
    assert len(answers) == 8 * len(r["segments"]) * 5 * 2
    assert all(h.messages[-1].content.rstrip().endswith("reply exactly: unknown") for h in answers)
    assert all(h.extra.get("seed") in (7, 8) for h in answers)
    judged = [h for h in model.history if "You grade answers" in h.messages[0].content]
    assert len(judged) == len(answers)
    assert "Gold answer: v0000" in "\n".join(h.messages[-1].content for h in judged)
    # answers only see the strategy's context: the card is reference, not the system prompt
    assert all(
        h.messages[0].role == "system" and "tea shop" in h.messages[0].content for h in answers
    )


@pytest.mark.slow
def test_plot_and_report(result, tmp_path) -> None:
    _, r = result
    png = forgetting_curve(r, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = markdown(r)
    assert "| generational |" in md and "Forgetting curve" in md


def test_bad_question_json_is_retried_with_the_reason() -> None:
    model = ScriptedModel(["here you go: not json"], default=brain)
    r = _run(model, strategies=["generational", "truncation"], min_segment_tokens=100000)
    assert r["failed_segments"] == 0
    retry = model.history[1]
    assert retry.messages[-2].content == "here you go: not json"
    assert "could not be used" in retry.messages[-1].content
    assert r["segments"][0]["attempts"] == 2


def test_unusable_questions_are_reported_not_dropped() -> None:
    def stubborn(r: ChatRequest) -> str:
        if "You write a quiz" in r.messages[0].content:
            return json.dumps({"questions": [{"question": "only one?", "answer": "yes"}]})
        return brain(r)

    logged: list[str] = []
    r = _run(
        ScriptedModel(default=stubborn),
        strategies=["generational", "truncation"],
        min_segment_tokens=100000,
        log=logged.append,
    )
    assert r["failed_segments"] == len(r["segments"]) >= 1
    assert "expected exactly 8 questions" in r["segments"][0]["error"]
    assert any("no questions" in x for x in logged)
    assert r["strategies"]["truncation"]["mean_recall"] is None


def test_with_a_model_and_no_summarizer_the_llm_chronicler_writes_memory() -> None:
    def busy(r: ChatRequest) -> str:
        if r.purpose == "eval":
            return brain(r)
        return "I would rather not."  # the chronicler's guards refuse it; extractive fallback

    model = ScriptedModel(default=busy)
    counter = ScriptEstimator()
    r = forgetting.run(
        keyed(140),
        model=model,
        counter=counter,
        profile=get_profile("local-64k", 4096),
        strategies=["generational", "full"],
        min_segment_tokens=100000,
        progress=False,
    )
    assert r["pins"]["summarizer"].startswith("LLMChronicler")
    assert any(h.purpose == "chapter" for h in model.history)
    assert r["strategies"]["generational"]["repeats"][0]["fallbacks"] >= 1
    assert r["strategies"]["full"]["mean_recall"] == 1.0
