"""One budget for the whole rendered prompt (issue 9): the account adds up to what the server
reads, a normal turn never fails for size, what a turn was shown stays until the next fold,
and a server that lies about its usage cannot skew the counts."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kioku.budget import CHATML, Want, share
from kioku.context import build, with_extras
from kioku.counters import QwenCounter
from kioku.engine import Kioku
from kioku.errors import CardTooLarge
from kioku.layers import Layers
from kioku.memory import Memory, MemoryItem
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage, Completion, Usage
from kioku.profiles import LOCAL_8K, LOCAL_64K
from kioku.recall.recollection import RecalledLine, Recollection
from kioku.store import Store
from kioku.tokens import CalibratedEstimator, ScriptEstimator
from tests.helpers import Clock

QWEN = QwenCounter()


def chatml_tokens(messages: list[ChatMessage]) -> int:
    """The prompt a ChatML server renders and reads, tokenized by the server's tokenizer."""
    text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    return QWEN.count(text + "<|im_start|>assistant\n")


WORDS = st.sampled_from(
    ["hello", "Mika", "cat", "雨", "東京", "spring", "promise", "ね", "42", "tea", "、", "!"]
)
TEXT = st.lists(WORDS, min_size=1, max_size=40).map(" ".join)


def rec(first: int, last: int, text: str, counter: object = None) -> Recollection:
    lines = tuple(RecalledLine(q, "Mika", text) for q in range(first, last + 1))
    r = Recollection(first, last, 1.0, lines)
    return Recollection(first, last, 1.0, lines, (counter or ScriptEstimator()).count(r.text))  # type: ignore[attr-defined]


def entry(seq: int, text: str, role: str = "user") -> LogEntry:
    return LogEntry(seq, Message.of(role, text), QWEN.count(text))  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    system=st.one_of(st.just(""), TEXT),
    chapters=st.lists(TEXT, max_size=3),
    notes=st.one_of(st.just(""), TEXT),
    raw=st.lists(TEXT, max_size=12),
    new=TEXT,
    recs=st.lists(TEXT, max_size=3),
    instructions=st.lists(TEXT, max_size=2),
)
def test_account_adds_up_to_the_rendered_prompt_as_the_server_counts_it(
    system: str,
    chapters: list[str],
    notes: str,
    raw: list[str],
    new: str,
    recs: list[str],
    instructions: list[str],
) -> None:
    items = tuple(
        MemoryItem("chapter", i, i, t, QWEN.count(t), id=i + 1) for i, t in enumerate(chapters)
    )
    memory = Memory(chapters=items, notes=notes)
    first = len(chapters)
    window = [entry(first + i, t, "user" if i % 2 == 0 else "assistant") for i, t in enumerate(raw)]
    p = build(
        system_prompt=system,
        memory=memory,
        raw=window,
        new=entry(first + len(raw), new),
        profile=LOCAL_8K,
        counter=QWEN,
        recollections=[rec(0, 0, t, QWEN) for t in recs],
        instructions=instructions,
    )
    assert QWEN.template == CHATML
    assert p.account.total == chatml_tokens(list(p.messages))
    assert p.account.fits


def test_share_gives_priority_first_and_a_ratio_of_what_is_left() -> None:
    got = share(
        100,
        [
            Want("recollections", 1000, priority=1, ratio=0.5),
            Want("instructions", 30, priority=2, minimum=30),
        ],
    )
    assert got == {"instructions": 30, "recollections": 35}
    assert share(20, [Want("instructions", 30, priority=2, minimum=30)]) == {"instructions": 0}


def turns(kk: Kioku, conv_id: str, n: int, clock: Clock, text=lambda i: f"message {i}") -> int:
    """Play n turns; return how many failed."""
    conv = kk.conversation(conv_id)
    failed = 0
    for i in range(n):
        clock.advance(30)
        try:
            p = conv.prepare(text(i))
        except Exception:
            failed += 1
            continue
        assert p.account.fits
        conv.record(f"reply {i}: " + text(i))
        kk.worker.run_until_idle()
    return failed


def test_a_2000_token_card_at_a_4096_window_never_fails_a_turn() -> None:
    clock = Clock()
    profile = LOCAL_64K.scaled(4096)
    kk = Kioku(Store.open("sqlite://"), profile=profile, counter=ScriptEstimator(), clock=clock)
    card = " ".join(f"trait{i} is important to Seraphina." for i in range(230))
    card_tokens = ScriptEstimator().count(card)
    assert 1800 < card_tokens < 2600
    kk.conversation("st", system_prompt=card)
    text = lambda i: f"Tell me about the forest, part {i}. " * 6  # noqa: E731
    assert turns(kk, "st", 100, clock, text) == 0
    counters = kk.store.counters("st")
    assert counters.get("folds", 0) > 0  # it did fold, with a memory fitted to the card


def test_1200_one_word_messages_on_local_8k_never_fail() -> None:
    clock = Clock()
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, counter=ScriptEstimator(), clock=clock)
    kk.conversation("short", system_prompt="You are Mika.")
    assert turns(kk, "short", 600, clock, lambda i: "ok" if i % 2 else "yes") == 0
    assert kk.store.counters("short").get("folds", 0) > 0


def test_a_card_that_cannot_fit_is_refused_when_first_seen_and_nothing_is_stored() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, counter=ScriptEstimator())
    with pytest.raises(CardTooLarge) as e:
        kk.conversation("big", system_prompt="word " * 9000)
    assert "at most" in str(e.value) and "--window" in str(e.value)
    assert kk.conversations() == []


def test_a_server_that_lies_about_usage_leaves_the_counts_unchanged() -> None:
    counter = CalibratedEstimator()
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, counter=counter)
    conv = kk.conversation("liar")
    text = "The weather in Tokyo was lovely today, we walked along the river. " * 20
    before = counter.count(text)
    for _ in range(30):
        conv.prepare(text)
        conv.record(Completion("ok", usage=Usage(prompt_tokens=10, completion_tokens=1)))
    assert counter.count(text) == before
    assert counter.observations == 0
    assert kk.store.counters("liar")["calibration_ignored"] == 30
    ignored = [e for e in kk.store.log_entries("liar") if e["event"] == "calibration"]
    assert ignored and "usage.prompt_tokens 10" in ignored[0]["detail"]


def test_between_folds_the_prompt_only_grows_with_every_layer_on() -> None:
    """What the server cached (the prompt plus its reply) is a prefix of the next prompt on
    every turn whose memory did not change, recollections and tic notes included."""
    clock = Clock()
    store = Store.open("sqlite://")
    kk = Kioku(
        store, profile=LOCAL_8K, counter=ScriptEstimator(), clock=clock, layers=Layers(store)
    )
    conv = kk.conversation("grow", system_prompt="You are Mika.")
    facts = [
        f"My sister Hanako loves {w} and visits every {d}."
        for w, d in zip(
            ["tea", "rain", "cats", "jazz"], ["Monday", "Friday", "spring", "winter"], strict=True
        )
    ]
    previous: list[ChatMessage] | None = None
    version = -1
    shown_extras = asked_once = 0
    once = ""
    for i in range(400):
        clock.advance(30)
        text = f"hm {i}"
        if i < 8:
            text = facts[i % 4]
        elif i % 25 == 0:
            text = f"I still remember what my sister Hanako loves ({i})."
        elif i % 25 == 12:  # a question, then a remark: it asks all the same
            text = f"Do you remember what my sister Hanako loves? Tell me ({i})."
        p = conv.prepare(text)
        reply = f"Of course ({i}), she loves it! Always with a smile, always."
        if previous is not None and p.memory_version == version:
            *before, asked, answered = previous
            assert list(p.messages[: len(before)]) == before
            now = p.messages[len(before)]
            # a question's recollections are shown once, in front of it: the next prompt
            # shows the message without them, and nothing else moves
            assert (
                now == asked or once and asked.content.replace(once + "\n\n", "", 1) == now.content
            )
            assert p.messages[len(before) + 1] == answered
        if p.extras is not None and p.extras.text:
            shown_extras += 1
        once = p.extras.once if p.extras is not None else ""
        asked_once += bool(once)
        conv.record(reply)
        kk.worker.run_until_idle()
        previous = [*p.messages, ChatMessage("assistant", reply)]
        version = p.memory_version
    assert shown_extras > 0  # recollections or tic notes were shown in front, and kept
    assert asked_once > 0  # a question's recollections were shown once


def test_a_recollection_already_visible_is_not_shown_again() -> None:
    raw = [entry(10, "hello"), entry(11, "hi", "assistant")]
    kept = LogEntry(
        12,
        Message.user("and the cat?"),
        3,
        {"shown": {"text": "(memory)", "tokens": 3, "version": 0, "recalled": [[2, 3]]}},
    )
    p = build(
        system_prompt="",
        memory=Memory(),
        raw=[*raw, kept, entry(13, "yes", "assistant")],
        new=entry(14, "what was its name?"),
        profile=LOCAL_8K,
        counter=ScriptEstimator(),
        recollections=[rec(2, 3, "Tama"), rec(6, 6, "tea")],
    )
    assert p.extras is not None
    assert p.extras.once_recalled == ((6, 6),)  # a question's: shown once, after it
    assert "tea" in p.extras.once and "Tama" not in p.extras.once
    assert p.messages[-3].content == with_extras("(memory)", "and the cat?")


def test_a_fast_client_gets_forced_cuts_that_fit_never_overflows() -> None:
    """Summaries never arrive (no worker runs): the ceiling cuts with stand-in chapters and
    every prompt still fits the window."""
    profile = replace(LOCAL_8K, summary_delay_s=3600.0)
    kk = Kioku(Store.open("sqlite://"), profile=profile, counter=ScriptEstimator())
    conv = kk.conversation("fast")
    for i in range(400):
        p = conv.prepare(f"turn {i}: " + "a fairly long line of chat about the weather " * 4)
        assert p.account.fits
        conv.record(f"reply {i}")
    assert kk.store.counters("fast")["forced_cuts"] > 0
