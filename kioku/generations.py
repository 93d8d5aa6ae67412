"""Memory generations: chapters are appended and never rewritten; a major GC folds the older half
of the chapters and the previous synopsis into a new synopsis.

When chapters pass the major-GC threshold and no synopsis comes (the summarizer is slow,
failing, or its job stuck), an extractive synopsis folds them at a turn so memory never outgrows
its share of the window (`policy.stand_in_synopsis`); the major GC it stood in for is still
written by the model later and takes its place like a revision: same kind, same range.

This module turns a job into a summarizer task and a summary into a memory item, without I/O.
Which job to run when is `policy`'s business; running it is the worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Literal, TypeVar

from kioku.cast import character_phrase, user_of
from kioku.memory import ItemStatus, MemoryItem
from kioku.messages import LogEntry
from kioku.profiles import Profile
from kioku.summarizer import Summary, SummaryTask

T = TypeVar("T")

# `data` key of an extractive synopsis that stands in for a late major GC, and the payload key of
# the job that writes that major GC to replace it
STAND_IN = "stand_in"
# `data` key of a chapter's or synopsis's revision that only drops lines become habits
# (`kioku.tidy`): like a stand-in's replacement it waits for a turn that folds anyway
TIDIED = "tidied"


def chunks(items: Iterable[T], budget: int, size: Callable[[T], int]) -> list[list[T]]:
    """A backlog cut into contiguous chapter-sized runs, oldest first: a run closes before the
    item that would take it past `budget`; an item larger than that is a run alone, and items
    of size 0 (deleted messages) join the run that follows them rather than stand alone."""
    runs: list[list[T]] = []
    run: list[T] = []
    used = 0
    for item in items:
        n = size(item)
        if used and used + n > budget:
            runs.append(run)
            run, used = [], 0
        run.append(item)
        used += n
    if run:
        runs.append(run)
    return runs


def chunks_within(
    items: Iterable[T], bounds: Sequence[tuple[int, Callable[[T], int]]]
) -> list[list[T]]:
    """`chunks` under several budgets at once, each with its own size (a chapter bounded by
    its messages' tokens and by the prompt they make): a run closes before the item that
    would take it past any of them."""
    runs: list[list[T]] = []
    run: list[T] = []
    used = [0] * len(bounds)
    for item in items:
        sizes = [size(item) for _, size in bounds]
        if any(used) and any(u + n > b for u, n, (b, _) in zip(used, sizes, bounds, strict=True)):
            runs.append(run)
            run, used = [], [0] * len(bounds)
        run.append(item)
        used = [u + n for u, n in zip(used, sizes, strict=True)]
    if run:
        runs.append(run)
    return runs


def chapter_target(profile: Profile, input_tokens: int) -> int:
    """A chapter never needs to be longer than half of what it summarizes. Where the
    chronicler's prompt bound holds fewer tokens than `summary_chunk` (a local model's:
    local-8k's 1,400-token prompts), each chapter gets its share of `chapter_tokens` by what it
    reads: memory grows by what a fold folds, not by how many prompts reading it took (at a
    whole `chapter_tokens` each, memory folded more often and ran major GCs it need not). A
    profile whose bound only trims chapters of short messages keeps whole ones: at 16k their
    detail is what the strict eval finds in memory, worth the little prefix reuse it costs
    (docs/configuration.md, "Why the defaults")."""
    target = min(profile.chapter_tokens, input_tokens // 2)
    bound = profile.chunk_budget
    if bound is not None and bound < profile.summary_chunk:
        share = profile.chapter_tokens * min(input_tokens, profile.summary_chunk)
        target = min(target, share // profile.summary_chunk)
    return max(64, target)


def chapter_task(
    entries: Sequence[LogEntry],
    profile: Profile,
    *,
    lang: str = "en",
    character: str = "",
    avoid_phrases: Sequence[str] = (),
    kind: Literal["chapter", "cut"] = "chapter",
) -> SummaryTask:
    tokens = sum(e.tokens for e in entries)
    # the names the messages carry (`kioku.cast`): a group's characters, the user's persona
    return SummaryTask(
        kind=kind,
        target_tokens=chapter_target(profile, tokens),
        entries=tuple(entries),
        ceiling_tokens=profile.summary_ceiling,
        window_tokens=profile.window,
        lang=lang,
        character=character_phrase(entries, character, lang),
        user_name=user_of(entries) or "user",
        avoid_phrases=tuple(avoid_phrases),
    )


def synopsis_task(
    previous: MemoryItem | None,
    chapters: Sequence[MemoryItem],
    profile: Profile,
    *,
    lang: str = "en",
    character: str = "",
    avoid_phrases: Sequence[str] = (),
    user_name: str = "",
) -> SummaryTask:
    return SummaryTask(
        kind="synopsis",
        target_tokens=profile.synopsis_tokens,
        previous=previous,
        chapters=tuple(chapters),
        ceiling_tokens=profile.summary_ceiling,
        window_tokens=profile.window,
        lang=lang,
        character=character,
        user_name=user_name or "user",
        avoid_phrases=tuple(avoid_phrases),
    )


def period(task: SummaryTask) -> tuple[str, str] | None:
    """The first and last day (ISO) of what a task records: its messages' dates, or the
    periods of the items a synopsis folds."""
    days = [e.message.at.date().isoformat() for e in task.entries if e.message.at]
    # a chapter task may carry the memory so far for its threads: only a synopsis records it
    folded = ([task.previous] if task.previous else []) + list(task.chapters)
    for item in folded if task.kind == "synopsis" else ():
        span = item.data.get("period") if isinstance(item.data, Mapping) else None
        if isinstance(span, list | tuple) and len(span) == 2:
            days.extend(str(d) for d in span)
    return (min(days), max(days)) if days else None


def item_from_summary(
    task: SummaryTask, summary: Summary, *, ready_at: float, status: ItemStatus = "ready"
) -> MemoryItem:
    first, last = task.span
    replaces: tuple[int, ...] = ()
    if task.kind == "synopsis":
        replaces = tuple(
            i.id
            for i in ([task.previous] if task.previous else []) + list(task.chapters)
            if i.id is not None
        )
    data = dict(summary.data)
    span_dates = period(task)
    if span_dates:
        data["period"] = list(span_dates)
    return MemoryItem(
        kind="synopsis" if task.kind == "synopsis" else "chapter",
        first_seq=first,
        last_seq=last,
        text=summary.text,
        tokens=summary.tokens,
        source=summary.source,
        model=summary.model,
        prompt_version=summary.prompt_version,
        data=data,
        status=status,
        ready_at=ready_at,
        replaces=replaces,
    )


def stand_in_of(items: Iterable[MemoryItem], first: int, last: int) -> MemoryItem | None:
    """The extractive synopsis standing in for the major GC of `first..last`, if it is among
    `items`."""
    return next(
        (
            i
            for i in items
            if i.kind == "synopsis" and i.span == (first, last) and i.data.get(STAND_IN)
        ),
        None,
    )


def replacing_stand_in(stand_in: MemoryItem, item: MemoryItem) -> MemoryItem:
    """The model's synopsis, written to replace `stand_in`: it replaces that one item (same
    kind, same range), so the next fold swaps it in as it does a revision."""
    assert stand_in.id is not None
    return replace(item, replaces=(stand_in.id,))
