"""Compaction: deciding at each turn what to fold, schedule or cut, and storing the decision.

`Conversation` asks its `Compactor` before every prompt, with the turn's `TurnState`; the
compactor holds the engine's parts it needs (`Engine`), never the conversation. The policy
(`kioku.policy`, or `kioku.rolling` for the baseline) decides on token sizes of the rendered
prompt, counted here once per memory state; the decision (a fold with its retirements, the jobs it cancels and
schedules, a stand-in chapter for a forced cut) is stored in one transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kioku import context, dates, policy
from kioku.budget import Margin, template_of, usable
from kioku.chronicle_prompt import chapter_ranges
from kioku.context import extras_of
from kioku.errors import ModelError, StoreError
from kioku.generations import STAND_IN, chapter_task, item_from_summary, synopsis_task
from kioku.hooks import TurnHooks
from kioku.memory import MemoryItem
from kioku.messages import Message
from kioku.outcomes import (
    FALLBACK,
    fallback_data,
    reason_of,
    reason_of_failure,
    stand_in,
    why,
)
from kioku.store.protocols import TurnStore
from kioku.summarizer import Summarizer
from kioku.tokens import TokenCounter
from kioku.turn_state import TurnState

log = logging.getLogger("kioku.compaction")

# Tokens the policy plans below the usable budget: its per-message sums and the prompt's
# template total round differently by a token or two.
ROUNDING_SLACK = 4
# Beyond what was missing, how much more a squeeze cuts (so the retry surely fits).
SQUEEZE_SLACK = 16


@dataclass(frozen=True)
class TurnReport:
    """What `prepare()` did besides building the prompt: for logs, the demo and benchmarks."""

    folded: bool = False
    forced_cut: tuple[int, int] | None = None
    major_gc: bool = False
    scheduled: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    for_recall: bool = False  # the fold made room for the turn's recollections


class Engine(Protocol):
    """What the compactor needs of the engine (`kioku.engine.Kioku` is one)."""

    @property
    def store(self) -> TurnStore: ...
    @property
    def tenant(self) -> str: ...
    @property
    def counter(self) -> TokenCounter: ...
    @property
    def margin(self) -> Margin: ...
    @property
    def memory_in_system(self) -> bool: ...
    @property
    def policy(self) -> policy.Policy: ...
    @property
    def strategy(self) -> str: ...
    @property
    def summarizer(self) -> Summarizer: ...
    @property
    def extractive(self) -> Summarizer: ...
    @property
    def layers(self) -> TurnHooks: ...

    def clock(self) -> float: ...
    def poke_worker(self) -> None: ...


class Compactor:
    """One conversation's compaction, with the head-token count it caches between turns."""

    def __init__(self, engine: Engine, conversation_id: str) -> None:
        self.engine = engine
        self.id = conversation_id
        self._head_cache: tuple[object, tuple[int, int]] | None = None

    def head_tokens(self, turn: TurnState) -> tuple[int, int]:
        """(rendered tokens of everything but the raw window, what an empty memory exchange's
        frame would cost): counted once per memory state, not every turn."""
        k, info, memory = self.engine, turn.info, turn.memory
        key = (
            info.system_prompt,
            info.memory_version,
            memory.notes,
            tuple((i.id, i.stale, i.tokens) for i in memory.items),
            getattr(k.counter, "observations", 0),  # a calibrating count moves
        )
        if self._head_cache is None or self._head_cache[0] != key:
            head = context.head_tokens(
                info.system_prompt, memory, k.counter, turn.lang, k.memory_in_system
            )
            self._head_cache = (key, head)
        return self._head_cache[1]

    def compact(
        self,
        turn: TurnState,
        reread: Callable[[], TurnState],
        squeeze: int = 0,
        recall: int = 0,
    ) -> tuple[TurnReport, TurnState]:
        """Decide on `turn` and apply the decision; return what happened and the state to build
        the prompt from (`turn` itself unless a fold changed it: then `reread()`). `squeeze`:
        plan for that many tokens less (the prompt was found that much too long); `recall`:
        tokens the turn's recollections want (`policy.State.recall`: a ready chapter folds to
        make the room)."""
        k, store = self.engine, self.engine.store
        info, raw = turn.info, turn.window
        jobs = [
            policy.PendingJob(j.kind, j.first_seq, j.last_seq)
            for j in store.jobs(self.id, "queued", "running")
        ]
        now = k.clock()
        prof = turn.profile
        per_message = template_of(k.counter).per_message
        sizes = []
        total = counted = 0.0
        previous: Message | None = None
        for e in raw:
            if e.message.is_empty():
                continue  # a message a client deleted: not in the prompt
            x = extras_of(e)
            line = dates.line_for(e.message, previous, turn.lang, e.seq > 0)
            previous = e.message
            # rounded as a running total, so that any run of messages adds up as the prompt's
            # template tokens do (`Template.messages`), a fractional overhead included
            total += e.tokens + per_message + (x.tokens if x else 0)
            total += dates.line_tokens(line, e.message, k.counter)
            sizes.append((e.seq, round(total) - round(counted)))
            counted = total
        fixed, frame = self.head_tokens(turn)
        decision = k.policy(
            policy.State(
                profile=prof,
                now=now,
                raw_start=info.raw_start,
                raw=sizes,
                memory=turn.memory,
                ready=turn.ready,
                jobs=jobs,
                fixed=fixed,
                frame=frame,
                usable=usable(prof.prompt_budget, k.margin.share) - ROUNDING_SLACK - squeeze,
                recall=recall,
            )
        )
        report = TurnReport(
            folded=decision.folds,
            forced_cut=decision.forced_cut,
            major_gc=bool(decision.retire),
            scheduled=tuple(p.kind for p in decision.schedule),
            reasons=decision.reasons,
            for_recall=decision.for_recall,
        )
        writes = decision.discard or decision.schedule or decision.cancel_through is not None
        if not (decision.folds or writes):
            return report, turn  # the common turn: nothing to store
        add: list[MemoryItem] = []
        if decision.forced_cut:
            lo, hi = decision.forced_cut
            entries = [e for e in raw if lo <= e.seq <= hi]
            task = chapter_task(entries, prof, lang=turn.lang, character=info.character)
            item = item_from_summary(task, k.extractive.summarize(task), ready_at=now)
            late = self._why_late(lo, hi, decision.reasons)
            add.append(replace(item, data={**item.data, FALLBACK: late}))
        if decision.stand_in_synopsis:
            add.append(self._stand_in_synopsis(decision.stand_in_synopsis, turn, now))
        try:
            with store.atomic():
                if decision.forced_cut:
                    # the stand-in chapter had no summary job: the notes of its range now
                    k.layers.cut_written(self.id, entries)
                self.apply(decision, turn, add)
        except StoreError as e:
            if not decision.folds:
                raise
            # Another process folded first; its state is as good as ours.
            store.log(self.id, "fold", "skipped", detail=str(e))
            return TurnReport(reasons=(*decision.reasons, f"fold skipped: {e}")), reread()
        if decision.folds:
            log.info("%s", fold_line(self.id, decision, turn, add))
        if decision.schedule:
            k.poke_worker()
        return report, reread() if decision.folds else turn

    def _why_late(self, first: int, last: int, reasons: tuple[str, ...]) -> dict[str, str]:
        """Why a forced cut's stand-in was needed: the model's failure that kept the range's
        summary from coming (a timeout, a server down), when a job recorded one; else that the
        summaries were late."""
        jobs = self.engine.store.jobs(self.id, "queued", "running", "failed")
        tried = [
            j
            for j in jobs
            if j.kind != "synopsis" and j.first_seq <= last and j.last_seq >= first and j.error
        ]
        for job in sorted(tried, key=lambda j: j.id, reverse=True):
            reason = reason_of_failure(job.error)
            if reason:
                return fallback_data(reason, f"summaries late at the ceiling; {job.error}")
        return fallback_data("late", "; ".join(reasons))

    def _stand_in_synopsis(self, ids: tuple[int, ...], turn: TurnState, now: float) -> MemoryItem:
        """The extractive synopsis of the items a late major GC folds now (no model call)."""
        by_id = {i.id: i for i in (*turn.memory.items, *turn.ready)}
        folded = [by_id[i] for i in ids]
        previous = next((i for i in folded if i.kind == "synopsis"), None)
        chapters = [i for i in folded if i.kind == "chapter"]
        task = synopsis_task(
            previous, chapters, turn.profile, lang=turn.lang, character=turn.info.character
        )
        item = item_from_summary(task, self.engine.extractive.summarize(task), ready_at=now)
        late = fallback_data("late", "the major GC was late")
        return replace(item, data={**item.data, STAND_IN: True, FALLBACK: late})

    def refresh_notes(self, turn: TurnState) -> None:
        """Render the notes into the memory exchange now (at a fold, or after an operator edit),
        under the memory version the fold left."""
        k = self.engine
        text = k.layers.notes(turn)
        if text is not None:
            version = k.store.conversation(self.id, tenant=k.tenant).memory_version
            k.store.set_notes_snapshot(self.id, text, version)

    def apply(self, decision: policy.Decision, turn: TurnState, add: list[MemoryItem]) -> None:
        """Store a decision: a fold with its retirements, notes snapshot, counters and log line,
        and the jobs it cancels and schedules. The caller holds one transaction around it."""
        k, info, cid = self.engine, turn.info, self.id
        store = k.store
        store.retire_items(cid, decision.discard)
        if decision.folds:
            raw_start = decision.raw_start if decision.raw_start is not None else info.raw_start
            store.fold(
                cid,
                activate=decision.activate,
                retire=(*decision.retire, *decision.revised),
                raw_start=raw_start,
                expect_raw_start=info.raw_start,
                add=add,
            )
            store.incr(cid, "folds")
            if decision.for_recall:
                store.incr(cid, "recall_breaks")
            self.refresh_notes(turn)
            if decision.retire and k.strategy == "generational":
                store.incr(cid, "major_gcs")
            store.log(cid, "fold", "ok", detail="; ".join(decision.reasons))
            if decision.forced_cut:
                store.incr(cid, "forced_cuts")
                first, last = decision.forced_cut
                store.log(cid, "forced_cut", "extractive", first_seq=first, last_seq=last)
            if decision.stand_in_synopsis:
                store.incr(cid, "stand_in_synopses")
                store.log(cid, "synopsis", "stand_in", detail=", ".join(decision.reasons))
        if decision.cancel_through is not None:
            store.cancel_jobs(cid, decision.cancel_through)
        for plan in decision.schedule:
            store.enqueue_job(
                cid, plan.kind, plan.first_seq, plan.last_seq, plan.run_after, plan.payload
            )

    def cut(self, turn: TurnState) -> TurnReport:
        """区切り: fold everything not yet summarized now and start the raw window afresh.

        The summarizer runs synchronously (it is an operator action); the archive and search
        still hold every message. The fold, its retirements, counter and log line are one
        transaction. The caller reads the raw window again afterwards."""
        k, cid, store = self.engine, self.id, self.engine.store
        info, prof, raw, ready = turn.info, turn.profile, turn.window, turn.ready
        if not raw:
            return TurnReport(reasons=("cut: nothing to fold",))
        add: list[MemoryItem] = []
        groups = chapter_ranges(raw, prof, k.counter, turn.lang)
        avoid = tuple(k.layers.avoid_phrases(cid))
        started = time.monotonic()
        for g in groups:
            task = chapter_task(
                g,
                prof,
                lang=turn.lang,
                character=info.character,
                avoid_phrases=avoid,
                kind="cut",
            )
            try:
                summary = k.summarizer.summarize(task)
            except ModelError as e:
                # the operator asked for a cut now: an extractive chapter records the range
                summary = k.extractive.summarize(task)
                reason = reason_of(e)
                detail = f"{type(e).__name__}: {e}"
                summary = replace(
                    summary, data={**summary.data, FALLBACK: fallback_data(reason, detail)}
                )
                store.log(cid, "fallback", f"fell back: {reason}", detail=f"cut: {e}")
                store.incr(cid, "fallbacks")
                log.warning(
                    "cut of %r (seq %s–%s): fell back to extractive, %s (%s)",
                    cid,
                    task.span[0],
                    task.span[1],
                    why(reason),
                    detail,
                )
            add.append(item_from_summary(task, summary, ready_at=k.clock()))
        with store.atomic():
            store.retire_items(  # ready chapters of the raw window; revisions stay ready
                cid,
                [
                    r.id
                    for r in ready
                    if r.kind == "chapter" and r.id is not None and r.first_seq >= info.raw_start
                ],
            )
            store.fold(
                cid,
                activate=(),
                retire=(),
                raw_start=raw[-1].seq + 1,
                expect_raw_start=info.raw_start,
                add=add,
            )
            store.cancel_jobs(cid, raw[-1].seq)
            k.layers.cut_written(cid, raw)
            self.refresh_notes(turn)
            store.incr(cid, "cuts")
            store.log(
                cid,
                "cut",
                "ok",
                duration_s=time.monotonic() - started,
                input_tokens=sum(e.tokens for e in raw),
                output_tokens=sum(i.tokens for i in add),
                first_seq=raw[0].seq,
                last_seq=raw[-1].seq,
            )
        log.info(
            "cut of %r: seq %s–%s folded into %s; the raw window starts at %s",
            cid,
            raw[0].seq,
            raw[-1].seq,
            _items_text(add),
            raw[-1].seq + 1,
        )
        return TurnReport(folded=True, reasons=(f"cut: folded {raw[0].seq}..{raw[-1].seq}",))


def _items_text(items: Sequence[MemoryItem]) -> str:
    """ "chapter 12–40 (model), chapter 41–60 (stand-in: the model timed out)"."""
    out = []
    for i in items:
        mark = stand_in(i.data)
        by = f"stand-in: {mark}" if mark else ("model" if i.source == "llm" else "extractive")
        out.append(f"{i.kind} {i.first_seq}–{i.last_seq} ({by})")
    return ", ".join(out) or "nothing"


def fold_line(
    cid: str, decision: policy.Decision, turn: TurnState, add: Sequence[MemoryItem]
) -> str:
    """The serve log's line for a fold: what entered memory (and which of it stands in for
    the model's summary, and why), where the raw window starts, and the policy's reasons."""
    by_id = {i.id: i for i in (*turn.memory.items, *turn.ready)}
    entered = [by_id[i] for i in decision.activate if i in by_id] + list(add)
    start = decision.raw_start if decision.raw_start is not None else turn.info.raw_start
    retired = f", retired {len(decision.retire)}" if decision.retire else ""
    reasons = f" ({'; '.join(decision.reasons)})" if decision.reasons else ""
    return (
        f"fold of {cid!r}: {_items_text(entered)} entered memory{retired}; the raw window "
        f"starts at {start} (was {turn.info.raw_start}){reasons}"
    )
