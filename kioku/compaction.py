"""Compaction: deciding at each turn what to fold, schedule or cut, and storing the decision.

`Conversation` asks its `Compactor` before every prompt. The policy (`kioku.policy`, or
`kioku.rolling` for the baseline) decides on token sizes of the rendered prompt, counted here
once per memory state; the decision (a fold with its retirements, the jobs it cancels and
schedules, a stand-in chapter for a forced cut) is stored in one transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kioku import context, dates, policy
from kioku.budget import template_of, usable
from kioku.chronicle_prompt import chapter_ranges
from kioku.context import extras_of
from kioku.errors import ModelError, StoreError
from kioku.generations import STAND_IN, chapter_task, item_from_summary, synopsis_task
from kioku.memory import Memory, MemoryItem
from kioku.messages import LogEntry, Message
from kioku.store import ConversationInfo

if TYPE_CHECKING:
    from kioku.engine import Conversation

# Tokens the policy plans below the usable budget: its per-message sums and the prompt's
# template total round differently by a token or two.
ROUNDING_SLACK = 4
# Beyond what was missing, how much more a squeeze cuts (so the retry surely fits).
SQUEEZE_SLACK = 16


@dataclass(frozen=True)
class View:
    """What a turn reads before it decides: the conversation, its raw window and its memory."""

    info: ConversationInfo
    window: list[LogEntry]
    memory: Memory
    ready: list[MemoryItem]  # summaries written and waiting for their fold


@dataclass(frozen=True)
class TurnReport:
    """What `prepare()` did besides building the prompt: for logs, the demo and benchmarks."""

    folded: bool = False
    forced_cut: tuple[int, int] | None = None
    major_gc: bool = False
    scheduled: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class Compactor:
    """One conversation's compaction, with the head-token count it caches between turns."""

    def __init__(self, conv: Conversation) -> None:
        self.conv = conv
        self._head_cache: tuple[object, tuple[int, int]] | None = None

    def head_tokens(self, info: ConversationInfo, memory: Memory) -> tuple[int, int]:
        """(rendered tokens of everything but the raw window, what an empty memory exchange's
        frame would cost): counted once per memory state, not every turn."""
        conv = self.conv
        key = (
            info.system_prompt,
            info.memory_version,
            memory.notes,
            tuple((i.id, i.stale, i.tokens) for i in memory.items),
            getattr(conv.kioku.counter, "observations", 0),  # a calibrating count moves
        )
        if self._head_cache is None or self._head_cache[0] != key:
            k = conv.kioku
            head = context.head_tokens(
                info.system_prompt, memory, k.counter, conv.lang, k.memory_in_system
            )
            self._head_cache = (key, head)
        return self._head_cache[1]

    def compact(self, view: View, squeeze: int = 0, asks: bool = False) -> tuple[TurnReport, View]:
        """Decide on `view` and apply the decision; return what happened and the view to build
        the prompt from (`view` itself unless a fold changed it). `squeeze`: plan for that many
        tokens less (the prompt was found that much too long); `asks`: the turn answers a
        question, whose recollections want room (`policy.State.asks`)."""
        conv = self.conv
        k = conv.kioku
        info, raw = view.info, view.window
        jobs = [
            policy.PendingJob(j.kind, j.first_seq, j.last_seq)
            for j in conv.store.jobs(conv.id, "queued", "running")
        ]
        now = k.clock()
        prof = k.card_profile(info.system_prompt)
        per_message = template_of(k.counter).per_message
        sizes = []
        total = counted = 0.0
        previous: Message | None = None
        for e in raw:
            if e.message.is_empty():
                continue  # a message a client deleted: not in the prompt
            x = extras_of(e)
            line = dates.line_for(e.message, previous, conv.lang, e.seq > 0)
            previous = e.message
            # rounded as a running total, so that any run of messages adds up as the prompt's
            # template tokens do (`Template.messages`), a fractional overhead included
            total += e.tokens + per_message + (x.tokens if x else 0)
            total += dates.line_tokens(line, e.message, k.counter)
            sizes.append((e.seq, round(total) - round(counted)))
            counted = total
        fixed, frame = self.head_tokens(info, view.memory)
        decision = conv.kioku.policy(
            policy.State(
                profile=prof,
                now=now,
                raw_start=info.raw_start,
                raw=sizes,
                memory=view.memory,
                ready=view.ready,
                jobs=jobs,
                fixed=fixed,
                frame=frame,
                usable=usable(prof.prompt_budget, k.margin.share) - ROUNDING_SLACK - squeeze,
                asks=asks,
            )
        )
        report = TurnReport(
            folded=decision.folds,
            forced_cut=decision.forced_cut,
            major_gc=bool(decision.retire),
            scheduled=tuple(p.kind for p in decision.schedule),
            reasons=decision.reasons,
        )
        writes = decision.discard or decision.schedule or decision.cancel_through is not None
        if not (decision.folds or writes):
            return report, view  # the common turn: nothing to store
        add: list[MemoryItem] = []
        if decision.forced_cut:
            lo, hi = decision.forced_cut
            entries = [e for e in raw if lo <= e.seq <= hi]
            task = chapter_task(entries, prof, lang=conv.lang, character=info.character)
            add.append(item_from_summary(task, k.extractive.summarize(task), ready_at=now))
        if decision.stand_in_synopsis:
            add.append(self._stand_in_synopsis(decision.stand_in_synopsis, view, now))
        try:
            with conv.store.atomic():
                if decision.forced_cut:
                    # the stand-in chapter had no summary job: the notes of its range now
                    k.layers.cut_written(conv.id, entries)
                self.apply(decision, info, add)
        except StoreError as e:
            if not decision.folds:
                raise
            # Another process folded first; its state is as good as ours.
            conv.store.log(conv.id, "fold", "skipped", detail=str(e))
            return TurnReport(reasons=(*decision.reasons, f"fold skipped: {e}")), conv.view()
        if decision.schedule:
            k.poke_worker()
        return report, conv.view() if decision.folds else view

    def _stand_in_synopsis(self, ids: tuple[int, ...], view: View, now: float) -> MemoryItem:
        """The extractive synopsis of the items a late major GC folds now (no model call)."""
        conv = self.conv
        k = conv.kioku
        by_id = {i.id: i for i in (*view.memory.items, *view.ready)}
        folded = [by_id[i] for i in ids]
        previous = next((i for i in folded if i.kind == "synopsis"), None)
        chapters = [i for i in folded if i.kind == "chapter"]
        prof = k.card_profile(view.info.system_prompt)
        task = synopsis_task(
            previous, chapters, prof, lang=conv.lang, character=view.info.character
        )
        item = item_from_summary(task, k.extractive.summarize(task), ready_at=now)
        return replace(item, data={**item.data, STAND_IN: True})

    def apply(
        self, decision: policy.Decision, info: ConversationInfo, add: list[MemoryItem]
    ) -> None:
        """Store a decision: a fold with its retirements, notes snapshot, counters and log line,
        and the jobs it cancels and schedules. The caller holds one transaction around it."""
        conv = self.conv
        store, k = conv.store, conv.kioku
        store.retire_items(conv.id, decision.discard)
        if decision.folds:
            raw_start = decision.raw_start if decision.raw_start is not None else info.raw_start
            store.fold(
                conv.id,
                activate=decision.activate,
                retire=(*decision.retire, *decision.revised),
                raw_start=raw_start,
                expect_raw_start=info.raw_start,
                add=add,
            )
            store.incr(conv.id, "folds")
            conv.refresh_notes()
            if decision.retire and k.strategy == "generational":
                store.incr(conv.id, "major_gcs")
            store.log(conv.id, "fold", "ok", detail="; ".join(decision.reasons))
            if decision.forced_cut:
                store.incr(conv.id, "forced_cuts")
                first, last = decision.forced_cut
                store.log(conv.id, "forced_cut", "extractive", first_seq=first, last_seq=last)
            if decision.stand_in_synopsis:
                store.incr(conv.id, "stand_in_synopses")
                store.log(conv.id, "synopsis", "stand_in", detail=", ".join(decision.reasons))
        if decision.cancel_through is not None:
            store.cancel_jobs(conv.id, decision.cancel_through)
        for plan in decision.schedule:
            store.enqueue_job(
                conv.id, plan.kind, plan.first_seq, plan.last_seq, plan.run_after, plan.payload
            )

    def cut(self) -> TurnReport:
        """区切り: fold everything not yet summarized now and start the raw window afresh.

        The summarizer runs synchronously (it is an operator action); the archive and search
        still hold every message. The fold, its retirements, counter and log line are one
        transaction."""
        conv = self.conv
        k = conv.kioku
        info = conv.info()
        prof = k.card_profile(info.system_prompt)
        raw = conv.raw_window(info)
        if not raw:
            return TurnReport(reasons=("cut: nothing to fold",))
        ready = conv.store.items(conv.id, "ready")
        add: list[MemoryItem] = []
        groups = chapter_ranges(raw, prof, k.counter, conv.lang)
        avoid = tuple(k.layers.avoid_phrases(conv.id))
        started = time.monotonic()
        for g in groups:
            task = chapter_task(
                g,
                prof,
                lang=conv.lang,
                character=info.character,
                avoid_phrases=avoid,
                kind="cut",
            )
            try:
                summary = k.summarizer.summarize(task)
            except ModelError as e:
                # the operator asked for a cut now: an extractive chapter records the range
                summary = k.extractive.summarize(task)
                conv.store.log(conv.id, "fallback", "extractive", detail=f"cut: {e}")
                conv.store.incr(conv.id, "fallbacks")
            add.append(item_from_summary(task, summary, ready_at=k.clock()))
        with conv.store.atomic():
            conv.store.retire_items(  # ready chapters of the raw window; revisions stay ready
                conv.id,
                [
                    r.id
                    for r in ready
                    if r.kind == "chapter" and r.id is not None and r.first_seq >= info.raw_start
                ],
            )
            conv.store.fold(
                conv.id,
                activate=(),
                retire=(),
                raw_start=raw[-1].seq + 1,
                expect_raw_start=info.raw_start,
                add=add,
            )
            conv.store.cancel_jobs(conv.id, raw[-1].seq)
            k.layers.cut_written(conv.id, raw)
            conv.refresh_notes()
            conv.store.incr(conv.id, "cuts")
            conv.store.log(
                conv.id,
                "cut",
                "ok",
                duration_s=time.monotonic() - started,
                input_tokens=sum(e.tokens for e in raw),
                output_tokens=sum(i.tokens for i in add),
                first_seq=raw[0].seq,
                last_seq=raw[-1].seq,
            )
        conv.forget_raw_window()
        return TurnReport(folded=True, reasons=(f"cut: folded {raw[0].seq}..{raw[-1].seq}",))
