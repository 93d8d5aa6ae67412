from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kioku.context import build
from kioku.errors import ContextOverflow, MessageTooLarge
from kioku.memory import Memory, MemoryItem
from kioku.messages import LogEntry, Message
from kioku.profiles import LOCAL_8K
from kioku.recall.recollection import RecalledLine, Recollection
from kioku.tokens import ScriptEstimator

COUNTER = ScriptEstimator()


def entry(seq: int, text: str, role: str = "user") -> LogEntry:
    m = Message.of(role, text)  # type: ignore[arg-type]
    return LogEntry(seq, m, COUNTER.count(text))


@pytest.mark.parametrize(
    ("text", "asks"), [("tell me about your cat", False), ("what is your cat's name?", True)]
)
def test_order_is_system_memory_raw_then_recollection_and_new_message(
    text: str, asks: bool
) -> None:
    mem = Memory(chapters=(MemoryItem("chapter", 0, 9, "[3] Mika: I have a cat.", 8, id=1),))
    raw = [entry(10, "hello"), entry(11, "hi there", "assistant")]
    rec = Recollection(2, 3, 1.0, (RecalledLine(3, "Mika", "my cat is called Tama"),), 14)
    p = build(
        system_prompt="You are Mika.",
        memory=mem,
        raw=raw,
        new=entry(12, text),
        profile=LOCAL_8K,
        counter=COUNTER,
        recollections=[rec],
    )
    roles = [m.role for m in p.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.messages[0].content == "You are Mika."
    assert "not necessarily the truth" in p.messages[1].content
    assert "I have a cat" in p.messages[1].content
    last = p.messages[-1].content
    # in front of the message, kept for a statement and shown once for a question: the
    # message is the last thing the model reads either way (`kioku.context`)
    assert last.endswith(text) and "Tama" in last
    assert p.extras is not None and ("Tama" in p.extras.once) == asks
    assert p.account.raw_messages == 2 and p.account.recollections > 0
    assert p.account.total + p.account.reserve <= p.account.window


def test_system_prompt_is_byte_identical_whatever_the_memory() -> None:
    base = dict(system_prompt="CARD", raw=[], new=entry(0, "x"), profile=LOCAL_8K, counter=COUNTER)
    a = build(memory=Memory(), **base)  # type: ignore[arg-type]
    b = build(memory=Memory(chapters=(MemoryItem("chapter", 0, 0, "t", 1),)), **base)  # type: ignore[arg-type]
    assert a.messages[0] == b.messages[0]


def test_message_larger_than_window_is_a_clear_error() -> None:
    huge = entry(5, "word " * 40000)
    with pytest.raises(MessageTooLarge) as e:
        build(
            system_prompt="", memory=Memory(), raw=[], new=huge, profile=LOCAL_8K, counter=COUNTER
        )
    assert e.value.seq == 5
    assert "stored as seq 5" in str(e.value)


def test_overflowing_raw_window_is_refused_not_sent() -> None:
    raw = [entry(i, "word " * 400) for i in range(30)]
    with pytest.raises(ContextOverflow):
        build(
            system_prompt="",
            memory=Memory(),
            raw=raw,
            new=entry(30, "x"),
            profile=LOCAL_8K,
            counter=COUNTER,
        )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), max_size=40),
    recs=st.lists(st.integers(1, 400), max_size=6),
    new=st.integers(1, 3000),
)
def test_window_invariant_holds_or_errors(sizes: list[int], recs: list[int], new: int) -> None:
    raw = [entry(i, "w " * n) for i, n in enumerate(sizes)]
    rec = [Recollection(0, 0, 1.0, (RecalledLine(0, "Mika", "r " * n),)) for n in recs]
    try:
        p = build(
            system_prompt="card",
            memory=Memory(),
            raw=raw,
            new=entry(len(sizes), "n " * new),
            profile=LOCAL_8K,
            counter=COUNTER,
            recollections=rec,
        )
    except (ContextOverflow, MessageTooLarge):
        return
    total = sum(COUNTER.count(m.content) + 6 for m in p.messages)
    assert total + LOCAL_8K.response_reserve <= LOCAL_8K.window
    assert p.account.fits
