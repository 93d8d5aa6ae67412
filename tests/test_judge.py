"""The seam for content support (`kioku.grounding.check.Judge`): the word reader is the default and
gives today's verdicts on the whole corpus; the n-gram and the model's judges answer in its
place; `kioku bench judge` measures them on labelled cases."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kioku.bench.judge import CONTENT_RULES, case_evidence, case_statement, run
from kioku.cli import app, register_extensions
from kioku.grounding.asked import Asked
from kioku.grounding.check import WORD_READER, Evidence, Piece, Source, Statement, Verdict
from kioku.grounding.ngrams import Ngrams, grams
from kioku.models import ScriptedModel
from tests.cases.corpus import cases

register_extensions()
CORPUS = list(cases("grounding"))


class Recording:
    """A judge that asks another and keeps every line it was asked about."""

    def __init__(self, inner: Any, name: str = "recording") -> None:
        self.inner, self.name = inner, name
        self.lines: list[str] = []

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        self.lines.append(line.text)
        return self.inner(line, sources, ev)  # type: ignore[no-any-return]


class Never:
    name = "never"

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        return Verdict("unsupported", detail="never")


def test_the_word_reader_is_the_default_and_decides_the_corpus_as_labelled() -> None:
    assert case_evidence(CORPUS[0]).judge is WORD_READER
    for case in CORPUS:
        recording = Recording(WORD_READER)
        default = case_evidence(case).check(case_statement(case))
        assert case_evidence(case, recording).check(case_statement(case)) == default
        if not case.get("known"):
            assert (default.reason or "ok") == case["verdict"], case["id"]
        asked = bool(recording.lines)
        if case["rule"] in CONTENT_RULES and not case.get("verbatim"):
            assert asked, case["id"]  # content decided these: the judge was asked
        if case["rule"] in ("seq", "prompt", "name", "empty") and not case.get("known"):
            assert not asked, case["id"]  # the rules before it decided these


def test_another_judge_decides_content_and_only_content() -> None:
    for case in CORPUS:
        got = case_evidence(case, Never()).check(case_statement(case))
        if case["rule"] in ("seq", "prompt", "name", "empty") and not case.get("known"):
            assert got.reason == case["rule"], case["id"]
        if case["rule"] == "grounded" and not case.get("known") and not case.get("verbatim"):
            assert got.reason == "unsupported" and got.detail == "never", case["id"]


def _one(lang: str, author: str, said: str, line: str) -> Verdict:
    src = Source(1, author, "user", (Piece("text", author, said),))
    ev = Evidence({1: src}, lang, (author,), judge=Ngrams())
    return ev.check(Statement("line", line, (1,)))


@pytest.mark.parametrize(
    ("lang", "author", "said", "kept", "dropped"),
    [
        (
            "en",
            "Mika",
            "I adopted a puppy named Biscuit last week!",
            "Mika adopted a puppy named Biscuit.",
            "Mika bought a red sports car yesterday.",
        ),
        (
            "ja",
            "ミカ",
            "昨日、妹と京都の金閣寺に行ってきました。",
            "ミカは妹と京都の金閣寺に行ってきた。",
            "ミカは駅前で蕎麦を食べた。",
        ),
        (
            "zh",
            "小美",
            "我上周在北京买了一只小狗。",
            "小美在北京买了一只小狗。",
            "小美在家里卖了一辆汽车。",
        ),
        (
            "ko",
            "미카",
            "지난주에 강아지를 입양했어요.",
            "미카는 지난주에 강아지를 입양했어요",
            "미카는 고양이를 샀다",
        ),
    ],
)
def test_ngrams_keep_a_faithful_line_and_drop_an_invented_one_in_every_language(
    lang: str, author: str, said: str, kept: str, dropped: str
) -> None:
    ok = _one(lang, author, said, kept)
    assert ok.ok and ok.kind == "text" and ok.seq == 1  # where: the word reader's part
    assert _one(lang, author, said, dropped).reason == "unsupported"


def test_ngrams_pair_unspaced_writing_and_want_every_number() -> None:
    assert grams("金閣寺") == {"金閣", "閣寺"}
    assert " pu" in grams("Puppy") and "a" not in "".join(grams("a puppy"))
    got = _one(
        "en", "Mika", "I walked 5 miles with the puppy", "Mika walked 6 miles with the puppy"
    )
    assert got.reason == "unsupported" and "6" in got.detail


def _asked(*replies: str) -> tuple[Asked, ScriptedModel]:
    model = ScriptedModel(list(replies))
    return Asked(model), model


def test_the_model_is_shown_the_line_and_its_sources_and_its_yes_or_no_decides() -> None:
    judge, model = _asked("Yes.", "**No** — it was a puppy", "I cannot tell from this.")
    src = Source(1, "Mika", "user", (Piece("text", "Mika", "I adopted a puppy named Biscuit!"),))
    ev = Evidence({1: src}, "en", ("Mika",), judge=judge)
    assert ev.check(Statement("line", "Mika adopted a puppy named Biscuit.", (1,))).ok
    no = ev.check(Statement("line", "Mika adopted a kitten named Biscuit.", (1,)))
    assert no.reason == "unsupported" and "model" in no.detail
    # no answer word: the word reader decides (a kitten for a puppy is 0.8 of the terms: kept)
    unclear = ev.check(Statement("line", "Mika adopted a kitten named Biscuit.", (1,)))
    assert unclear == ev.read(
        Statement("line", "Mika adopted a kitten named Biscuit.", (1,)), [src]
    )
    assert (judge.asked, judge.unclear) == (3, 1)
    prompts = model.prompts("judge")
    assert len(prompts) == 3
    assert "#1 Mika: I adopted a puppy named Biscuit!" in prompts[0]
    assert "Line: Mika adopted a puppy named Biscuit." in prompts[0]
    assert "kitten" in prompts[1] and model.history[0].temperature == 0.0


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("yes", True),
        ("YES", True),
        ("No.", False),
        ("Answer: no", False),
        ("yes, though no date is given", True),
        ("yesterday", None),
        ("nothing", None),
        ("", None),
        ("maybe", None),
    ],
)
def test_the_answer_is_the_first_answer_word_and_garbage_is_none(
    reply: str, answer: bool | None
) -> None:
    assert _asked()[0].answer(reply) is answer


def test_a_line_naming_its_writer_is_shown_with_it() -> None:
    judge, model = _asked("yes")
    src = Source(2, "Aki", "assistant", (Piece("speech", "Aki", "Oh wow, what breed is he?"),))
    req = judge.request(Statement("claim", "what breed is he", (2,), author="Aki"), [src])
    assert "Line: Aki: what breed is he" in req.messages[1].content
    assert req.purpose == "judge" and req.max_tokens == 8


def _case(
    line: str, said: str, verdict: str, rule: str, lang: str = "en", who: str = "Mika"
) -> dict[str, Any]:
    return {
        "lang": lang,
        "line": line,
        "seqs": [1],
        "users": [who],
        "sources": [{"seq": 1, "author": who, "role": "user", "text": said}],
        "verdict": verdict,
        "rule": rule,
    }


def test_bench_judge_prints_each_judges_figures_as_json(tmp_path: Path) -> None:
    said = "I adopted a puppy named Biscuit last week!"
    rows = [
        _case("Mika adopted a puppy named Biscuit.", said, "ok", "grounded"),
        _case("Mika bought a red sports car.", said, "unsupported", "unsupported"),
        _case("Mika adopted a kitten named Biscuit.", said, "unsupported", "unsupported"),
        _case("Zorro adopted a puppy.", said, "name", "name"),
        _case(
            "ミカは子犬を飼い始めた。", "先週子犬を飼い始めました！", "ok", "grounded", "ja", "ミカ"
        ),
    ]
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    r = CliRunner().invoke(app, ["bench", "judge", "--cases", str(path), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["cases"], got["content_cases"]) == (5, 4)
    assert set(got["judges"]) == {"words", "ngrams@0.6", "ngrams@0.7"}
    words = got["judges"]["words"]
    # the word reader keeps the kitten (0.8 of the terms): one unsupported line missed
    assert {k: words["content"][k] for k in ("cases", "tp", "fp", "fn", "tn")} == {
        "cases": 4,
        "tp": 1,
        "fp": 0,
        "fn": 1,
        "tn": 2,
    }
    assert (words["content"]["precision"], words["content"]["recall"]) == (1.0, 0.5)
    assert words["all"]["cases"] == 5 and words["all"]["tp"] == 2
    assert set(words["content"]["by_lang"]) == {"en", "ja"}
    assert words["content"]["wrong"] == ["g.jsonl:3 (en): Mika adopted a kitten named Biscuit."]


def test_bench_judge_measures_a_model_judge_and_counts_its_questions(tmp_path: Path) -> None:
    said = "I adopted a puppy named Biscuit last week!"
    path = tmp_path / "g.jsonl"
    rows = [
        _case("Mika adopted a puppy named Biscuit.", said, "ok", "grounded"),
        _case("Mika adopted a kitten named Biscuit.", said, "unsupported", "unsupported"),
        _case("Zorro adopted a puppy.", said, "name", "name"),
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    judge, model = _asked("yes", "no")
    got = run([path], [judge])["judges"]["model"]
    assert got["content"]["accuracy"] == 1.0 and got["all"]["accuracy"] == 1.0
    assert (got["asked"], got["unclear"]) == (2, 0)  # the name rule decided the third
    assert got["version"] == "judge-en-v1" and model.pending == 0
