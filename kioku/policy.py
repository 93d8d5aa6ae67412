"""When to compact: a pure `decide(state) -> Decision`, no I/O, no model calls.

The rules come from a production system that rebuilt its memory five times (seed 000 §2):
- past the trigger, schedule a summary job in the background, delayed, and do NOT fold in that
  turn — folding drops the prompt's prefix and the turn that triggers would re-read everything;
- apply a ready summary at the start of a later turn: one cache break per fold. kioku applies
  it just in time, on the first turn whose prompt could not take another message, so the
  window stays full between folds;
- past the ceiling (summaries late or failing), cut anyway — but with an extractive stand-in
  chapter first, so nothing leaves the prompt unrecorded and the turn always fits;
- a fold leaves a fixed headroom below the ceiling (the raw window shrinking as memory grows,
  never below the minimum), so no fold follows another on the next turn;
- a backlog larger than the summarizer can read at once is split into chunk-sized jobs, oldest
  first;
- when chapters pass the major-GC threshold, the older half plus the old synopsis are folded
  into a new synopsis (the only lossy rewrite); a ready synopsis waits for the next chapter
  fold, so the two share one cache break;
- when that synopsis does not come (the summarizer slower than the chat, failing, its job
  stuck) and a fold would take the chapters a chapter past the threshold, an extractive synopsis
  folds them in that same fold, and the model's is written later to replace it at the next
  fold (the stand-in is true, only plainer: not worth a cache break of its own): memory never
  outgrows its share of the window, whatever the summarizer does.

Every size is the rendered prompt's (`kioku.budget`): `State.fixed` is what the prompt holds
besides the raw window (system prompt, memory exchange, the template's tokens for them), and
each raw message counts with its template tokens and the extras its turn was shown.

`decide` runs these rules as steps over a `Plan` (the memory state the turn leads to), so a
baseline policy reuses the steps it shares (`kioku.rolling`: the rolling rewrite kioku is
measured against) and the engine takes whichever `Policy` it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kioku.generations import STAND_IN, TIDIED, chunks_within
from kioku.job import JobKind
from kioku.memory import ItemKind, Memory, MemoryItem
from kioku.profiles import TRANSCRIPT_MESSAGE_TOKENS, Profile


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
    # (seq, rendered tokens) of the raw window, oldest first, the new message last: each
    # message with its template tokens and the extras its turn was shown
    raw: Sequence[tuple[int, int]]
    memory: Memory
    ready: Sequence[MemoryItem] = ()
    jobs: Sequence[PendingJob] = ()
    fixed: int = 0  # rendered tokens besides the raw window: system, memory exchange, template
    item_overhead: int = 16  # what one memory item adds beyond its text (its heading)
    frame: int = 0  # what the memory exchange costs around its items, paid once memory exists
    usable: int | None = None  # prompt tokens the counter lets kioku plan for (estimate margin)
    # tokens the turn's recollections want (`kioku.recall.need`): room made now, never held free
    recall: int = 0

    @property
    def ceiling(self) -> int:
        p = self.profile
        return p.ceiling if self.usable is None else min(p.ceiling, self.usable)

    @property
    def trigger(self) -> int:
        """The profile's trigger, earlier when recent turns are long: a summary scheduled now
        must be ready before the prompt meets the ceiling. Nothing is held below it for recall:
        between folds the raw window fills the window."""
        lead = _turns(self.raw, SUMMARY_LEAD_TURNS)
        return max(self.profile.min_raw, min(self.profile.trigger, self.ceiling - lead))

    @property
    def prompt(self) -> int:
        """The rendered prompt as it stands, with the new message."""
        return self.fixed + _tail_tokens(self.raw, self.raw_start)

    @property
    def needs_room(self) -> bool:
        """The prompt could not take another message of the recent size, or the recollections
        the turn wants: fold what is ready."""
        return self.prompt + max(_turns(self.raw, FOLD_AHEAD_TURNS), self.recall) > self.ceiling

    @property
    def needs_room_for_recall(self) -> bool:
        """Room is needed only because of the turn's recollections: a fold now is recall's."""
        return self.needs_room and self.prompt + _turns(self.raw, FOLD_AHEAD_TURNS) <= self.ceiling


# A summary is scheduled at least this many turns before the ceiling, so its delay (30 s) and
# duration (~30 s) pass while the conversation goes on.
SUMMARY_LEAD_TURNS = 6
# A ready chapter is folded in when the prompt could not take another message of the recent
# size: the window stays as full as it can be, and the turn that folds still fits (the ceiling's
# forced cut is for summaries that are late).
FOLD_AHEAD_TURNS = 0.5


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
    for_recall: bool = False  # the fold makes room for the turn's recollections (a recall break)
    # items an extractive synopsis folds now (a major GC that did not come in time); they are
    # in `retire` too
    stand_in_synopsis: tuple[int, ...] = ()

    @property
    def folds(self) -> bool:
        return bool(self.activate or self.retire or self.forced_cut)


Policy = Callable[[State], Decision]


@dataclass(frozen=True)
class Plan:
    """The memory state a turn leads to, built step by step, and how it gets there."""

    start: int  # the raw window's start after this turn
    chapters: tuple[MemoryItem, ...]
    synopsis: MemoryItem | None
    activate: tuple[int, ...] = ()
    retire: tuple[int, ...] = ()
    discard: tuple[int, ...] = ()
    revised: tuple[int, ...] = ()
    forced: tuple[int, int] | None = None
    stand_in_tokens: int = 0  # the forced cut's extractive chapter, not written yet
    stand_in_synopsis: tuple[int, ...] = ()  # items an extractive synopsis folds now
    schedule: tuple[JobPlan, ...] = ()
    reasons: tuple[str, ...] = ()
    for_recall: bool = False

    @property
    def memory_tokens(self) -> int:
        synopsis = self.synopsis.tokens if self.synopsis else 0
        return sum(c.tokens for c in self.chapters) + synopsis + self.stand_in_tokens

    def fixed(self, state: State) -> int:
        """What the prompt holds besides the raw window once this plan's memory is in it."""
        oh = state.item_overhead
        after = [*self.chapters, *([self.synopsis] if self.synopsis else [])]
        before = state.memory.items
        fixed = state.fixed + sum(i.tokens + oh for i in after) - sum(i.tokens + oh for i in before)
        if self.stand_in_tokens:
            fixed += self.stand_in_tokens + oh
        if (after or self.stand_in_tokens) and not before:
            fixed += state.frame
        return fixed

    def prompt(self, state: State) -> int:
        """The rendered prompt this plan leads to: what the trigger and ceiling measure."""
        return self.fixed(state) + _tail_tokens(state.raw, self.start)

    def decision(self, state: State) -> Decision:
        return Decision(
            activate=self.activate,
            retire=self.retire,
            discard=self.discard,
            raw_start=self.start if self.start != state.raw_start else None,
            forced_cut=self.forced,
            schedule=self.schedule,
            cancel_through=self.forced[1] if self.forced else None,
            reasons=self.reasons,
            revised=self.revised,
            for_recall=self.for_recall,
            stand_in_synopsis=self.stand_in_synopsis,
        )


def decide(state: State) -> Decision:
    """kioku's policy: fold what is ready, cut at the ceiling, fold late major GCs
    extractively, schedule chapters past the trigger, and a major GC when the chapters grow past
    their threshold."""
    plan = fold_ready(state)
    plan = cut_at_ceiling(state, plan)
    plan = stand_in_synopsis(state, plan)
    plan = schedule_chapters(state, plan)
    plan = schedule_major_gc(state, plan)
    return plan.decision(state)


# the steps -------------------------------------------------------------------------------------


def fold_ready(state: State, *, just_in_time: bool = True) -> Plan:
    """Apply what is ready: chapters chained from the raw start, a synopsis whose inputs are
    active, revisions in place of the stale items they rewrite. `just_in_time` (kioku): ready
    chapters and a ready synopsis wait for the turn whose prompt needs the room."""
    hold = just_in_time and not state.needs_room
    activate, retire, discard, start, chapters, synopsis = _fold_ready(state, hold=hold)
    # a fold the turn's recollections asked for (the turn after would not have needed it)
    for_recall = bool(activate) and just_in_time and state.needs_room_for_recall
    swapped, revised, dropped, chapters, synopsis = _swap_revisions(
        state, chapters, synopsis, hold=hold and not activate
    )
    activate += swapped
    discard += dropped
    reasons: list[str] = []
    if revised:
        reasons.append(f"revision: {len(revised)} stale item(s) re-summarized after an edit")
    if activate:
        why = f"for {state.recall} tokens of recollections" if for_recall else "applied"
        reasons.append(f"fold: {len(activate)} ready item(s) {why}")
    return Plan(
        start=start,
        chapters=tuple(chapters),
        synopsis=synopsis,
        activate=tuple(activate),
        retire=tuple(retire),
        discard=tuple(discard),
        revised=tuple(revised),
        reasons=tuple(reasons),
        for_recall=for_recall,
    )


def cut_at_ceiling(state: State, plan: Plan) -> Plan:
    """Summaries did not arrive in time: cut the oldest raw messages now, recorded by an
    extractive stand-in chapter, so the turn fits and the coverage invariant holds. The prompt
    lands where a fold would have left it: `headroom` below the ceiling."""
    p = state.profile
    prompt = plan.prompt(state)
    if prompt <= state.ceiling:
        return plan
    after = replace(plan, stand_in_tokens=plan.stand_in_tokens + p.chapter_tokens).prompt(state)
    # `headroom` below the ceiling, keeping the minimum raw window; but the turn must fit even
    # where that minimum cannot stay (one huge message)
    wanted = _cut_after(state.raw, plan.start, after - (state.ceiling - p.headroom), p.min_raw)
    cut = max(wanted, _cut_after(state.raw, plan.start, after - state.ceiling, 0))
    if cut <= plan.start:
        return plan
    return replace(
        plan,
        start=cut,
        forced=(plan.start, cut - 1),
        stand_in_tokens=plan.stand_in_tokens + p.chapter_tokens,
        reasons=(
            *plan.reasons,
            f"ceiling: prompt {prompt} > {state.ceiling}, forced cut {plan.start}..{cut - 1}",
        ),
    )


def stand_in_synopsis(state: State, plan: Plan) -> Plan:
    """The major GC is late: fold the older chapters (and the synopsis) into an extractive
    synopsis now, and schedule the model's to replace it (`kioku.generations.STAND_IN`).

    Memory grows only at folds (a ready chapter, a forced cut's stand-in), so it is asked when
    this turn folds: chapters a chapter past the major-GC threshold mean the synopsis scheduled
    when they passed it did not come. And at any turn whose prompt does not fit even with the
    raw window cut to the new message (memory itself past the ceiling, as a summarizer slower
    than the chat once let happen): then every item folds, a stale one too."""
    p = state.profile
    chapters = sorted(plan.chapters, key=lambda c: c.first_seq)
    chapter_tokens = sum(c.tokens for c in chapters) + plan.stand_in_tokens
    late = bool(plan.activate or plan.forced) and chapter_tokens > p.major_gc + p.chapter_tokens
    jammed = plan.prompt(state) > state.ceiling
    if not (late or jammed) or not (chapters or jammed and plan.synopsis):
        return plan
    folded: list[MemoryItem] = []
    left = chapter_tokens
    for c in chapters:
        # the older half, or more until the rest is within the threshold, as a major GC folds
        # them; the newest chapter stays
        enough = len(folded) >= len(chapters) // 2 and left <= p.major_gc
        if not jammed and (c.stale or enough or c is chapters[-1]):
            break
        folded.append(c)
        left -= c.tokens
    synopsis = plan.synopsis
    if synopsis is not None and (synopsis.stale and not jammed or synopsis.id is None):
        return plan
    items = ([synopsis] if synopsis else []) + folded
    if not items or len(items) < 2 and not jammed:
        return plan
    ids = tuple(i.id for i in items if i.id is not None)
    first, last = items[0].first_seq, items[-1].last_seq
    stand_in = MemoryItem(
        "synopsis", first, last, "", min(p.synopsis_tokens, sum(i.tokens for i in items))
    )
    payload = {
        STAND_IN: True,
        "chapter_ids": [c.id for c in folded],
        "synopsis_id": synopsis.id if synopsis else None,
    }
    job = JobPlan("synopsis", first, last, state.now + p.summary_delay_s, payload)
    why = "memory past the ceiling" if jammed else f"chapters {chapter_tokens} > {p.major_gc}"
    return replace(
        plan,
        chapters=tuple(c for c in chapters if c not in folded),
        synopsis=stand_in,
        retire=(*plan.retire, *ids),
        stand_in_synopsis=ids,
        schedule=(*plan.schedule, job),
        reasons=(
            *plan.reasons,
            f"late major GC ({why}): extractive synopsis of {first}..{last}, the model's later",
        ),
    )


def pending_jobs(state: State, plan: Plan) -> list[PendingJob]:
    """Jobs still worth waiting for: a forced cut overtakes the raw-range jobs it covers, never
    a major GC (its range is memory)."""
    forced = plan.forced
    return [
        j for j in state.jobs if not (forced and j.kind != "synopsis" and j.first_seq <= forced[1])
    ]


def waiting(state: State, plan: Plan, kind: ItemKind) -> bool:
    """A ready item of `kind` this turn does not apply (a chapter after the raw start, or a
    synopsis neither applied nor discarded): it will be, so nothing new is scheduled for it."""
    if kind == "chapter":
        return any(
            r.kind == "chapter" and r.first_seq >= plan.start and r.id not in plan.activate
            for r in state.ready
        )
    return any(
        r.kind == kind and r.id not in plan.activate and r.id not in plan.discard
        for r in state.ready
    )


def trigger_cut(state: State, plan: Plan) -> int | None:
    """Past the trigger: the first seq to keep raw (None: not past the trigger, or nothing to
    summarize). The chapter takes the oldest `headroom` tokens (and its own size), less the
    message that comes before the fold is needed: however late the fold, the prompt then has
    `headroom` of room again. At least `min_raw` stays raw."""
    p = state.profile
    if plan.prompt(state) <= state.trigger:
        return None
    drop = p.headroom + p.chapter_tokens + state.item_overhead
    drop -= _turns(state.raw, FOLD_AHEAD_TURNS)
    cut = _cut_after(state.raw, plan.start, drop, p.min_raw)
    return cut if cut > plan.start else None


def schedule_chapters(state: State, plan: Plan) -> Plan:
    """Past the trigger, with no chapter on its way: chapter jobs for the raw messages to fold,
    split into summary-sized chunks, delayed (the fold waits for the next turn)."""
    pending = pending_jobs(state, plan)
    if any(j.kind in ("chapter", "rolling") for j in pending) or waiting(state, plan, "chapter"):
        return plan
    cut = trigger_cut(state, plan)
    if cut is None:
        return plan
    p = state.profile
    run_after = state.now + p.summary_delay_s
    jobs = tuple(
        JobPlan("chapter", lo, hi, run_after)
        for lo, hi in _chunks(state.raw, plan.start, cut - 1, p.summary_chunk, p.chunk_budget)
    )
    reason = (
        f"trigger: prompt {plan.prompt(state)} > {state.trigger}, {len(jobs)} chapter job(s) "
        f"for {plan.start}..{cut - 1}"
    )
    return replace(plan, schedule=(*plan.schedule, *jobs), reasons=(*plan.reasons, reason))


def schedule_major_gc(state: State, plan: Plan) -> Plan:
    """Chapters past the major-GC threshold: fold the older half, with the synopsis, into a new
    synopsis (never over a stale item: its revision comes first)."""
    p = state.profile
    chapters, synopsis = plan.chapters, plan.synopsis
    chapter_tokens = sum(c.tokens for c in chapters)
    pending = pending_jobs(state, plan)
    if (
        chapter_tokens <= p.major_gc
        or len(chapters) < 2
        or plan.stand_in_synopsis
        or any(j.kind == "synopsis" for j in pending)
        or waiting(state, plan, "synopsis")
        or any(i.stale for i in (*chapters, *([synopsis] if synopsis else [])))
    ):
        return plan
    older = chapters[: max(1, len(chapters) // 2)]
    ids = [c.id for c in older if c.id is not None]
    payload = {"chapter_ids": ids, "synopsis_id": synopsis.id if synopsis else None}
    first = synopsis.first_seq if synopsis else older[0].first_seq
    job = JobPlan("synopsis", first, older[-1].last_seq, state.now + p.summary_delay_s, payload)
    reason = f"major GC: chapters {chapter_tokens} > {p.major_gc}, folding {len(ids)}"
    return replace(plan, schedule=(*plan.schedule, job), reasons=(*plan.reasons, reason))


# helpers ---------------------------------------------------------------------------------------


def _fold_ready(
    state: State, *, hold: bool = False
) -> tuple[list[int], list[int], list[int], int, list[MemoryItem], MemoryItem | None]:
    """Chain ready chapters from the raw start; apply a ready synopsis whose inputs are active.
    `hold`: apply neither now (they wait for the turn that needs the room)."""
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
        elif r.first_seq == start and not hold:
            activate.append(r.id)
            chapters.append(r)
            start = r.last_seq + 1
    active = {c.id: c for c in chapters if c.id is not None}
    if synopsis and synopsis.id is not None:
        active[synopsis.id] = synopsis
    synopses = (
        [] if hold else sorted((r for r in due if r.kind == "synopsis"), key=lambda r: r.last_seq)
    )
    for r in synopses:
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
    state: State, chapters: list[MemoryItem], synopsis: MemoryItem | None, *, hold: bool = False
) -> tuple[list[int], list[int], list[int], list[MemoryItem], MemoryItem | None]:
    """Put ready revisions in place of the stale items they rewrite: (activate, revised,
    discard, chapters, synopsis). The raw window does not move. `hold`: the turn folds nothing,
    so the model's version of an extractive stand-in waits for the turn that does (the stand-in
    is true, only plainer: swapping it now would be a cache break of its own); a revision after
    an edit never waits, since the item it replaces says what the client took back."""
    activate: list[int] = []
    revised: list[int] = []
    discard: list[int] = []
    stand_ins = (
        {i.id for i in state.memory.items if i.data.get(STAND_IN) and not i.stale}
        if hold
        else set()
    )
    for r in sorted(state.ready, key=lambda r: -(r.id or 0)):  # the newest revision wins
        if r.ready_at > state.now or r.id is None or not _revises(r, state.memory):
            continue
        old = r.replaces[0]
        # a chapter tidied of its habits (`kioku.tidy`) waits for a fold as a stand-in does
        if hold and (old in stand_ins or r.data.get(TIDIED)):
            continue
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


def _cut_after(raw: Sequence[tuple[int, int]], start: int, drop: int, keep: int) -> int:
    """The first seq to keep when about `drop` tokens are folded from the raw start, keeping
    at least `keep` tokens raw (and always the newest message: a turn is never summarized
    before anyone saw a reply to it)."""
    rest = _tail_tokens(raw, start)
    dropped = 0
    for s, t in raw:
        if s < start:
            continue
        if dropped >= drop or rest - t < keep or s == raw[-1][0]:
            return s
        dropped += t
        rest -= t
    return start


def _turns(raw: Sequence[tuple[int, int]], n: float) -> int:
    """Tokens `n` turns (a message and its reply each) of the recent size take (the median
    message: a turn that was shown a recollection is not what the next turns look like)."""
    recent = sorted(t for _, t in raw[-20:])
    return round(2 * n * recent[len(recent) // 2]) if recent else 0


def _chunks(
    raw: Sequence[tuple[int, int]], first: int, last: int, chunk: int, prompt: int | None = None
) -> list[tuple[int, int]]:
    """Chapter-sized seq ranges covering first..last (the raw window has no gaps): at most
    `chunk` raw tokens each, and, when the profile bounds the chronicler's prompt, at most
    `prompt` tokens with what its transcript adds to each message (`Profile.chunk_budget`)."""
    within = [(s, t) for s, t in raw if first <= s <= last]
    bounds: list[tuple[int, Callable[[tuple[int, int]], int]]] = [(chunk, lambda st: st[1])]
    if prompt is not None:
        bounds.append((prompt, lambda st: st[1] + TRANSCRIPT_MESSAGE_TOKENS if st[1] else 0))
    return [(run[0][0], run[-1][0]) for run in chunks_within(within, bounds)]
