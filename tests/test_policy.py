"""`policy.decide` as a pure table: a state in, a decision out, no database and no clock.

The rules (seed 000 §2): past the trigger schedule, never fold that turn; a ready chapter folds
just in time, on the first turn whose prompt could not take another message; past the ceiling
cut now with a stand-in chapter, landing `headroom` below it; a chapter takes the oldest
`headroom` tokens, never leaving less than `min_raw` raw; a backlog is split into summary-sized
chapter jobs; chapters past the major-GC threshold fold into the synopsis, which waits for the
next chapter fold; a revision replaces the stale item it rewrites. The rolling baseline
(`kioku.rolling`) shares the folding and the ceiling but folds whatever is ready at once,
schedules one rewrite, never a major GC. Sizes are the rendered prompt's: `fixed` (system prompt
and memory exchange) plus each raw message's tokens.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kioku import rolling
from kioku.memory import ItemKind, Memory, MemoryItem
from kioku.policy import Decision, JobPlan, PendingJob, Policy, State, decide
from kioku.profiles import Profile

NOW = 1000.0
P = Profile(
    name="table",
    window=2000,
    response_reserve=200,
    trigger=1000,
    ceiling=1400,
    min_raw=300,
    headroom=450,  # a chapter takes the oldest 450 tokens (+ its own 100, - half a turn)
    chapter_tokens=100,
    synopsis_tokens=150,
    major_gc=250,
    summary_chunk=600,
    summary_delay_s=30.0,
)
LATER = NOW + P.summary_delay_s


def raw(first: int, n: int, tokens: int = 10) -> list[tuple[int, int]]:
    return [(s, tokens) for s in range(first, first + n)]


def item(
    id: int,
    first: int,
    last: int,
    tokens: int = 100,
    *,
    kind: ItemKind = "chapter",
    ready_at: float = NOW,
    replaces: tuple[int, ...] = (),
    stale: bool = False,
) -> MemoryItem:
    return MemoryItem(
        kind,
        first,
        last,
        f"{kind} {id}",
        tokens,
        id=id,
        ready_at=ready_at,
        replaces=replaces,
        stale=stale,
    )


def chapters(*spans: tuple[int, int], tokens: int = 100) -> Memory:
    return Memory(chapters=tuple(item(i + 1, a, b, tokens) for i, (a, b) in enumerate(spans)))


def state(**kw: object) -> State:
    base = State(profile=P, now=NOW, raw_start=0, raw=raw(0, 50), memory=Memory(), item_overhead=0)
    return replace(base, **kw)  # type: ignore[arg-type]


CASES: list[tuple[str, Policy, State, Decision]] = [
    ("below the trigger: nothing", decide, state(raw=raw(0, 90)), Decision()),
    (
        # 1,100 > 1,000: the oldest 540 tokens (450 headroom + a 100-token chapter - half a
        # turn) become a chapter job; the prompt does not change this turn
        "past the trigger: a chapter job, no fold",
        decide,
        state(raw=raw(0, 110)),
        Decision(schedule=(JobPlan("chapter", 0, 53, LATER),)),
    ),
    (
        "past the trigger with a chapter on its way: wait",
        decide,
        state(raw=raw(0, 110), jobs=[PendingJob("chapter", 0, 59)]),
        Decision(),
    ),
    (
        "past the trigger with a chapter ready later: wait",
        decide,
        state(raw=raw(0, 110), ready=[item(7, 0, 59, ready_at=NOW + 5)]),
        Decision(),
    ),
    (
        "a ready chapter waits while the prompt has room (the window stays full)",
        decide,
        state(raw=raw(0, 120), ready=[item(7, 0, 53)]),
        Decision(),
    ),
    (
        # 1,400 + half a turn would pass the ceiling: the ready chapter folds now
        "a ready chapter folds when the prompt needs the room; the raw window starts after it",
        decide,
        state(raw=raw(0, 140), ready=[item(7, 0, 53)]),
        Decision(activate=(7,), raw_start=54),
    ),
    (
        "a ready chapter under the raw start is discarded (a forced cut covered it)",
        decide,
        state(
            raw_start=60,
            raw=raw(60, 20),
            fixed=100,
            memory=chapters((0, 59)),
            ready=[item(7, 0, 29)],
        ),
        Decision(discard=(7,)),
    ),
    (
        # 1,500 > 1,400 with nothing ready: a 100-token stand-in records the oldest messages
        # so the prompt lands 450 below the ceiling (950: 100 + 850 raw); jobs over it go
        "past the ceiling: forced cut now",
        decide,
        state(raw=raw(0, 150)),
        Decision(raw_start=65, forced_cut=(0, 64), cancel_through=64),
    ),
    (
        # memory 200 + 1,000 raw past the trigger: the chapter takes the same 540 tokens
        "past the trigger with memory: the chapter takes the oldest headroom",
        decide,
        state(raw_start=40, raw=raw(40, 100), fixed=200, memory=chapters((0, 19), (20, 39))),
        Decision(schedule=(JobPlan("chapter", 40, 93, LATER),)),
    ),
    (
        # memory 600 + 500 raw: folding 540 would leave nothing; the minimum (300) stays raw
        "never less than the minimum raw window",
        decide,
        state(
            raw_start=60,
            raw=raw(60, 50),
            fixed=600,
            memory=chapters((0, 19), (20, 39), (40, 59), tokens=200),
            jobs=[PendingJob("synopsis", 0, 39)],
        ),
        Decision(schedule=(JobPlan("chapter", 60, 79, LATER),)),
    ),
    (
        "a backlog is split into summary-sized chunks; a huge message is a chunk alone",
        decide,
        # past the trigger with a wide headroom: 1,100 tokens go, in chunks of at most 500
        replace(
            state(raw=[(0, 300), (1, 200), (2, 600), (3, 100), *raw(4, 40)]),
            profile=replace(P, headroom=900, summary_chunk=500, ceiling=1800),
        ),
        Decision(schedule=(JobPlan("chapter", 0, 1, LATER), JobPlan("chapter", 2, 2, LATER))),
    ),
    (
        "chapters past the major-GC threshold: the older half goes to a new synopsis",
        decide,
        state(raw_start=40, raw=raw(40, 10), memory=chapters((0, 9), (10, 19), (20, 29), (30, 39))),
        Decision(
            schedule=(
                JobPlan("synopsis", 0, 19, LATER, {"chapter_ids": [1, 2], "synopsis_id": None}),
            )
        ),
    ),
    (
        "no major GC while one is on its way",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 10),
            memory=chapters((0, 9), (10, 19), (20, 29), (30, 39)),
            jobs=[PendingJob("synopsis", 0, 19)],
        ),
        Decision(),
    ),
    (
        "no major GC over a stale chapter: its revision comes first",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 10),
            memory=Memory(chapters=(item(1, 0, 19, 150, stale=True), item(2, 20, 39, 150))),
        ),
        Decision(),
    ),
    (
        "a ready synopsis waits for the next chapter fold (one cache break for both)",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 10),
            fixed=200,
            memory=chapters((0, 19), (20, 39)),
            ready=[item(9, 0, 19, 80, kind="synopsis", replaces=(1,))],
        ),
        Decision(),
    ),
    (
        "a ready synopsis replaces the chapters it folds, with the chapter fold",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 120),
            fixed=200,
            memory=chapters((0, 19), (20, 39)),
            ready=[item(9, 0, 19, 80, kind="synopsis", replaces=(1,)), item(7, 40, 93)],
        ),
        Decision(activate=(7, 9), retire=(1,), raw_start=94),
    ),
    (
        "a ready revision takes the stale item's place; the raw window stays",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 10),
            memory=Memory(chapters=(item(1, 0, 19, stale=True), item(2, 20, 39))),
            ready=[item(5, 0, 19, 90, replaces=(1,))],
        ),
        Decision(activate=(5,), revised=(1,)),
    ),
    (
        "rolling: past the trigger, one rewrite of the synopsis with the raw messages",
        rolling.decide,
        state(raw=raw(0, 110)),
        Decision(schedule=(JobPlan("rolling", 0, 53, LATER, {"synopsis_id": None}),)),
    ),
    (
        "rolling: a ready rewrite folds at once",
        rolling.decide,
        state(raw=raw(0, 100), ready=[item(8, 0, 48, kind="synopsis")]),
        Decision(activate=(8,), raw_start=49),
    ),
    (
        "rolling: a ready rewrite not yet applied holds the next one back",
        rolling.decide,
        state(raw=raw(0, 110), ready=[item(8, 0, 59, kind="synopsis", ready_at=NOW + 5)]),
        Decision(),
    ),
    (
        "rolling: never a major GC",
        rolling.decide,
        state(raw_start=40, raw=raw(40, 10), memory=chapters((0, 9), (10, 19), (20, 29), (30, 39))),
        Decision(),
    ),
]


@pytest.mark.parametrize(
    ("policy", "given", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decide(policy: Policy, given: State, expected: Decision) -> None:
    decision = policy(given)
    assert replace(decision, reasons=()) == expected
    # a fold and a schedule say why (a discard is housekeeping)
    assert bool(decision.reasons) == bool(decision.folds or decision.schedule)


def test_the_trigger_turn_never_folds_and_the_fold_comes_when_the_room_is_needed() -> None:
    trigger = state(raw=raw(0, 110))
    first = decide(trigger)
    assert first.schedule and not first.folds and first.raw_start is None
    # the summary lands; the next turns keep the window full until the prompt needs the room,
    # then one turn applies it: one cache break
    (job, *_) = first.schedule
    ready = item(7, job.first_seq, job.last_seq, ready_at=job.run_after)
    turns = [replace(trigger, now=job.run_after, raw=raw(0, n), ready=[ready]) for n in (111, 139)]
    assert [decide(t).folds for t in turns] == [False, False]
    fold = decide(replace(turns[0], raw=raw(0, 140)))
    assert fold.activate == (7,) and fold.raw_start == job.last_seq + 1
    after = replace(turns[0], raw_start=fold.raw_start, raw=raw(fold.raw_start, 92), fixed=100)
    assert not decide(after).folds  # headroom: no fold on the next turn


def test_forced_cut_overtakes_raw_jobs_but_not_a_major_gc() -> None:
    given = state(
        raw=raw(0, 150),
        jobs=[PendingJob("chapter", 0, 49), PendingJob("synopsis", 0, 0)],
        memory=Memory(),
    )
    d = decide(given)
    assert d.forced_cut == (0, 64) and d.cancel_through == 64
    assert "ceiling: prompt 1500 > 1400" in " ".join(d.reasons)


def test_the_trigger_comes_earlier_when_turns_are_long() -> None:
    """A summary scheduled at the trigger must be ready before the ceiling: with 100-token
    messages the trigger moves down to leave six turns of room."""
    long_turns = state(raw=raw(0, 9, 100))
    assert long_turns.trigger == max(P.min_raw, 1400 - 1200)
    assert state(raw=raw(0, 9, 10)).trigger == P.trigger


def test_an_estimated_count_plans_for_less_than_the_ceiling() -> None:
    given = state(raw=raw(0, 135), usable=1300)
    assert given.ceiling == 1300
    assert decide(given).forced_cut is not None


def test_recollections_that_want_more_room_than_the_turn_has_fold_the_ready_chapter() -> None:
    """At 1,200 of 1,400 a turn keeps the window full; one whose recollections want 350 tokens
    folds the chapter waiting (the fold the next turns would need anyway), and the decision
    says it was recall's: a recall break."""
    waiting = state(raw=raw(0, 120), ready=[item(7, 0, 53)])
    assert not decide(waiting).folds
    asked = decide(replace(waiting, recall=350))
    assert asked.activate == (7,) and asked.raw_start == 54 and asked.for_recall
    assert "for 350 tokens of recollections" in " ".join(asked.reasons)
    # recollections the room holds, or nothing ready, change nothing
    assert not decide(replace(waiting, recall=150)).folds
    assert decide(replace(waiting, ready=[], recall=350)) == decide(replace(waiting, ready=[]))
    # a fold the prompt needed anyway is not recall's, whatever the recollections want
    full = decide(replace(waiting, raw=raw(0, 140), recall=350))
    assert full.folds and not full.for_recall


def test_nothing_is_held_free_for_recall_below_the_ceiling() -> None:
    """No standing reservation: the trigger leaves room for the summary's lead only, whatever
    one turn's recollections may take (`Profile.recall_room`)."""
    assert state().trigger == P.trigger
    assert state(profile=replace(P, recall_room=0.9)).trigger == P.trigger


def test_a_late_major_gc_is_folded_by_an_extractive_synopsis_with_the_fold_that_needs_it() -> None:
    """Chapters passed the major-GC threshold (250) and its synopsis is queued but has not come:
    the fold that adds a fourth chapter would take them a chapter past it (400 > 250 + 100), so
    that fold also folds the oldest chapters into an extractive synopsis now, and the model's
    major GC of the same range is scheduled to replace it."""
    given = state(
        raw_start=30,
        raw=raw(30, 110),  # 1,400 with memory: the ready chapter folds now
        fixed=300,
        memory=chapters((0, 9), (10, 19), (20, 29)),
        ready=[item(7, 30, 39)],
        jobs=[PendingJob("synopsis", 0, 19)],
    )
    d = decide(given)
    assert d.activate == (7,) and d.raw_start == 40
    assert d.stand_in_synopsis == (1, 2) and set(d.retire) == {1, 2}
    (job,) = [j for j in d.schedule if j.kind == "synopsis"]
    assert (job.first_seq, job.last_seq) == (0, 19)
    assert job.payload == {"stand_in": True, "chapter_ids": [1, 2], "synopsis_id": None}
    assert any("late major GC" in r for r in d.reasons)
    # a turn that does not fold waits for the model's synopsis (memory only grows at folds)
    quiet = replace(given, raw=raw(30, 60), ready=[])
    assert not decide(quiet).stand_in_synopsis
    # one chapter past the threshold is what a major GC on its way may leave
    within = replace(given, memory=chapters((10, 19), (20, 29)), raw_start=30)
    assert not decide(within).stand_in_synopsis


def test_the_models_synopsis_waits_for_the_next_fold_to_replace_its_stand_in() -> None:
    """The extractive stand-in a late major GC folded is true, only plainer: its replacement is
    a cache break of its own on a turn that folds nothing (CP at 16k through kioku serve broke
    twice in three turns), so it waits for the turn that folds. A revision after a client's
    edit does not wait: the item it replaces says what the client took back."""
    stand_in = replace(item(1, 0, 19, kind="synopsis"), data={"stand_in": True})
    model = item(5, 0, 19, 90, kind="synopsis", replaces=(1,))
    quiet = state(
        raw_start=40,
        raw=raw(40, 10),
        memory=Memory(synopsis=stand_in, chapters=(item(2, 20, 39),)),
        ready=[model],
    )
    assert decide(quiet) == Decision()
    # the turn that folds a chapter swaps it in too: one break for both
    folding = replace(quiet, raw=raw(40, 120), fixed=200, ready=[model, item(7, 40, 93)])
    d = decide(folding)
    assert set(d.activate) == {5, 7} and d.revised == (1,)
    # a stand-in a client's edit made stale is revised at once, like any other item
    edited = replace(quiet, memory=Memory(synopsis=replace(stand_in, stale=True)))
    d = decide(edited)
    assert d.activate == (5,) and d.revised == (1,) and d.raw_start is None


def test_a_chapter_tidied_of_its_habits_waits_for_the_next_fold() -> None:
    """A chapter's copy without the lines become habits since (`kioku.tidy`) changes memory
    where it stands: on a turn that folds nothing that would be a cache break of its own, so
    it is swapped in with the fold, one break for both."""
    old = item(2, 20, 39)
    tidied = replace(item(5, 20, 39, 30, replaces=(2,)), data={"tidied": True})
    quiet = state(raw_start=40, raw=raw(40, 10), memory=Memory(chapters=(old,)), ready=[tidied])
    assert decide(quiet) == Decision()
    folding = replace(quiet, raw=raw(40, 120), fixed=200, ready=[tidied, item(7, 40, 93)])
    d = decide(folding)
    assert set(d.activate) == {5, 7} and d.revised == (2,)


def test_memory_past_the_ceiling_folds_whole_into_an_extractive_synopsis() -> None:
    """A prompt that cannot fit even with the raw window cut to the new message (memory of
    1,500 tokens under a 1,400 ceiling, as a stuck summary once left it): every item folds now,
    and the turn fits."""
    memory = Memory(
        synopsis=item(1, 0, 99, 600, kind="synopsis"),
        chapters=tuple(item(2 + k, 100 + 10 * k, 109 + 10 * k, 100) for k in range(9)),
    )
    given = state(raw_start=190, raw=raw(190, 4), fixed=1500, memory=memory)
    d = decide(given)
    assert d.stand_in_synopsis == tuple(range(1, 11))
    assert any("memory past the ceiling" in r for r in d.reasons)


def test_a_chapter_the_prompt_bound_cuts_short_gets_its_share_of_the_chapter_length() -> None:
    from kioku.generations import chapter_target
    from kioku.profiles import LOCAL_8K, LOCAL_64K

    # local-8k's small model reads 1,400-token prompts: a fold of 2,500 tokens is three
    # chapters, and together they are as long as the one chapter a larger prompt would write
    assert LOCAL_8K.chunk_budget is not None and LOCAL_8K.chunk_budget < LOCAL_8K.summary_chunk
    whole = chapter_target(LOCAL_8K, LOCAL_8K.summary_chunk)
    parts = [chapter_target(LOCAL_8K, n) for n in (1000, 1000, 500)]
    assert whole == LOCAL_8K.chapter_tokens
    assert sum(parts) <= whole + 64 and parts[0] == 120
    # a profile whose bound holds a whole chunk keeps whole chapters (their detail is memory's)
    p16 = LOCAL_64K.scaled(16384)
    assert chapter_target(p16, 3000) == p16.chapter_tokens
    assert chapter_target(p16, 200) == 100  # never more than half of what it reads
