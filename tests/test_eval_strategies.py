from __future__ import annotations

from dataclasses import replace

import pytest

from kioku.errors import ContextOverflow, InputError
from kioku.eval.baselines import RetrievalArm, WindowArm, entry_seqs
from kioku.eval.strategies import (
    ARMS,
    HEADLINE,
    KiokuArm,
    View,
    check_strategies,
    close_all,
    fit_profile,
    replay,
)
from kioku.memory import Memory, MemoryItem
from kioku.messages import Message
from kioku.policy import PendingJob, State, decide
from kioku.profiles import LOCAL_8K, Profile, get_profile
from kioku.store import Store
from kioku.story import story
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator
from kioku.worker import Worker


@pytest.fixture(scope="module")
def arms():
    t = story("en", 500)
    counter = ScriptEstimator()
    profile, _ = fit_profile(get_profile("local-64k", 4096))
    out = replay(
        t,
        profile=profile,
        counter=counter,
        summarizer=ExtractiveSummarizer(counter),
        strategies=HEADLINE,
    )
    yield t, profile, out
    close_all(out)


def test_fit_profile_leaves_room_for_memory_and_the_minimum_raw_window() -> None:
    # a scaled profile already fits; a hand-made one may not
    scaled = get_profile("local-64k", 4096)
    assert (
        scaled.synopsis_tokens + scaled.major_gc + scaled.chapter_tokens
        <= scaled.trigger - scaled.min_raw
    )
    p = replace(scaled, chapter_tokens=600, synopsis_tokens=1200, major_gc=2400)
    assert p.synopsis_tokens + p.major_gc + p.chapter_tokens > p.trigger - p.min_raw
    fitted, changed = fit_profile(p)
    assert fitted.synopsis_tokens + fitted.major_gc + fitted.chapter_tokens <= p.trigger - p.min_raw
    assert set(changed) == {"chapter_tokens", "synopsis_tokens", "major_gc", "notes_tokens"}
    assert fit_profile(get_profile("local-64k")) == (get_profile("local-64k"), {})


def memory_of(p: Profile) -> int:
    return p.synopsis_tokens + p.major_gc + p.chapter_tokens + p.notes_tokens


def test_a_small_window_keeps_memory_within_its_share_of_the_ceiling() -> None:
    # the readability floors that `scaled` keeps would take 58% of a 4,096 ceiling
    p = get_profile("local-64k", 4096)
    assert memory_of(p) <= p.memory_share * p.ceiling
    assert (
        memory_of(replace(get_profile("local-64k"), memory_share=1.0).scaled(4096))
        > 0.55 * p.ceiling
    )
    # the four shrink together, each still large enough to say something
    assert p.chapter_tokens < 300 and p.synopsis_tokens < 600 and p.major_gc < 1200
    assert min(p.chapter_tokens, p.synopsis_tokens) >= 64
    # where memory fits its share, nothing moves: 16k, and every named profile as written
    assert fit_profile(get_profile("local-64k", 16384))[1] == {}
    for name in ("local-64k", "local-8k", "cloud-1m"):
        named = get_profile(name)
        assert named.scaled(named.window) == named


@pytest.mark.slow
def test_every_arm_answers_with_a_prompt_that_fits(arms) -> None:
    t, profile, out = arms
    assert list(out) == [*ARMS, "full"]
    for name, arm in out.items():
        ctx = arm.context("What is the name of the user's cat?")
        assert ctx.strategy == name
        # the question last, or followed by its recollections (shown once, after it)
        last = ctx.messages[-1].content
        assert last.endswith(ctx.question) or f"{ctx.question}\n\n⟦A memory" in last, name
        assert ctx.question not in ctx.text
        # every arm's prompt was assembled by the product's allocator, which accounts for it
        assert ctx.account is not None and ctx.account.total == ctx.tokens, name
        assert ctx.messages[0].role == "system" and ctx.messages[0].content == t.system_prompt
        if name != "full":
            assert ctx.tokens + profile.response_reserve <= profile.window, name
    assert out["full"].context("q").tokens > profile.window  # no limit


@pytest.mark.slow
def test_arms_that_differ_only_at_the_question_share_a_replay(arms) -> None:
    _, _, out = arms
    gen, norecall = out["generational"], out["generational-norecall"]
    rolling, plus = out["rolling"], out["rolling+recall"]
    assert isinstance(norecall, View) and norecall.base is gen
    assert isinstance(plus, View) and plus.base is rolling
    q = "Whose cat gets grumpy if dinner is late?"
    with_recall, without = gen.context(q), norecall.context(q)
    assert with_recall.extra and not without.extra
    assert without.before == with_recall.before  # the same memory and raw window
    assert "Mochi" in plus.context(q).extra and not rolling.context(q).extra
    assert gen.context(q).extra == with_recall.extra  # asking again changes nothing


@pytest.mark.slow
def test_retrieval_fills_the_budget_with_the_best_turns_and_their_neighbours(arms) -> None:
    t, profile, out = arms
    ret = out["retrieval"]
    assert isinstance(ret, RetrievalArm)
    q = "Whose cat gets grumpy if dinner is late?"
    ranking = ret.ranking(q)
    best = ranking[0]
    assert "Mochi" in ret.entries[best].text or "cat" in ret.entries[best].text.lower()
    ctx = ret.context(q)
    shown = ctx.parts()["raw"]
    for s in (best - 1, best, best + 1):
        assert ret.entries[s].text in shown  # the hit and both neighbours
    # it fills the budget with what BM25 found: every ranked turn is shown, or the allocator
    # refuses one more message
    unshown = [e for e in ret.entries if e.text not in shown]
    smallest = min(unshown, key=lambda e: e.tokens)
    kept = [e for e in ret.entries if e.text in shown]
    if not all(ret.entries[s].text in shown for s in ranking):
        with pytest.raises(ContextOverflow):
            ret._prompt(sorted([*kept, smallest], key=lambda e: e.seq), ret._entry(q), profile)
    # shown in log order, not rank order
    seqs = [e.seq for e in ret.entries if e.text in shown]
    assert seqs == sorted(seqs)
    assert ret.ranking("zzzz qqqq") == []


def test_entry_seqs_skip_replies_before_the_first_user_message() -> None:
    t = story("en", 500)
    opening = Message.assistant("Once upon a time.", author="Mina")
    t2 = replace(t, messages=(opening, *t.messages), meta=({}, *t.meta))
    seqs = entry_seqs(t2)
    assert seqs[0] == -1 and seqs[1:] == list(range(len(t.messages)))


@pytest.mark.slow
def test_full_keeps_everything_and_truncation_the_newest(arms) -> None:
    t, profile, out = arms
    full = out["full"].context("anything").text
    assert all(m.text in full for m in t.messages)
    trunc = out["truncation"].context("anything")
    assert t.messages[-1].text in trunc.text
    assert t.messages[0].text not in trunc.text
    assert trunc.tokens <= profile.prompt_budget
    assert isinstance(out["truncation"], WindowArm)
    # no room left for one more message: the allocator refuses it
    arm = out["truncation"]
    assert isinstance(arm, WindowArm)
    kept = len(trunc.messages) - 2  # system + question
    assert trunc.account is not None and trunc.account.raw_messages == kept
    shown = arm.entries[len(arm.entries) - kept - 1 :]
    with pytest.raises(ContextOverflow):
        arm._prompt(shown, arm._entry("anything"), profile)


@pytest.mark.slow
def test_kioku_arms_fold_and_rolling_long_is_length_matched(arms) -> None:
    _, profile, out = arms
    gen, rolling, long = out["generational"], out["rolling"], out["rolling-long"]
    assert isinstance(gen, KiokuArm) and isinstance(long, KiokuArm)
    assert gen.counters()["folds"] > 3 and gen.counters()["major_gcs"] >= 1
    assert gen.counters()["forced_cuts"] == 0
    assert long.profile.synopsis_tokens == max(profile.synopsis_tokens, gen.memory().tokens)
    assert rolling.memory().tokens <= profile.synopsis_tokens + 64
    assert long.memory().tokens > rolling.memory().tokens
    assert out["truncation"].memory().tokens == 0
    # the generational arm's question gets a recollection from the archive
    ctx = gen.context("Whose cat gets grumpy if dinner is late?")
    assert "Mochi" in ctx.extra


def test_strategy_names_are_checked() -> None:
    assert check_strategies(["full"]) == ("full",)
    assert check_strategies(["rolling+recall", "retrieval"]) == ("rolling+recall", "retrieval")
    with pytest.raises(InputError):
        check_strategies(["generational", "bogus"])
    with pytest.raises(InputError):
        check_strategies([])
    with pytest.raises(InputError):
        check_strategies(["rolling-long"])  # nothing to match its length to


# regressions found by the eval ----------------------------------------------------------------


def _chapter(i: int, first: int, last: int, tokens: int) -> MemoryItem:
    return MemoryItem("chapter", first, last, f"c{i}", tokens, status="active", id=i, ready_at=0.0)


def test_a_forced_cut_does_not_cancel_the_pending_major_gc() -> None:
    """At a small window a forced cut used to drop the queued major GC and schedule a new one,
    every turn: memory grew until the prompt overflowed."""
    p = LOCAL_8K
    chapters = tuple(_chapter(i, i * 10, i * 10 + 9, 400) for i in range(1, 5))
    raw = [(s, 40) for s in range(50, 50 + 150)]
    state = State(
        profile=p,
        now=100.0,
        raw_start=50,
        raw=raw,
        memory=Memory(chapters=chapters),
        jobs=[PendingJob("synopsis", 10, 29)],
        fixed=sum(c.tokens for c in chapters),  # the memory exchange, rendered
    )
    d = decide(state)
    assert d.forced_cut is not None
    assert not any(j.kind == "synopsis" for j in d.schedule)

    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    syn = store.enqueue_job("c", "synopsis", 0, 29, run_after=0)
    store.enqueue_job("c", "chapter", 30, 39, run_after=0)
    assert store.cancel_jobs("c", 39) == 1
    assert [j.id for j in store.jobs("c", "queued")] == [syn]


def test_a_rolling_rewrite_folds_in_the_stand_in_chapters_a_forced_cut_left() -> None:
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    for i in range(20):
        store.append("c", Message.user(f"message {i} about harbour lanterns"), 8)
    syn = store.add_item("c", replace(_chapter(0, 0, 9, 50), kind="synopsis", id=None))
    ch = store.add_item("c", replace(_chapter(0, 10, 14, 30), id=None))
    store.enqueue_job("c", "rolling", 15, 19, run_after=0, payload={"synopsis_id": syn})
    worker = Worker(store, ExtractiveSummarizer(ScriptEstimator()), LOCAL_8K)
    (job,) = store.jobs("c", "queued")
    task = worker.task_for(job)
    assert task is not None
    assert [c.id for c in task.chapters] == [ch]
    assert task.span == (0, 19)
    outcome = worker.run_once("c")
    assert outcome is not None and outcome.status == "done"
    (item,) = [i for i in store.items("c", "ready") if i.id == outcome.item_id]
    assert set(item.replaces) == {syn, ch}
