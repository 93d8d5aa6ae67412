"""`policy.decide` as a pure table: a state in, a decision out, no database and no clock.

The rules (seed 000 §2): past the trigger schedule, never fold that turn; a ready chapter folds at
the next turn; past the ceiling cut now with a stand-in chapter; after a fold keep the raw target;
a backlog is split into summary-sized chapter jobs; chapters past the major-GC threshold fold into
the synopsis; a revision replaces the stale item it rewrites. The rolling baseline
(`kioku.rolling`) shares the folding and the ceiling but schedules one rewrite, never a major GC.
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
    headroom=400,  # raw target = max(300, 600 - memory - one chapter)
    chapter_tokens=100,
    synopsis_tokens=150,
    major_gc=250,
    summary_chunk=500,
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
    base = State(profile=P, now=NOW, raw_start=0, raw=raw(0, 50), memory=Memory())
    return replace(base, **kw)  # type: ignore[arg-type]


CASES: list[tuple[str, Policy, State, Decision]] = [
    ("below the trigger: nothing", decide, state(raw=raw(0, 90)), Decision()),
    (
        # 1,100 raw tokens > 1,000: keep the raw target (500 = 600 - one chapter) and split the
        # 600 tokens before it into chunks of at most 500; the prompt does not change this turn
        "past the trigger: chapter jobs, no fold",
        decide,
        state(raw=raw(0, 110)),
        Decision(schedule=(JobPlan("chapter", 0, 49, LATER), JobPlan("chapter", 50, 59, LATER))),
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
        "a ready chapter folds at the next turn; the raw window starts after it",
        decide,
        state(raw=raw(0, 80), ready=[item(7, 0, 59)]),
        Decision(activate=(7,), raw_start=60),
    ),
    (
        "a ready chapter under the raw start is discarded (a forced cut covered it)",
        decide,
        state(raw_start=60, raw=raw(60, 20), memory=chapters((0, 59)), ready=[item(7, 0, 29)]),
        Decision(discard=(7,)),
    ),
    (
        # 1,500 > 1,400 with nothing ready: keep the raw target (500), an extractive stand-in
        # records 0..99, queued jobs over it are cancelled; 600 tokens after: no new trigger
        "past the ceiling: forced cut now",
        decide,
        state(raw=raw(0, 150)),
        Decision(raw_start=100, forced_cut=(0, 99), cancel_through=99),
    ),
    (
        # 2 chapters (200) + 1,000 raw: keep max(300, 600 - 300) tokens raw
        "raw target after a fold shrinks as memory grows",
        decide,
        state(raw_start=40, raw=raw(40, 100), memory=chapters((0, 19), (20, 39))),
        Decision(schedule=(JobPlan("chapter", 40, 89, LATER), JobPlan("chapter", 90, 109, LATER))),
    ),
    (
        # memory 600 + 500 raw: the target would be negative; the minimum (300) stays raw
        "raw target never below the minimum",
        decide,
        state(
            raw_start=60,
            raw=raw(60, 50),
            memory=chapters((0, 19), (20, 39), (40, 59), tokens=200),
            jobs=[PendingJob("synopsis", 0, 39)],
        ),
        Decision(schedule=(JobPlan("chapter", 60, 79, LATER),)),
    ),
    (
        "a backlog is split into summary-sized chunks; a huge message is a chunk alone",
        decide,
        # 1,300 tokens: the newest 200 stay raw (the next message would pass 500)
        state(raw=[(0, 300), (1, 200), (2, 600), (3, 100), *raw(4, 10)]),
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
        "a ready synopsis replaces the chapters it folds",
        decide,
        state(
            raw_start=40,
            raw=raw(40, 10),
            memory=chapters((0, 19), (20, 39)),
            ready=[item(9, 0, 19, 80, kind="synopsis", replaces=(1,))],
        ),
        Decision(activate=(9,), retire=(1,)),
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
        Decision(schedule=(JobPlan("rolling", 0, 59, LATER, {"synopsis_id": None}),)),
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


def test_the_trigger_turn_never_folds_and_the_next_turn_does() -> None:
    trigger = state(raw=raw(0, 110))
    first = decide(trigger)
    assert first.schedule and not first.folds and first.raw_start is None
    # the summary lands; the next turn (one more message) applies it: one cache break
    (job, *_) = first.schedule
    ready = item(7, job.first_seq, job.last_seq, ready_at=job.run_after)
    turn = replace(trigger, now=job.run_after, raw=raw(0, 111), ready=[ready])
    second = decide(turn)
    assert second.activate == (7,) and second.raw_start == job.last_seq + 1


def test_forced_cut_overtakes_raw_jobs_but_not_a_major_gc() -> None:
    given = state(
        raw=raw(0, 150),
        jobs=[PendingJob("chapter", 0, 49), PendingJob("synopsis", 0, 0)],
        memory=Memory(),
    )
    d = decide(given)
    assert d.forced_cut == (0, 99) and d.cancel_through == 99
    assert "ceiling: history 1500 > 1400" in " ".join(d.reasons)
