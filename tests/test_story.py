from __future__ import annotations

import pytest

from kioku.errors import InputError
from kioku.story import story
from kioku.story.script import tic_share


@pytest.fixture(scope="module", params=["en", "ja"])
def told(request: pytest.FixtureRequest):
    return story(request.param, 1200)


def test_the_same_arguments_give_the_same_story() -> None:
    a, b = story("en", 400), story("en", 400)
    assert a.messages == b.messages and a.info == b.info
    assert story("en", 400, seed=1).messages != a.messages
    assert story("ja", 400).messages != a.messages


def test_length_alternation_and_variety(told) -> None:
    n = len(told.messages)
    assert 1200 <= n <= 1210
    roles = [m.role for m in told.messages]
    assert roles[::2] == ["user"] * (n // 2) and roles[1::2] == ["assistant"] * (n // 2)
    texts = [m.text for m in told.messages]
    assert len(set(texts)) > 0.5 * n  # reads like a chat, not a loop
    assert told.messages[0].role == "user"  # the story opens on the meeting
    times = [m.at for m in told.messages]
    assert times == sorted(times)
    assert told.info["days"] > 30


def test_every_planted_answer_is_in_its_evidence(told) -> None:
    qs = told.info["questions"]
    assert len(qs) >= 20
    kinds = {q["kind"] for q in qs}
    assert {"user-fact", "claim", "truth", "promise"} <= kinds
    for q in qs:
        for seq in q["evidence"]:
            assert q["answer"] in told.messages[seq].text, q["id"]


def test_the_lie_is_speech_and_the_truth_is_narration_or_thought(told) -> None:
    qs = {q["id"]: q for q in told.info["questions"]}
    claimed, real = qs["claimed-age"]["answer"], qs["real-age"]["answer"]
    char = told.character
    said = [
        p.text
        for m in told.messages
        if m.role == "assistant"
        for p in m.parts
        if p.kind == "speech" and (p.speaker or m.author) == char
    ]
    shown = [p.text for m in told.messages for p in m.parts if p.kind in ("narration", "thought")]
    assert sum(claimed in s for s in said) >= 2  # she keeps saying it
    assert not any(real in s for s in said)  # she never says the truth
    assert any(real in s for s in shown)
    assert all(
        p.kind in ("narration", "thought") for m in told.messages for p in m.parts if real in p.text
    )


def test_the_promise_is_made_early_and_kept_late(told) -> None:
    q = next(q for q in told.info["questions"] if q["id"] == "promise")
    n = len(told.messages)
    made, kept = sorted(q["evidence"])
    assert made < 0.1 * n and kept > 0.85 * n
    kept_parts = told.messages[kept].parts
    assert any(p.kind == "narration" and q["answer"] in p.text for p in kept_parts)


def test_the_tic_creeps_in(told) -> None:
    tic = told.info["tic"]
    n = len(told.messages)
    replies = [(i, m.text) for i, m in enumerate(told.messages) if m.role == "assistant"]
    early = [t for i, t in replies if i < 0.3 * n]
    late = [t for i, t in replies if i > 0.8 * n]
    assert not any(tic in t for t in early)
    assert sum(tic in t for t in late) > 0.35 * len(late)
    # and never in the user's messages
    assert not any(tic in m.text for m in told.messages if m.role == "user")


def test_tic_share_ramps() -> None:
    from kioku.story.en import CAST

    assert tic_share(0.1, CAST) == 0.0
    assert 0 < tic_share(0.5, CAST) < tic_share(0.9, CAST) <= CAST.tic_max


def test_bad_arguments() -> None:
    with pytest.raises(InputError):
        story("fr", 400)
    with pytest.raises(InputError):
        story("en", 10)
