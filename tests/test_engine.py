from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kioku.engine import Kioku
from kioku.errors import ConfigError, InputError, MessageTooLarge, ModelError, TruncatedReply
from kioku.memory import coverage_gaps
from kioku.messages import Message
from kioku.models import Completion, ScriptedModel, Usage
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from tests.helpers import Clock, FlakySummarizer

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def sentence(i: int, n: int = 30) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n)) + f" number {i}."


def make(clock: Clock, summarizer=None, **kw) -> Kioku:
    return Kioku(
        Store.open("sqlite://"), profile=LOCAL_8K, clock=clock, summarizer=summarizer, **kw
    )


def coverage_ok(kk: Kioku, cid: str) -> list[str]:
    info = kk.store.conversation(cid)
    return coverage_gaps(kk.store.items(cid, "active"), info.raw_start)


def test_store_first_even_when_the_model_fails() -> None:
    model = ScriptedModel([ConnectionError("boom")])
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, reply_model=model)
    conv = kk.conversation("c")
    with pytest.raises(ConnectionError):
        conv.chat("remember: my sister is called Hana")
    assert [e.text for e in kk.store.entries("c")] == ["remember: my sister is called Hana"]


def test_empty_model_reply_is_an_error_and_stores_nothing_but_the_message() -> None:
    model = ScriptedModel([Completion("", "stop", Usage(10, 0))])
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, reply_model=model)
    conv = kk.conversation("c")
    with pytest.raises(ModelError, match="empty reply"):
        conv.chat("hello?")
    assert [e.text for e in kk.store.entries("c")] == ["hello?"]
    assert kk.store.counters("c")["empty_replies"] == 1


def test_empty_message_is_refused_with_a_clear_error() -> None:
    kk = make(Clock())
    with pytest.raises(InputError, match="empty"):
        kk.conversation("c").prepare("   ")


def test_chat_without_reply_model_says_what_to_do() -> None:
    kk = make(Clock())
    with pytest.raises(ConfigError, match="reply_model"):
        kk.conversation("c").chat("hi")


def test_length_finish_is_surfaced_counted_and_marked() -> None:
    cut = Completion("and then she said that the", "length", Usage(100, 50))
    model = ScriptedModel([cut, "fine."])
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, reply_model=model)
    conv = kk.conversation("c")
    with pytest.raises(TruncatedReply) as e:
        conv.chat("tell me a story")
    assert e.value.completion.finish_reason == "length"
    assert kk.store.counters("c")["truncated_replies"] == 1
    assert kk.store.entries("c")[-1].meta == {"finish_reason": "length"}
    reply = conv.chat("go on", strict=False)
    assert reply.text == "fine." and not reply.truncated
    # every request the model saw fit the window
    for req in model.history:
        assert req.max_tokens == LOCAL_8K.response_reserve


def test_fold_is_deferred_past_the_trigger_turn_and_applied_when_the_room_is_needed() -> None:
    clock = Clock()
    kk = make(clock)
    conv = kk.conversation("c", system_prompt="card")
    trigger_turn = None
    for i in range(200):
        clock.advance(10)
        conv.prepare(sentence(i))
        conv.record(sentence(i + 1))
        if conv.last_turn.scheduled and trigger_turn is None:
            trigger_turn = i
            # the trigger turn schedules, never folds
            assert not conv.last_turn.folded
            assert conv.info().memory_version == 0
            break
    assert trigger_turn is not None
    # the job is delayed: the worker finds nothing due yet
    assert kk.worker.run_once() is None
    clock.advance(LOCAL_8K.summary_delay_s)
    assert kk.worker.run_once() is not None
    # ready, but the window still has room: the turns go on with the whole raw window, until
    # the one whose prompt needs the room folds (once, with no forced cut)
    sizes = []
    for i in range(60):
        p = conv.prepare(sentence(1000 + i))
        if conv.last_turn.folded:
            break
        sizes.append(p.tokens)
        conv.record(sentence(i))
    assert conv.last_turn.folded and not conv.last_turn.forced_cut
    assert conv.info().memory_version == 1
    assert len(sizes) > 3 and sizes == sorted(sizes)  # the prompt only grew until then
    assert sizes[-1] > 0.9 * LOCAL_8K.prompt_budget  # the window was full when it folded
    assert coverage_ok(kk, "c") == []


def test_ceiling_cuts_with_an_extractive_stand_in_when_summaries_keep_failing() -> None:
    clock = Clock()
    kk = make(clock, FlakySummarizer(always_fail=True))
    conv = kk.conversation("c")
    for i in range(400):
        clock.advance(30)
        p = conv.prepare(sentence(i))
        assert p.account.fits
        conv.record(sentence(i + 7))
        kk.worker.run_until_idle()
        assert coverage_ok(kk, "c") == []
        if conv.last_turn.forced_cut:
            break
    assert conv.last_turn.forced_cut is not None
    assert kk.store.counters("c")["forced_cuts"] == 1
    stand_in = kk.store.items("c", "active")[0]
    assert stand_in.source == "extractive" and stand_in.first_seq == 0
    assert any(e["event"] == "forced_cut" for e in kk.store.log_entries("c"))


def test_backlog_is_split_into_chunks_oldest_first() -> None:
    # a conversation that lived on a wide-window model moves to a small local profile
    clock = Clock()
    profile = replace(LOCAL_8K, summary_chunk=1000)
    kk = Kioku(Store.open("sqlite://"), profile=profile, clock=clock)
    conv = kk.conversation("c")
    for i in range(95):  # past the trigger, still under the ceiling
        conv.append(Message.user(sentence(i, 60)))
    conv.prepare("and now?")
    assert not conv.last_turn.forced_cut
    jobs = kk.store.jobs("c", "queued")
    assert len(jobs) >= 2
    assert [j.first_seq for j in jobs] == sorted(j.first_seq for j in jobs)
    for a, b in zip(jobs, jobs[1:], strict=False):
        assert b.first_seq == a.last_seq + 1
        assert kk.store.tokens_between("c", a.first_seq, a.last_seq) <= profile.summary_chunk


def test_major_gc_folds_older_half_into_synopsis() -> None:
    clock = Clock()
    kk = make(clock)
    conv = kk.conversation("c")
    for i in range(1500):
        clock.advance(20)
        conv.prepare(sentence(i))
        conv.record(sentence(i + 3))
        kk.worker.run_until_idle()
        if kk.store.counters("c").get("major_gcs"):
            break
    mem = conv.memory()
    assert mem.synopsis is not None and mem.synopsis.first_seq == 0
    retired = kk.store.items("c", "retired")
    assert retired and all(r.kind == "chapter" for r in retired)
    assert coverage_ok(kk, "c") == []


def test_message_that_can_never_fit_is_refused_before_it_is_stored() -> None:
    kk = make(Clock())
    conv = kk.conversation("c", system_prompt="You are Mika. " * 200)
    giant = "word " * 50000
    for _ in range(2):  # a retry stores nothing either
        with pytest.raises(MessageTooLarge, match="nothing was stored") as e:
            conv.prepare(giant)
        assert e.value.seq is None and e.value.limit < e.value.tokens
    assert kk.store.count_messages("c") == 0
    # the limit is the prompt's own (card, margin, template, a date line): the largest message
    # that passes it is answered, not refused after it was stored
    limit = conv.message_limit()
    assert (
        e.value.limit == limit < kk.profile.prompt_budget - kk.counter.count("You are Mika. " * 200)
    )
    lo, hi = 1, 50000
    while lo < hi:  # the most words whose count is within the limit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if kk.counter.count("word " * mid) <= limit else (lo, mid - 1)
    p = conv.prepare("word " * lo)
    assert p.messages[-1].content.startswith("word word") and kk.store.count_messages("c") == 1
    p = conv.prepare("still there?")  # the giant is folded away
    assert p.account.fits and p.messages[-1].content.endswith("still there?")
    assert coverage_ok(kk, "c") == []


def test_cut_empties_raw_window_and_keeps_archive() -> None:
    kk = make(Clock())
    conv = kk.conversation("c")
    for i in range(10):
        conv.prepare(sentence(i))
        conv.record(sentence(i + 1))
    conv.cut()
    assert conv.raw_window() == []
    assert coverage_ok(kk, "c") == []
    assert kk.store.count_messages("c") == 20
    p = conv.prepare("fresh start")
    assert p.account.raw_messages == 0


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["turn", "long", "work", "wait", "cut"]), st.integers(0, 40)),
        min_size=10,
        max_size=70,
    ),
    fail_on=st.sets(st.integers(0, 30), max_size=10),
)
@pytest.mark.slow
def test_coverage_invariant_under_random_turns_folds_and_failures(steps, fail_on) -> None:
    clock = Clock()
    kk = make(clock, FlakySummarizer(fail_on), simulated_duration_s=15)
    kk.worker.backoff_s = 5
    conv = kk.conversation("c")
    for i, (op, n) in enumerate(steps):
        if op in ("turn", "long"):
            p = conv.prepare(sentence(i, 40 if op == "turn" else 200 + n * 5))
            assert p.account.fits
            conv.record(sentence(i + n, 30 + n))
        elif op == "work":
            kk.worker.run_until_idle()
        elif op == "wait":
            clock.advance(n * 3)
        elif op == "cut" and n < 3:
            conv.cut()
        clock.advance(5)
        assert coverage_ok(kk, "c") == []
    # every message is still in the log, in order, with no gaps
    assert [e.seq for e in kk.store.entries("c")] == list(range(kk.store.count_messages("c")))
