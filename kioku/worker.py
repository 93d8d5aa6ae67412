"""Running summary jobs: durable in the store, leased, retried with backoff, safe to kill.

A job is claimed with a short lease that a heartbeat renews while the summary runs, so a worker
that dies is replaced within a lease (30 s), and at once by a worker of the same host, which
sees that the holder's process is gone (`kioku.owners`); a summary may take as long as it takes.
The summary and the job's completion are written in one transaction, so a worker killed at any
point leaves either nothing (another worker claims the job again) or the finished item, never
half. Whatever else fails inside a job (the model, the disk) retries it with backoff and, in the
end, fails it for good: a conversation never waits on a job nobody runs (the ceiling's extractive
stand-ins cover what a failed job would have). Memory changes only when the engine folds a ready
item in at the start of a turn. The embedded mode runs a `BackgroundWorker` thread; the service
runs `kioku worker` processes, any number of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from kioku.cast import user_of
from kioku.errors import KiokuError, LeaseLost
from kioku.generations import (
    STAND_IN,
    chapter_task,
    item_from_summary,
    replacing_stand_in,
    stand_in_of,
    synopsis_task,
)
from kioku.hooks import TurnHooks
from kioku.lang import detect_lang
from kioku.messages import LogEntry
from kioku.no_layers import NO_LAYERS
from kioku.outcomes import FALLBACK, dropped, dropped_text, event_outcome, reason_of, why
from kioku.owners import may_be_alive, new_owner
from kioku.profiles import Profile
from kioku.revisions import revised_item, revision_task
from kioku.store import DEFAULT_LEASE_S, Job
from kioku.store.protocols import JobStore
from kioku.summarizer import Summarizer, Summary, SummaryTask
from kioku.tidy import tidy_revisions
from kioku.worth import SaidCounts, Usage

log = logging.getLogger("kioku.worker")

DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_BACKOFF_S = 15.0
DEFAULT_POLL_S = 1.0
# A job whose summary has run this long is let go (its lease is no longer renewed), so a worker
# that hangs inside a call that never returns cannot hold a conversation's lane for ever.
DEFAULT_MAX_RUN_S = 1800.0


# done; retry (later, with backoff); failed (for good); overtaken (its range is covered
# already); lost (slower than its lease: another worker's result counts)
Outcome = Literal["done", "retry", "failed", "overtaken", "lost"]


@dataclass(frozen=True)
class JobOutcome:
    job: Job
    status: Outcome
    item_id: int | None = None
    duration_s: float = 0.0
    error: str = ""


class Worker:
    def __init__(
        self,
        store: JobStore,
        summarizer: Summarizer,
        profile: Profile | Callable[[str], Profile],
        *,
        name: str | None = None,
        clock: Callable[[], float] = time.time,
        simulated_duration_s: float = 0.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_s: float = DEFAULT_BACKOFF_S,
        lease_s: float = DEFAULT_LEASE_S,
        layers: TurnHooks = NO_LAYERS,
        delay_s: float | None = None,
        max_run_s: float = DEFAULT_MAX_RUN_S,
    ) -> None:
        """`layers` keep verbal tics out of summaries and learn of each chapter written (notes
        are extracted from it). `delay_s` overrides the summary delay the jobs were queued with
        (`kioku worker --summary-delay`)."""
        self.store = store
        self.summarizer = summarizer
        self._profile = profile
        self.name = name or new_owner(threading.get_ident())
        self.clock = clock
        # In simulations the summary "takes" this long: its item becomes ready only then.
        self.simulated_duration_s = simulated_duration_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.lease_s = lease_s
        self.layers = layers
        self.delay_s = delay_s
        self._said = SaidCounts()  # how often each conversation says each sentence
        self.max_run_s = max_run_s

    def profile_for(self, conversation_id: str) -> Profile:
        return self._profile(conversation_id) if callable(self._profile) else self._profile

    def run_once(
        self, conversation_id: str | None = None, *, ahead_s: float = 0.0
    ) -> JobOutcome | None:
        """Run one due job. `ahead_s` also takes jobs due that much later (an import replays
        the past: its summaries need not wait)."""
        now = self.clock() + ahead_s
        # a job whose worker died on this host is taken over now, not when its lease runs out
        self.store.expire_dead_leases(now, may_be_alive)
        job = self.store.claim_job(self.name, now, self.lease_s, conversation_id, self.delay_s)
        if job is None:
            return None
        return self.execute(job)

    def run_until_idle(
        self, conversation_id: str | None = None, limit: int = 1000, *, ahead_s: float = 0.0
    ) -> int:
        done = 0
        while done < limit and self.run_once(conversation_id, ahead_s=ahead_s) is not None:
            done += 1
        return done

    def task_for(self, job: Job) -> SummaryTask | None:
        """The task a job asks for, with how the conversation so far says its sentences and
        words (`kioku.worth`): what a line tells is measured against the whole log."""
        task = self._task_for(job)
        if task is None:
            return None
        cid = job.conversation_id
        info = self.store.conversation(cid)  # before the log is read
        version = (info.revision, info.created_at)
        usage = self._said.usage(cid, version, lambda first: self.store.entries(cid, first))
        return replace(task, usage=usage)

    def _task_for(self, job: Job) -> SummaryTask | None:
        """The summarizer task for a job, or None when the job was overtaken (its range is
        already covered, or the chapters it would fold are no longer active)."""
        conv = self.store.conversation(job.conversation_id)
        profile = self.profile_for(job.conversation_id)
        avoid = tuple(self.layers.avoid_phrases(job.conversation_id))
        if job.kind == "revision":  # re-summarize an item a client's edit made stale
            return revision_task(self.store, job, profile, conv.character, avoid)
        if job.kind == "synopsis" and job.payload.get(STAND_IN):
            return self._replacement_task(job, conv.character, profile, avoid)
        if job.kind == "synopsis":
            active = {i.id: i for i in self.store.items(job.conversation_id, "active")}
            ids = list(job.payload.get("chapter_ids") or [])
            syn_id = job.payload.get("synopsis_id")
            if any(i not in active for i in ids) or (syn_id is not None and syn_id not in active):
                return None
            chapters = [active[i] for i in ids]
            previous = active[syn_id] if syn_id is not None else None
            lang = detect_lang([c.text for c in chapters[:2]] + [conv.system_prompt])
            return synopsis_task(
                previous,
                chapters,
                profile,
                lang=lang,
                character=conv.character,
                avoid_phrases=avoid,
                user_name=user_of(self.store.tail(job.conversation_id, 8, role="user")),
            )
        if job.first_seq < conv.raw_start:
            return None
        if job.kind == "rolling":
            syn_id = job.payload.get("synopsis_id")
            active = {i.id: i for i in self.store.items(job.conversation_id, "active")}
            if syn_id is not None and syn_id not in active:
                return None
            entries = self.store.entries(job.conversation_id, job.first_seq, job.last_seq)
            # chapters a forced cut added since the last rewrite are folded in with it, or
            # the new summary could never join the raw window (and memory would only grow)
            stand_ins = sorted(
                (i for i in active.values() if i.kind == "chapter"), key=lambda i: i.first_seq
            )
            return SummaryTask(
                kind="synopsis",
                target_tokens=profile.synopsis_tokens,
                previous=active[syn_id] if syn_id is not None else None,
                chapters=tuple(stand_ins),
                entries=tuple(entries),
                ceiling_tokens=profile.summary_ceiling,
                window_tokens=profile.window,
                lang=detect_lang([e.text for e in entries[:20]]),
                character=conv.character,
                user_name=user_of(entries) or "user",
                avoid_phrases=avoid,
            )
        entries = self.store.entries(job.conversation_id, job.first_seq, job.last_seq)
        if not entries:
            return None
        lang = detect_lang([e.text for e in entries[:20]])
        task = chapter_task(
            entries,
            profile,
            lang=lang,
            character=conv.character,
            avoid_phrases=avoid,
            kind=job.kind,
        )
        # The chronicler reads the open threads of the memory so far, to reuse their ids.
        so_far = self.store.items(job.conversation_id, "active")
        synopsis = next((i for i in so_far if i.kind == "synopsis"), None)
        threads_from = tuple(i for i in so_far if i.kind == "chapter")
        return replace(task, previous=synopsis, chapters=threads_from)

    def _replacement_task(
        self, job: Job, character: str, profile: Profile, avoid: tuple[str, ...]
    ) -> SummaryTask | None:
        """The major GC an extractive synopsis stood in for (`policy.stand_in_synopsis`), from
        the items it folded; None once that synopsis is no longer in memory."""
        items = self.store.items(job.conversation_id)
        if stand_in_of(items, job.first_seq, job.last_seq) is None:
            return None
        by_id = {i.id: i for i in items}
        ids = list(job.payload.get("chapter_ids") or [])
        syn_id = job.payload.get("synopsis_id")
        if any(i not in by_id for i in ids) or (syn_id is not None and syn_id not in by_id):
            return None
        chapters = [by_id[i] for i in ids]
        lang = detect_lang([c.text for c in chapters[:2]])
        previous = by_id[syn_id] if syn_id is not None else None
        return synopsis_task(
            previous, chapters, profile, lang=lang, character=character, avoid_phrases=avoid
        )

    def execute(self, job: Job) -> JobOutcome:
        """Run a claimed job under its heartbeat. A failure of any kind (the model, the store,
        a bug) retries the job with backoff, or fails it for good after `max_attempts`."""
        started = time.monotonic()
        with _Heartbeat(self, job):
            try:
                return self._execute(job, started)
            except Exception as e:
                if not isinstance(e, KiokuError):
                    log.exception("job %s (%s) broke", job.id, job.kind)
                return self._failed(job, e, time.monotonic() - started)

    def _execute(self, job: Job, started: float) -> JobOutcome:
        cid = job.conversation_id
        revision = self.store.conversation(cid).revision  # before the job reads the log
        task = self.task_for(job)
        if task is None:
            self.store.finish_job(
                job.id, "cancelled", "overtaken: range already covered", worker=self.name
            )
            self.store.log(
                cid, job.kind, "overtaken", first_seq=job.first_seq, last_seq=job.last_seq
            )
            log.info("%s: overtaken, its range is covered already", job_name(job))
            return JobOutcome(job, "overtaken")
        summary = self.summarizer.summarize(task)
        duration = time.monotonic() - started
        if len(self._unchanged(cid, revision, task.entries)) < len(task.entries):
            # a message it read was deleted or edited meanwhile: what it wrote must not stand
            # (`kioku.takeback`); the policy schedules the range again, an edit its revision
            self.store.finish_job(
                job.id, "cancelled", "overtaken: its messages changed", worker=self.name
            )
            self.store.log(
                cid,
                job.kind,
                "overtaken",
                first_seq=job.first_seq,
                last_seq=job.last_seq,
                detail="its messages changed while it ran",
            )
            return JobOutcome(job, "overtaken")
        item = item_from_summary(task, summary, ready_at=self.clock() + self.simulated_duration_s)
        if job.kind == "revision":
            item = revised_item(self.store, job, item)
        if job.payload.get(STAND_IN):
            stand_in = stand_in_of(self.store.items(cid, "active"), job.first_seq, job.last_seq)
            if stand_in is None:
                self.store.finish_job(job.id, "cancelled", "overtaken: folded", worker=self.name)
                return JobOutcome(job, "overtaken")
            item = replacing_stand_in(stand_in, item)
        try:
            item_id = self.store.complete_job(job.id, cid, item, worker=self.name)
        except LeaseLost as e:
            # slower than the lease: another worker took the job over and its result counts
            self.store.log(cid, job.kind, "lease_lost", duration_s=duration, detail=str(e))
            log.warning("%s: slower than its lease, another worker's result counts", job_name(job))
            return JobOutcome(job, "lost", duration_s=duration, error=str(e))
        if task.kind != "synopsis" and task.usage is not None:
            self._tidy(cid, task.usage, item.ready_at, task.lang)
        try:
            self._written(job, task, summary, duration, revision)
        except KiokuError as e:  # the item stands; only its log lines or notes are missing
            log.warning("job %s done, but not all of it was recorded: %s", job.id, e)
        return JobOutcome(job, "done", item_id, duration)

    def _tidy(self, cid: str, usage: Usage, ready_at: float, lang: str) -> None:
        """Chapters and the synopsis that hold a line become a habit since get a tidied
        revision, swapped in with the fold of the chapter just written (`kioku.tidy`)."""
        ready = self.store.items(cid, "ready")
        for item in tidy_revisions(self.store.items(cid, "active"), ready, usage, ready_at, lang):
            self.store.add_item(cid, item)
            self.store.incr(cid, "habits_tidied")

    def _unchanged(
        self, conversation_id: str, revision: int, entries: Sequence[LogEntry]
    ) -> list[LogEntry]:
        """The `entries` read at `revision` that the log still holds as they were."""
        if not entries or self.store.conversation(conversation_id).revision == revision:
            return list(entries)
        now = {
            e.seq: e.message.content_hash()
            for e in self.store.entries(conversation_id, entries[0].seq, entries[-1].seq)
        }
        return [e for e in entries if now.get(e.seq) == e.message.content_hash()]

    def _written(
        self, job: Job, task: SummaryTask, summary: Summary, duration: float, revision: int
    ) -> None:
        """Log and count a stored summary (in the compaction log and one line of the process's
        log), and let the layers read its messages (notes)."""
        cid = job.conversation_id
        fell_back = fallback_of(summary)
        for ev in summary.events:
            outcome = event_outcome(ev)
            if ev == "fallback" and fell_back:
                outcome = f"{outcome}: {fell_back[0]}"
            self.store.log(
                cid,
                ev,
                outcome,
                first_seq=job.first_seq,
                last_seq=job.last_seq,
                detail=fell_back[1] if ev == "fallback" and fell_back else None,
            )
            self.store.incr(cid, ev)
        log.info("%s", written_line(job, summary, duration))
        if fell_back:
            outcome = "fell back"
        elif summary.source == "extractive":
            outcome = "extractive"
        else:
            outcome = "ok"
        self.store.log(
            cid,
            task.kind,
            outcome,
            duration_s=duration + self.simulated_duration_s,
            input_tokens=summary.input_tokens,
            output_tokens=summary.tokens,
            first_seq=job.first_seq,
            last_seq=job.last_seq,
            detail=f"{summary.model} {summary.prompt_version} attempts={summary.attempts}",
        )
        self.store.incr(cid, "synopses_written" if task.kind == "synopsis" else "chapters_written")
        if task.kind != "synopsis":
            try:
                # only what the user has not taken back meanwhile
                self.layers.chapter_written(cid, self._unchanged(cid, revision, task.entries))
            except KiokuError as e:
                # The chapter stands and covers these messages; only the notes layer missed
                # them. Logged and counted, never silent.
                self.store.log(cid, "notes", "failed", detail=f"{type(e).__name__}: {e}")
                self.store.incr(cid, "notes_failures")

    def _failed(self, job: Job, error: Exception, duration: float) -> JobOutcome:
        cid = job.conversation_id
        msg = f"{type(error).__name__}: {error}"
        try:
            if job.attempts >= self.max_attempts:
                # Give up: the ceiling's extractive stand-in will cover this range if it must.
                self.store.finish_job(job.id, "failed", msg, worker=self.name)
                self.store.log(cid, job.kind, "failed", duration_s=duration, detail=msg)
                self.store.incr(cid, "failed_jobs")
                log.warning(
                    "%s: failed for good after %s attempts, %s (%s); an extractive stand-in "
                    "covers the range if the prompt reaches its ceiling",
                    job_name(job),
                    job.attempts,
                    why(reason_of(error)),
                    msg,
                )
                return JobOutcome(job, "failed", duration_s=duration, error=msg)
            delay = self.backoff_s * (2 ** (job.attempts - 1))
            self.store.retry_job(job.id, self.clock() + delay, msg, worker=self.name)
            self.store.log(cid, "retry", "scheduled", duration_s=duration, detail=msg)
            log.warning(
                "%s: not written, %s (%s); retry in %.0f s (attempt %s of %s)",
                job_name(job),
                why(reason_of(error)),
                msg,
                delay,
                job.attempts,
                self.max_attempts,
            )
        except KiokuError as e:
            # the store refuses even this (a full disk): the heartbeat has stopped, so the
            # lease runs out and another try claims the job then
            log.warning("job %s failed (%s) and could not be rescheduled: %s", job.id, msg, e)
        return JobOutcome(job, "retry", duration_s=duration, error=msg)


def job_name(job: Job) -> str:
    """ "chapter job 7 of 'mika' (seq 12–40)": a job as the log names it."""
    return (
        f"{job.kind} job {job.id} of {job.conversation_id!r} (seq {job.first_seq}–{job.last_seq})"
    )


def fallback_of(summary: Summary) -> tuple[str, str] | None:
    """(reason, detail) when the chronicler fell back to extractive, else None."""
    fb = summary.data.get(FALLBACK) if isinstance(summary.data, dict) else None
    if not isinstance(fb, dict):
        return None
    return str(fb.get("reason") or "model_error"), str(fb.get("detail") or "")


def written_line(job: Job, summary: Summary, duration: float) -> str:
    """The serve log's line for a stored summary: who wrote it, or why an extractive
    stand-in did, and what grounding dropped."""
    spent = f"{summary.attempts} attempt{'s' if summary.attempts != 1 else ''}, {duration:.1f} s"
    fell_back = fallback_of(summary)
    if fell_back:
        reason, detail = fell_back
        said = f": {detail if len(detail) <= 200 else detail[:199] + '…'}" if detail else ""
        what = f"fell back to extractive, {why(reason)} ({spent}){said}"
    elif summary.source == "extractive":
        what = "written extractively (no chronicler model)"
    else:
        what = f"written by the model {summary.model or '?'} ({spent})"
    counts = dropped(summary.events, summary.data)
    return f"{job_name(job)}: {what}{dropped_text(counts)}"


class _Heartbeat:
    """Renews a running job's lease every third of it until the job ends (or runs past the
    worker's `max_run_s`, or another worker has it), in a thread beside the summary."""

    def __init__(self, worker: Worker, job: Job) -> None:
        self.worker = worker
        self.job = job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kioku-lease", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        w = self.worker
        began = time.monotonic()
        while not self._stop.wait(w.lease_s / 3):
            if time.monotonic() - began > w.max_run_s:
                log.warning("job %s ran past %.0f s: its lease is let go", self.job.id, w.max_run_s)
                return
            try:
                if not w.store.renew_job(self.job.id, w.name, w.clock() + w.lease_s):
                    return  # another worker took it over, or it ended
            except KiokuError as e:
                log.warning("could not renew the lease of job %s: %s", self.job.id, e)


class BackgroundWorker:
    """The embedded mode: one daemon thread that runs due jobs, waking on `poke()`."""

    def __init__(self, worker: Worker, poll_s: float = DEFAULT_POLL_S) -> None:
        self.worker = worker
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kioku-worker", daemon=True)
            self._thread.start()
        return self

    def poke(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ran = self.worker.run_once()
            except Exception:  # the thread must survive a bad job; the job's lease will expire
                log.exception("worker loop error")
                ran = None
            if ran is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
