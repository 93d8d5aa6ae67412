"""When to compact: a pure `decide(state) -> Decision`, no I/O, no model calls.

The rules come from a production system that rebuilt its memory five times (seed 000 §2):
- past the trigger, schedule a summary job in the background, delayed, and do NOT fold in that
  turn — folding drops the prompt's prefix and the turn that triggers would re-read everything;
- apply a ready summary at the start of the next turn: one cache break per fold;
- past the ceiling (summaries keep failing), cut anyway — but with an extractive stand-in
  chapter first, so nothing leaves the prompt unrecorded;
- size the raw window after a fold to keep a fixed headroom before the next trigger, shrinking
  as memory grows, never below the minimum;
- a backlog larger than the summarizer can read at once is split into chunk-sized jobs, oldest
  first;
- when chapters pass the major-GC threshold, the older half plus the old synopsis are folded
  into a new synopsis (the only lossy rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kioku.generations import chunks
from kioku.memory import Memory, MemoryItem
from kioku.profiles import Profile
from kioku.queue import JobKind


@dataclass(frozen=True)
class PendingJob:
    kind: JobKind
    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class State:
    profile: Profile
    now: float
    raw_start: int
    raw: Sequence[tuple[int, int]]  # (seq, tokens) of the raw window, oldest first
    memory: Memory
    ready: Sequence[MemoryItem] = ()
    jobs: Sequence[PendingJob] = ()
    # generational: chapters + major GC (kioku) · rolling: one summary rewritten at each fold
    # (the baseline of seeds 002/004, kept for comparison)
    strategy: str = "generational"


@dataclass(frozen=True)
class JobPlan:
    kind: JobKind
    first_seq: int
    last_seq: int
    run_after: float
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    activate: tuple[int, ...] = ()  # ready item ids to put in the prompt now
    retire: tuple[int, ...] = ()  # active items a new synopsis replaces
    discard: tuple[int, ...] = ()  # ready items overtaken (their range is already covered)
    raw_start: int | None = None  # new raw-window start, when it moves
    forced_cut: tuple[int, int] | None = None  # range for an extractive stand-in chapter
    schedule: tuple[JobPlan, ...] = ()
    cancel_through: int | None = None  # cancel queued jobs starting at or before this seq
    reasons: tuple[str, ...] = ()
    revised: tuple[int, ...] = ()  # stale items (edited under memory) their revisions replace

    @property
    def folds(self) -> bool:
        return bool(self.activate or self.retire or self.forced_cut)


def _fold_ready(
    state: State,
) -> tuple[list[int], list[int], list[int], int, list[MemoryItem], MemoryItem | None]:
    """Chain ready chapters from the raw start; apply a ready synopsis whose inputs are active."""
    activate: list[int] = []
    retire: list[int] = []
    discard: list[int] = []
    start = state.raw_start
    chapters = list(state.memory.chapters)
    synopsis = state.memory.synopsis
    due = [
        r
        for r in state.ready
        if r.ready_at <= state.now and r.id is not None and not _revises(r, state.memory)
    ]
    ready_chapters = sorted(
        (r for r in due if r.kind == "chapter"), key=lambda r: (r.first_seq, -r.last_seq)
    )
    for r in ready_chapters:
        assert r.id is not None
        if r.first_seq < start:
            discard.append(r.id)  # a forced cut or a duplicate already covers it
        elif r.first_seq == start:
            activate.append(r.id)
            chapters.append(r)
            start = r.last_seq + 1
    active = {c.id: c for c in chapters if c.id is not None}
    if synopsis and synopsis.id is not None:
        active[synopsis.id] = synopsis
    for r in sorted((r for r in due if r.kind == "synopsis"), key=lambda r: r.last_seq):
        assert r.id is not None
        replaced = [active[i] for i in r.replaces if i in active]
        if len(replaced) != len(r.replaces):
            discard.append(r.id)  # what it would replace is gone (another synopsis won)
            continue
        lo = min((i.first_seq for i in replaced), default=0)
        hi = max((i.last_seq for i in replaced), default=-1)
        # A synopsis folds exactly the items it replaces, and (rolling) may extend them into
        # the raw window, but only contiguously from its start.
        extends = r.last_seq > hi
        if r.first_seq != lo or r.last_seq < hi or (extends and hi + 1 != start):
            discard.append(r.id)
            continue
        activate.append(r.id)
        retire.extend(sorted(r.replaces))
        chapters = [c for c in chapters if c.id not in r.replaces]
        for i in r.replaces:
            active.pop(i, None)
        active[r.id] = r
        synopsis = r
        if extends:
            start = r.last_seq + 1
    return activate, retire, discard, start, chapters, synopsis


def _revises(item: MemoryItem, memory: Memory) -> bool:
    """A revision re-summarizes one stale item after a client edited a message under memory:
    it replaces exactly that item, with the same kind and range (a major GC never does)."""
    return len(item.replaces) == 1 and any(
        i.id == item.replaces[0] and i.kind == item.kind and i.span == item.span
        for i in memory.items
    )


def _swap_revisions(
    state: State, chapters: list[MemoryItem], synopsis: MemoryItem | None
) -> tuple[list[int], list[int], list[int], list[MemoryItem], MemoryItem | None]:
    """Put ready revisions in place of the stale items they rewrite: (activate, revised,
    discard, chapters, synopsis). The raw window does not move."""
    activate: list[int] = []
    revised: list[int] = []
    discard: list[int] = []
    for r in sorted(state.ready, key=lambda r: -(r.id or 0)):  # the newest revision wins
        if r.ready_at > state.now or r.id is None or not _revises(r, state.memory):
            continue
        old = r.replaces[0]
        if r.kind == "chapter" and any(c.id == old for c in chapters):
            chapters = [r if c.id == old else c for c in chapters]
        elif r.kind == "synopsis" and synopsis is not None and synopsis.id == old:
            synopsis = r
        else:
            discard.append(r.id)  # a major GC folded the stale item away in this very fold
            continue
        activate.append(r.id)
        revised.append(old)
    return activate, revised, discard, chapters, synopsis


def _tail_tokens(raw: Sequence[tuple[int, int]], start: int) -> int:
    return sum(t for s, t in raw if s >= start)


def _cut_point(raw: Sequence[tuple[int, int]], start: int, keep: int) -> int:
    """The first seq to keep so that at most `keep` raw tokens remain (at least one message
    stays raw: the newest turn is never summarized before anyone saw a reply to it)."""
    kept = 0
    cut = None
    for s, t in reversed([(s, t) for s, t in raw if s >= start]):
        if cut is not None and kept + t > keep:
            break
        kept += t
        cut = s
    return start if cut is None else cut


def _chunks(
    raw: Sequence[tuple[int, int]], first: int, last: int, chunk: int
) -> list[tuple[int, int]]:
    """Chapter-sized seq ranges covering first..last (the raw window has no gaps)."""
    within = [(s, t) for s, t in raw if first <= s <= last]
    return [(run[0][0], run[-1][0]) for run in chunks(within, chunk, size=lambda st: st[1])]


def decide(state: State) -> Decision:
    p = state.profile
    reasons: list[str] = []
    activate, retire, discard, start, chapters, synopsis = _fold_ready(state)
    swapped, revised, dropped, chapters, synopsis = _swap_revisions(state, chapters, synopsis)
    activate += swapped
    discard += dropped
    if revised:
        reasons.append(f"revision: {len(revised)} stale item(s) re-summarized after an edit")
    if activate:
        reasons.append(f"fold: {len(activate)} ready item(s) applied")
    memory_tokens = sum(c.tokens for c in chapters) + (synopsis.tokens if synopsis else 0)
    raw_tokens = _tail_tokens(state.raw, start)
    history = memory_tokens + raw_tokens

    forced: tuple[int, int] | None = None
    cancel_through: int | None = None
    if history > p.ceiling:
        # Summaries did not arrive in time: cut the oldest raw messages now, recorded by an
        # extractive stand-in chapter so the coverage invariant holds.
        keep = p.raw_target(memory_tokens + p.chapter_tokens)
        cut = _cut_point(state.raw, start, keep)
        if cut > start:
            forced = (start, cut - 1)
            cancel_through = cut - 1
            reasons.append(
                f"ceiling: history {history} > {p.ceiling}, forced cut {start}..{cut - 1}"
            )
            memory_tokens += p.chapter_tokens
            raw_tokens = _tail_tokens(state.raw, cut)
            history = memory_tokens + raw_tokens
            start = cut

    schedule: list[JobPlan] = []
    # a forced cut overtakes the raw-range jobs it covers, never a major GC (its range is memory)
    pending = [
        j for j in state.jobs if not (forced and j.kind != "synopsis" and j.first_seq <= forced[1])
    ]
    waiting_chapters = [
        r
        for r in state.ready
        if r.kind == "chapter" and r.first_seq >= start and r.id not in activate
    ]
    chapter_pending = any(j.kind in ("chapter", "rolling") for j in pending) or bool(
        waiting_chapters
    )
    if state.strategy == "rolling":
        chapter_pending = chapter_pending or any(
            r.kind == "synopsis" and r.id not in activate and r.id not in discard
            for r in state.ready
        )
    if history > p.trigger and not chapter_pending:
        keep = p.raw_target(memory_tokens + p.chapter_tokens)
        cut = _cut_point(state.raw, start, keep)
        if cut > start and state.strategy == "rolling":
            payload: dict[str, Any] = {"synopsis_id": synopsis.id if synopsis else None}
            schedule.append(
                JobPlan("rolling", start, cut - 1, state.now + p.summary_delay_s, payload)
            )
            reasons.append(
                f"trigger: history {history} > {p.trigger}, rolling rewrite to {cut - 1}"
            )
        elif cut > start:
            run_after = state.now + p.summary_delay_s
            for lo, hi in _chunks(state.raw, start, cut - 1, p.summary_chunk):
                schedule.append(JobPlan("chapter", lo, hi, run_after))
            reasons.append(
                f"trigger: history {history} > {p.trigger}, {len(schedule)} chapter job(s) "
                f"for {start}..{cut - 1}"
            )

    synopsis_pending = any(j.kind == "synopsis" for j in pending) or any(
        r.kind == "synopsis" and r.id not in activate and r.id not in discard for r in state.ready
    )
    chapter_tokens = sum(c.tokens for c in chapters)
    if (
        state.strategy == "generational"
        and chapter_tokens > p.major_gc
        and len(chapters) >= 2
        and not synopsis_pending
        and not any(i.stale for i in (*chapters, *([synopsis] if synopsis else [])))
    ):
        older = chapters[: max(1, len(chapters) // 2)]
        ids = [c.id for c in older if c.id is not None]
        payload = {
            "chapter_ids": ids,
            "synopsis_id": synopsis.id if synopsis else None,
        }
        first = synopsis.first_seq if synopsis else older[0].first_seq
        schedule.append(
            JobPlan("synopsis", first, older[-1].last_seq, state.now + p.summary_delay_s, payload)
        )
        reasons.append(f"major GC: chapters {chapter_tokens} > {p.major_gc}, folding {len(ids)}")

    return Decision(
        activate=tuple(activate),
        retire=tuple(retire),
        discard=tuple(discard),
        raw_start=start if start != state.raw_start else None,
        forced_cut=forced,
        schedule=tuple(schedule),
        cancel_through=cancel_through,
        reasons=tuple(reasons),
        revised=tuple(revised),
    )
