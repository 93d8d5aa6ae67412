"""Aligning a transcript with the log: a valid edit script at any size, SequenceMatcher's own
answer for ordinary sizes, and no quadratic blow-up on repeated messages."""

from __future__ import annotations

from difflib import SequenceMatcher

from hypothesis import given, settings
from hypothesis import strategies as st

from kioku.align import EXACT_LIMIT, Opcode, opcodes
from kioku.sync import Incoming, Logged, diff, line_key


def check_script(a: list[str], b: list[str], ops: list[Opcode]) -> int:
    """The opcodes cover both sides in order, 'equal' spans are equal, and applying them turns
    a into b. Returns how many items they matched."""
    i = j = matched = 0
    out: list[str] = []
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j), ops
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
            matched += i2 - i1
        out.extend(b[j1:j2])
        i, j = i2, j2
    assert (i, j) == (len(a), len(b)) and out == b
    return matched


keys = st.lists(st.sampled_from("abcdefgh"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(a=keys, b=keys)
def test_anchored_matching_is_a_valid_edit_script(a: list[str], b: list[str]) -> None:
    ops = opcodes(a, b, exact_limit=0)  # never hand a region to SequenceMatcher
    check_script(a, b, ops)


@settings(max_examples=100, deadline=None)
@given(a=keys, b=keys)
def test_ordinary_sizes_get_sequence_matchers_answer(a: list[str], b: list[str]) -> None:
    assert opcodes(a, b) == SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def test_a_window_into_a_long_log_matches_as_one_stretch() -> None:
    log = [f"m{i}" for i in range(30_000)]
    window = log[12_000:] + ["new"]
    ops = opcodes(log, window)
    assert ("equal", 12_000, 30_000, 0, 18_000) in ops
    assert check_script(log, window, ops) == 18_000


def test_twenty_thousand_repeated_messages_align_by_their_common_start() -> None:
    """The input difflib took 31 s of CPU on: every message the same."""
    log = ["ok"] * 19_998
    ops = opcodes(log, ["ok"] * 20_000)
    assert ops == [("equal", 0, 19_998, 0, 19_998), ("insert", 19_998, 19_998, 19_998, 20_000)]


def test_a_large_transcript_with_an_edit_a_deletion_and_a_new_message() -> None:
    texts = [("user" if i % 2 == 0 else "assistant", f"line {i}") for i in range(20_000)]
    log = [Logged(i, r, line_key(r, t)) for i, (r, t) in enumerate(texts)]
    window = [Incoming(r, t) for r, t in texts]  # type: ignore[arg-type]
    window[5_000] = Incoming("user", "an edited line")
    del window[9_001]
    window.append(Incoming("assistant", "a reply"))
    window.append(Incoming("user", "next"))
    assert len(log) * len(window) > EXACT_LIMIT
    plan = diff(log, window)
    assert [(e.seq, e.message.text) for e in plan.edits] == [(5_000, "an edited line")]
    assert plan.deletes == (9_001,)
    assert [m.text for m in plan.appends] == ["a reply", "next"]
