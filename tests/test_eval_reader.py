"""`kioku eval locomo --reader`: a scripted OpenAI-compatible reader (httpx.MockTransport) that
records every request and answers from what the prompt holds, so each arm's prompt, the
scoring, the sampling and the order the reader sees the prompts in are all checked without a
real model."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from kioku.client import OpenAIChatModel
from kioku.datasets import load_locomo
from kioku.errors import InputError
from kioku.eval import reader as rd
from kioku.eval.answers import locomo_f1, reply_strict, says_not_known
from kioku.eval.baselines import RECALLED_HEADER
from kioku.eval.cli import register
from kioku.eval.locomo import Question, questions_of
from kioku.eval.report import markdown
from kioku.eval.strategies import fit_profile
from kioku.profiles import get_profile
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator

SESSIONS = 12
CUES = ["amber", "birch", "cedar", "delta", "ember", "fjord", "garnet", "harbor"]
CUES += ["indigo", "juniper", "kestrel", "lotus"]
FILLER = [
    "The weather was mild and the park was crowded with families walking their dogs.",
    "Work has been busy, lots of meetings and emails, but the weekend is close.",
    "I tried a new recipe for dinner and it turned out better than expected.",
    "We should plan something fun for the holidays, maybe a short trip somewhere.",
    "Traffic this morning was terrible, it took an hour to get across town.",
]
BUDGET = 2048
ASK = re.compile(r"What kite did Ann buy at the (\w+) (market|fair)\?")


def write_data(path: Path, conversations: int = 6) -> Path:
    """LoCoMo-shaped: one planted kite per session, a question of categories 1-4 on each, and an
    adversarial one (category 5) on every third session about a fair nobody mentions."""
    data = []
    for c in range(conversations):
        conv: dict = {"speaker_a": "Ann", "speaker_b": "Bob"}
        qa: list[dict[str, Any]] = []
        for s in range(1, SESSIONS + 1):
            cue = CUES[s - 1]
            turns = []
            for t in range(10):
                text = FILLER[(s + t + c) % len(FILLER)]
                if t == 2:
                    text = f"At the {cue} market I bought a kite called Zorblat{c}x{s}."
                who = "Ann" if t % 2 == 0 else "Bob"
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
            if s % 3 == 0:
                qa.append(
                    {
                        "question": f"What kite did Ann buy at the {cue} fair?",
                        "adversarial_answer": f"Zorblat{c}x{s}",
                        "evidence": [f"D{s}:3"],
                        "category": 5,
                    }
                )
        data.append({"sample_id": f"conv-{c}", "conversation": conv, "qa": qa})
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


class FakeReader:
    """An OpenAI-compatible server that answers from the prompt it is sent: the kite planted at
    the market the question names, when the prompt shows it, else "not mentioned"."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        messages = body["messages"]
        text = "\n".join(m["content"] for m in messages)
        asked = ASK.search(messages[-1]["content"])
        reply = "Not mentioned in the conversation."
        if asked and asked.group(2) == "market":
            found = re.search(rf"{asked.group(1)} market I bought a kite called (\w+)", text)
            if found:
                reply = f"A kite called {found.group(1)}"
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 3},
            },
        )

    def model(self) -> OpenAIChatModel:
        return OpenAIChatModel("http://reader.test/v1", transport=httpx.MockTransport(self))

    def answers(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["max_tokens"] > 1]


class FakeJudge:
    """Grades a reply right when it holds the gold answer."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        user = json.loads(request.content)["messages"][-1]["content"]
        gold = re.search(r"Zorblat\d+x\d+", user)
        correct = bool(gold) and user.count(gold.group(0)) >= 2  # in the gold and the answer
        content = json.dumps({"correct": correct})
        return httpx.Response(
            200, json={"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}
        )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("reader") / "locomo.json")


def _options(**kw: Any) -> rd.ReaderOptions:
    return rd.ReaderOptions(**{"budget": BUDGET, "conversations": (0, 5), **kw})


@pytest.fixture(scope="module")
def run(data: Path) -> tuple[dict[str, Any], FakeReader]:
    fake = FakeReader()
    result = rd.run(
        data, _options(), reader=fake.model(), counter=ScriptEstimator(), progress=False
    )
    return result, fake


@pytest.fixture(scope="module")
def contexts(data: Path) -> Iterator[tuple[dict[str, Any], list[Question]]]:
    """Each arm of conversation 5, replayed to its end, and its questions."""
    t = load_locomo(data, 5)
    counter = ScriptEstimator()
    profile, _ = fit_profile(get_profile("local-64k", BUDGET))
    arms = rd.reader_arms(
        t,
        rd.READER_ARMS,
        profile=profile,
        counter=counter,
        summarizer=ExtractiveSummarizer(counter),
    )
    yield arms, questions_of(t, 5, categories=tuple(rd.ALL_CATEGORIES))
    for arm in arms.values():
        getattr(arm, "close", lambda: None)()


# the prompt each arm sends -----------------------------------------------------------------------


def test_every_prompt_ends_with_the_question_and_the_instruction(run) -> None:
    result, fake = run
    asked = fake.answers()
    assert len(asked) == result["questions"] * len(rd.READER_ARMS)
    for body in asked:
        last = body["messages"][-1]
        assert last["role"] == "user"
        question, instruction = last["content"].rsplit("\n", 1)
        assert instruction == rd.INSTRUCTION
        assert ASK.search(question.rsplit("\n", 1)[-1])  # the question is the line before it
        assert body["messages"][0]["role"] == "system"
        assert body["temperature"] == 0.0 and body["max_tokens"] == rd.MAX_TOKENS


def test_each_arm_lays_its_prompt_out_stable_part_first(contexts) -> None:
    arms, questions = contexts
    q1, q2 = questions[0], questions[-1]
    conversation_end = arms["truncation"].entries[-1].message.text
    long = "Tell me, after all these weeks of talking about kites, " * 3 + q2.text
    assert 3 * ScriptEstimator().count(q1.text) < ScriptEstimator().count(long) < rd.QUESTION_ROOM
    for name, arm in arms.items():
        a, b, c = arm.context(q1.text), arm.context(q2.text), arm.context(long)
        # everything before the question's message is the same for every question at one
        # state, short or long: the reader's prefix cache serves it
        assert a.before == b.before == c.before, name
        m = rd.reader_messages(a)
        assert m[:-1] == a.before
        assert m[-1].content.endswith(f"{q1.text}\n{rd.INSTRUCTION}")
    none = rd.reader_messages(arms["none"].context(q1.text))
    assert [x.role for x in none] == ["system", "user"]
    assert none[-1].content == f"{q1.text}\n{rd.INSTRUCTION}"
    gen = arms["generational"].context(q1.text)
    assert gen.parts()["memory"]  # the memory exchange follows the system prompt
    for name in ("truncation", "retrieval", "generational"):
        before = arms[name].context(q1.text).before
        assert before[-1].content.endswith(conversation_end), name  # the recent window last


def test_retrieval_puts_its_turns_after_the_window_before_the_question(contexts) -> None:
    arms, questions = contexts
    old = next(q for q in questions if q.text.endswith("amber market?"))
    ctx = arms["retrieval"].context(old.text)
    last = rd.reader_messages(ctx)[-1].content
    block, rest = last.split(f"\n\n{old.text}\n")
    assert block.startswith(RECALLED_HEADER)
    assert "amber market I bought a kite called Zorblat5x1" in block  # found by BM25
    assert "(1 May 2023) Ann: At the amber market" in block  # dated, with its author
    assert rest == rd.INSTRUCTION
    # none of the window's messages is repeated in the block, and the window is kept
    window = "\n".join(m.content for m in ctx.before[1:])
    assert "amber market" not in window
    assert ctx.tokens + rd.MAX_TOKENS <= BUDGET


# scoring -----------------------------------------------------------------------------------------


def test_locomo_f1_per_category_by_hand() -> None:
    # multi-hop: each gold item's best F1 over the reply's comma-separated items, averaged;
    # "and" is dropped: "painting and hiking" is [paint, hike] against [hike]: F1 2/3
    gold = "hiking, painting, swimming"
    assert locomo_f1("painting and hiking", gold, 1) == pytest.approx((2 / 3 + 2 / 3 + 0) / 3)
    assert locomo_f1("swimming, hiking, painting", gold, 1) == pytest.approx(1.0)
    # temporal: plain F1; the comma goes, "on" is one extra token: P 3/4, R 1
    assert locomo_f1("On 7 May, 2023", "7 May 2023", 2) == pytest.approx(6 / 7)
    # open-domain: the gold's first alternative only
    assert locomo_f1("yes", "Yes; she likes the outdoors", 3) == pytest.approx(1.0)
    assert locomo_f1("she likes the outdoors", "Yes; she likes the outdoors", 3) == 0.0
    # single-hop: articles and ASCII punctuation out, stems compared
    assert locomo_f1("The beaches.", "beach", 4) == pytest.approx(1.0)
    assert locomo_f1("Ann's kites", "anns kite", 4) == pytest.approx(1.0)
    assert locomo_f1("mountains", "beach", 4) == 0.0
    # adversarial: right only when the reply says the conversation does not tell
    assert locomo_f1("Not mentioned in the conversation.", "Eagles", 5) == 1.0
    assert locomo_f1("There is no information available.", "Eagles", 5) == 1.0
    assert locomo_f1("Eagles", "Eagles", 5) == 0.0
    assert locomo_f1("unknown", "Eagles", 5) == 0.0  # not one of LoCoMo's phrases
    assert says_not_known("NOT MENTIONED")


def test_strict_match_in_the_reply() -> None:
    assert reply_strict("A kite called Zorblat5x1", "Zorblat5x1", 4)
    assert not reply_strict("Zorblat", "Zorblat5x1", 4)
    assert reply_strict("swimming and hiking, also painting", "hiking, painting, swimming", 1)
    assert not reply_strict("hiking and painting", "hiking, painting, swimming", 1)
    assert reply_strict("Yes, she does.", "Yes; she likes the outdoors", 3)  # a verdict
    assert not reply_strict("No.", "Yes; she likes the outdoors", 3)
    assert reply_strict("On May 7th, 2023.", "7 May 2023", 2)  # dates in one form
    assert reply_strict("not mentioned", "Eagles", 5)
    assert not reply_strict("Eagles", "Eagles", 5)


def test_interval() -> None:
    assert rd.interval([1.0, 1.0, 1.0], seed=0) == {"mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 3}
    assert rd.interval([], seed=0)["n"] == 0
    coin = [0.0, 1.0] * 50
    a, b = rd.interval(coin, seed=3), rd.interval(coin, seed=3)
    assert a == b  # a fixed seed gives the same interval
    assert a["lo"] < 0.5 == a["mean"] < a["hi"]
    assert a["lo"] > 0.35 and a["hi"] < 0.65  # ~ ±1.96 · 0.05


def test_the_scores_follow_the_replies(run) -> None:
    result, _ = run
    answers = result["answers"]
    for a in answers:
        for name, r in a["arms"].items():
            want = locomo_f1(r["reply"], a["gold"], a["category"])
            assert r["f1"] == pytest.approx(want), (name, a["question"])
    held = result["scores"]["generational"]["heldout"]
    rows = [a["arms"]["generational"]["f1"] for a in answers if a["split"] == "heldout"]
    assert held["f1"]["mean"] == pytest.approx(sum(rows) / len(rows), abs=1e-4)
    # the scripted reader reads what the prompt holds: a sliding window loses the oldest third,
    # memory and recall keep some of it; no history answers no question but the adversarial
    s = result["scores"]
    asked = [a for a in answers if a["category"] != 5]
    assert all(a["arms"]["truncation"]["f1"] == 0.0 for a in asked if a["third"] == "oldest")
    # "A kite called X" against "X": kite, call, x against x — precision 1/3, recall 1
    assert all(a["arms"]["truncation"]["f1"] == 0.5 for a in asked if a["third"] == "newest")
    for split in ("dev", "heldout"):
        assert s["none"][split]["by_category"]["5"]["f1"]["mean"] == 1.0
        assert all(
            s["none"][split]["by_category"][c]["f1"]["mean"] == 0.0 for c in ("1", "2", "3", "4")
        )
        assert s["retrieval"][split]["by_age"]["oldest"]["f1"]["mean"] > 0.0
        assert s["none"][split]["not_known"]["mean"] == 1.0
        assert s["generational"][split]["by_category"]["5"]["not_known"]["mean"] == 1.0
    assert result["margins"]["heldout"]["none"]["mean"] > 0.0


# sampling and order ------------------------------------------------------------------------------


def _questions() -> list[Question]:
    out = []
    for c in range(1, 6):
        for pos in (0.1, 0.5, 0.9):
            for _ in range(4):
                out.append(
                    Question(5, len(out), "heldout", f"q{len(out)}", "a", c, 3, (1,), ("x",), pos)
                )
    return out


def test_sampling_is_even_over_categories_and_ages() -> None:
    qs = _questions()
    picked = rd.sample(qs, 15, seed=1)
    assert Counter(q.category for q in picked) == {c: 3 for c in range(1, 6)}
    for c in range(1, 6):  # one from each third within each category
        assert {rd.third(q.position) for q in picked if q.category == c} == set(rd.THIRDS)
    ten = rd.sample(qs, 10, seed=2)
    assert Counter(q.category for q in ten) == {c: 2 for c in range(1, 6)}
    for c in range(1, 6):
        assert len({rd.third(q.position) for q in ten if q.category == c}) == 2
    seven = rd.sample(qs, 7, seed=2)
    assert Counter(q.category for q in seven) == {1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
    # the next conversation's turns go on where this one stopped: the extras rotate
    after = rd.sample(qs, 7, seed=3, turn=7)
    assert Counter(q.category for q in after) == {1: 1, 2: 1, 3: 2, 4: 2, 5: 1}
    # deterministic by seed, in question order
    assert rd.sample(qs, 15, seed=1) == picked
    assert [q.number for q in picked] == sorted(q.number for q in picked)
    assert {q.number for q in rd.sample(qs, 15, seed=9)} != {q.number for q in picked}
    assert rd.sample(qs, None, seed=1) == qs
    # a category with too few questions gives its turns to the others
    few = [q for q in qs if q.category != 3 or q.number % 12 == 0]
    assert len(rd.sample(few, 20, seed=0)) == 20


def test_shares() -> None:
    assert rd.shares(60, (5, 6, 7, 8, 9)) == {5: 12, 6: 12, 7: 12, 8: 12, 9: 12}
    assert rd.shares(7, (0, 1, 2)) == {0: 3, 1: 2, 2: 2}


def test_third() -> None:
    assert [rd.third(p) for p in (0.0, 0.33, 0.34, 0.66, 0.67, 1.0)] == [
        "oldest",
        "oldest",
        "middle",
        "middle",
        "newest",
        "newest",
    ]
    assert rd.third(None) == rd.NO_EVIDENCE


def test_questions_are_asked_arm_by_arm_per_conversation(run) -> None:
    result, fake = run
    order = result["order"]
    # the reader got the prompts in exactly the scheduled order
    asked = [ASK.search(b["messages"][-1]["content"]).group(0) for b in fake.answers()]
    by_number = {(a["conversation"], a["number"]): a["question"] for a in result["answers"]}
    assert asked == [by_number[(c, n)] for c, _, n in order]
    # grouped: one conversation after the other, and within one each arm's questions together
    runs = [(c, arm) for c, arm, _ in order]
    blocks = [k for i, k in enumerate(runs) if i == 0 or runs[i - 1] != k]
    assert blocks == [(c, arm) for c in (0, 5) for arm in rd.READER_ARMS]
    # an arm's questions share its prefix: consecutive prompts of one arm differ only at the end
    answers = fake.answers()
    for i in range(1, len(order)):
        if runs[i] == runs[i - 1]:
            assert answers[i]["messages"][:-1] == answers[i - 1]["messages"][:-1], runs[i]
    # and what a one-slot server reads anew is the question's message alone within an arm, the
    # whole prompt at an arm's first question
    counter = ScriptEstimator()
    rows = {(a["conversation"], a["number"]): a for a in result["answers"]}
    for i, (c, arm, n) in enumerate(order):
        fresh = rows[(c, n)]["arms"][arm]["fresh_tokens"]
        messages = answers[i]["messages"]
        if i and runs[i] == runs[i - 1]:
            assert fresh == counter.count(messages[-1]["content"])
        else:  # another arm's prompt came before: at most the system prompt is shared
            whole = sum(counter.count(m["content"]) for m in messages)
            assert fresh in (whole, whole - counter.count(messages[0]["content"]))
    for arm in rd.READER_ARMS:
        cache = result["cache"][arm]
        assert 0 < cache["fresh_tokens"] <= cache["prompt_tokens"]
    assert (
        result["cache"]["truncation"]["fresh_tokens"] < result["cache"]["retrieval"]["fresh_tokens"]
    )


def test_sampled_run_spreads_questions_over_conversations(data: Path) -> None:
    fake = FakeReader()
    result = rd.run(
        data,
        _options(questions=9, arms=("truncation", "none"), seed=4),
        reader=fake.model(),
        counter=ScriptEstimator(),
        progress=False,
    )
    per = Counter(a["conversation"] for a in result["answers"])
    assert per == {0: 5, 5: 4}
    # 9 over five categories: every category twice but one, across both conversations
    assert sorted(Counter(a["category"] for a in result["answers"]).values()) == [1, 2, 2, 2, 2]
    assert len(fake.answers()) == 9 * 2
    again = rd.run(
        data,
        _options(questions=9, arms=("truncation", "none"), seed=4),
        reader=FakeReader().model(),
        counter=ScriptEstimator(),
        progress=False,
    )
    assert again["order"] == result["order"]


# the JSON ----------------------------------------------------------------------------------------


def test_json_shape(run) -> None:
    result, _ = run
    assert result["kind"] == "kioku.eval.reader/1"
    assert result["arms"] == list(rd.READER_ARMS)
    assert result["questions"] == len(result["answers"]) == 2 * (SESSIONS + SESSIONS // 3)
    assert result["questions_requested"] == "all"
    assert result["instruction"] == rd.INSTRUCTION
    for a in result["answers"]:
        assert {"conversation", "number", "split", "category", "third", "question", "gold"} <= set(
            a
        )
        assert set(a["arms"]) == set(rd.READER_ARMS)
        for r in a["arms"].values():
            assert {"reply", "f1", "strict", "prompt_tokens", "seconds"} <= set(r)
            assert r["server_prompt_tokens"] > 0
            assert "prompt_seconds" not in r and "judge" not in r
            assert r["prompt_tokens"] <= BUDGET
    for per in result["scores"].values():
        assert set(per) == {"dev", "heldout"}
        for d in per.values():
            assert set(d["by_category"]) == {"1", "2", "3", "4", "5"}
            assert set(d["by_age"]) == set(rd.THIRDS)
            for ci in (d["f1"], d["strict"], *(x["f1"] for x in d["by_age"].values())):
                assert ci["lo"] <= ci["mean"] <= ci["hi"] and ci["n"] > 0
    assert set(result["margins"]["heldout"]) == set(rd.READER_ARMS) - {"generational"}
    pins = result["pins"]
    assert pins["models"]["reader"]["name"] == "http://reader.test/v1"
    assert pins["scorer"]["stemmer"] in ("nltk-porter", "pystemmer-porter")
    assert pins["data"]["sha256"]
    assert "# LoCoMo answered by a reader" in markdown(result)


def test_time_on_and_judge(data: Path) -> None:
    fake = FakeReader()
    judge = OpenAIChatModel("http://judge.test/v1", transport=httpx.MockTransport(FakeJudge()))
    result = rd.run(
        data,
        _options(conversations=(5,), questions=6, arms=("truncation",), time_on=True),
        reader=fake.model(),
        judge=judge,
        counter=ScriptEstimator(),
        progress=False,
    )
    # each answer is preceded by the same prompt with one token out: its evaluation, timed
    pairs = list(zip(fake.requests[::2], fake.requests[1::2], strict=True))
    assert len(pairs) == 6
    for timing, answer in pairs:
        assert timing["max_tokens"] == 1 and answer["max_tokens"] == rd.MAX_TOKENS
        assert timing["messages"] == answer["messages"]
    for a in result["answers"]:
        r = a["arms"]["truncation"]
        assert r["prompt_seconds"] >= 0.0
        # a judge grades against the gold answer, which an adversarial question does not have
        assert ("judge" in r) == (a["category"] != 5)
        if "judge" in r:
            assert r["judge"] == ("Zorblat" in r["reply"])
    assert "judge" in result["scores"]["truncation"]["heldout"]


def test_a_reader_error_is_recorded_not_scored(data: Path) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "no"}})

    model = OpenAIChatModel("http://down.test/v1", transport=httpx.MockTransport(down))
    result = rd.run(
        data,
        _options(conversations=(5,), questions=2, arms=("none",)),
        reader=model,
        counter=ScriptEstimator(),
        progress=False,
    )
    for a in result["answers"]:
        assert "error" in a["arms"]["none"] and "f1" not in a["arms"]["none"]
    assert result["scores"]["none"]["heldout"]["errors"] == 2


def test_categories_of() -> None:
    assert rd.categories_of("5") == (5,)
    assert rd.categories_of("1-4") == (1, 2, 3, 4)
    assert rd.categories_of("adversarial, 1") == (1, 5)
    assert rd.categories_of("Temporal,2,temporal") == (2,)
    for bad in ("6", "0-2", "bogus", "4-", ",", ""):
        with pytest.raises(InputError, match="--categories"):
            rd.categories_of(bad)


def test_check_arms() -> None:
    assert rd.check_arms(["generational", "none"]) == ("generational", "none")
    for bad in ("full", "bogus"):
        with pytest.raises(Exception, match=bad):
            rd.check_arms([bad])


def test_cli(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeReader()

    def model(url: str, *args: Any, **kw: Any) -> OpenAIChatModel:
        assert url == "http://reader.test/v1"
        return OpenAIChatModel(url, *args, transport=httpx.MockTransport(fake), **kw)

    monkeypatch.setattr("kioku.client.OpenAIChatModel", model)
    app = typer.Typer()
    register(app)
    base = ["eval", "locomo", "--data", str(data), "--budget", str(BUDGET)]
    res = CliRunner().invoke(
        app,
        [*base, "--conversations", "5", "--questions", "4", "--seed", "1", "--json",
         "--strategies", "generational,retrieval"],
        env={"KIOKU_READER_URL": "http://reader.test/v1"},
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["kind"] == "kioku.eval.reader/1" and out["questions"] == 4
    assert out["arms"] == ["generational", "retrieval"]
    assert len(fake.answers()) == 8
    report, plot = tmp_path / "reader.md", tmp_path / "reader.png"
    res = CliRunner().invoke(
        app,
        [*base, "--conversations", "5", "--questions", "2", "--strategies", "truncation,none",
         "--reader", "http://reader.test/v1", "--report", str(report), "--plot", str(plot)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "F1" in res.stdout and "[" in res.stdout  # the table, with intervals
    assert "| truncation |" in report.read_text(encoding="utf-8")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the forgetting curve as read
    res = CliRunner().invoke(
        app,
        [*base, "--conversations", "5", "--questions", "3", "--categories", "adversarial",
         "--strategies", "none", "--reader", "http://reader.test/v1", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["categories"] == {"5": "adversarial"} and out["questions"] == 3
    assert {a["category"] for a in out["answers"]} == {5}
    assert out["scores"]["none"]["heldout"]["f1"]["mean"] == 1.0  # it says not known each time
    res = CliRunner().invoke(app, [*base, "--categories", "5"])
    assert res.exit_code != 0 and "--reader" in str(res.exception)
    res = CliRunner().invoke(app, [*base, "--reader", "http://reader.test/v1", "--categories", "7"])
    assert res.exit_code != 0 and "--categories" in str(res.exception)
    res = CliRunner().invoke(
        app, [*base, "--reader", "http://reader.test/v1", "--limit-questions", "3"]
    )
    assert res.exit_code != 0 and "--questions" in str(res.exception)
    res = CliRunner().invoke(app, [*base, "--questions", "4"])
    assert res.exit_code != 0 and "--reader" in str(res.exception)
    res = CliRunner().invoke(
        app, [*base, "--reader", "http://reader.test/v1", "--questions", "some"]
    )
    assert res.exit_code != 0 and "--questions" in str(res.exception)
