from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from kioku.engine import Kioku
from kioku.messages import Message
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator
from kioku.worker import Worker
from tests.helpers import Clock, FlakySummarizer

CHILD = textwrap.dedent(
    """
    import sys, time
    from kioku.store import Store
    from kioku.worker import Worker
    from kioku.profiles import LOCAL_8K

    class Slow:
        def summarize(self, task):
            print("started", flush=True)
            time.sleep(60)
            raise SystemExit("never reached")

    store = Store.open(sys.argv[1])
    Worker(store, Slow(), LOCAL_8K, name="doomed", lease_s=60).run_once()
    """
)


def test_worker_killed_mid_job_loses_nothing_and_job_completes_once(tmp_path) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    store.ensure_conversation("c")
    for i in range(12):
        store.append("c", Message.user(f"message number {i} about the lighthouse"), 8)
    job_id = store.enqueue_job("c", "chapter", 0, 7, run_after=0)

    child = subprocess.Popen([sys.executable, "-c", CHILD, db], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)

    (job,) = store.jobs("c")
    assert job.status == "running" and job.attempts == 1
    assert store.items("c") == []  # memory unchanged
    assert store.count_messages("c") == 12  # log unchanged

    # the heir's clock is injected: the dead worker's 60 s lease passes without waiting for it
    clock = Clock(time.time())
    worker = Worker(
        store,
        ExtractiveSummarizer(ScriptEstimator()),
        LOCAL_8K,
        name="heir",
        lease_s=60,
        clock=clock,
    )
    assert worker.run_once() is None  # the dead worker's lease still holds
    clock.advance(61)
    outcome = worker.run_once()
    assert outcome is not None and outcome.status == "done" and outcome.job.id == job_id
    assert worker.run_once() is None  # done exactly once
    items = store.items("c")
    assert [(i.first_seq, i.last_seq, i.status) for i in items] == [(0, 7, "ready")]
    (job,) = store.jobs("c")
    assert job.status == "done" and job.attempts == 2


def test_failed_job_is_retried_with_backoff_then_given_up() -> None:
    clock = Clock(100)
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    for i in range(5):
        store.append("c", Message.user(f"m{i}"), 3)
    store.enqueue_job("c", "chapter", 0, 3, run_after=0)
    summarizer = FlakySummarizer(always_fail=True)
    worker = Worker(store, summarizer, LOCAL_8K, clock=clock, backoff_s=10, max_attempts=3)
    assert worker.run_once().status == "retry"  # type: ignore[union-attr]
    assert worker.run_once() is None  # backing off
    clock.advance(10)
    assert worker.run_once().status == "retry"  # type: ignore[union-attr]
    clock.advance(19)
    assert worker.run_once() is None  # backoff doubled
    clock.advance(1)
    assert worker.run_once().status == "failed"  # type: ignore[union-attr]
    assert len(summarizer.tasks) == 3
    assert store.items("c") == []
    events = [e["event"] for e in store.log_entries("c")]
    assert events.count("retry") == 2 and "chapter" in events


def test_overtaken_job_is_cancelled_not_written() -> None:
    clock = Clock()
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K, clock=clock)
    conv = kk.conversation("c")
    for i in range(6):
        conv.prepare(f"turn {i} with a few words")
        conv.record(f"reply {i}")
    kk.store.enqueue_job("c", "chapter", 0, 5, run_after=0)
    conv.cut()  # the operator folds everything first
    # cut cancels queued jobs it overtakes
    assert [j.status for j in kk.store.jobs("c")] == ["cancelled"]


def test_background_worker_thread_runs_due_jobs() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    conv = kk.conversation("c")
    conv.append(Message.user("hello there, this is a test"))
    kk.store.enqueue_job("c", "chapter", 0, 0, run_after=0)
    bg = kk.start_background(poll_s=0.05)
    try:
        assert kk.start_background(poll_s=0.05) is bg  # one thread, however often started
        deadline = time.time() + 10
        while time.time() < deadline and not kk.store.items("c"):
            time.sleep(0.05)
    finally:
        kk.close()
    assert [i.status for i in kk.store.items("c")] == ["ready"]
    assert kk.start_background(poll_s=0.05) is not bg  # closed: a new one starts
    kk.close()


def test_a_workers_summary_delay_overrides_the_delay_a_job_was_queued_with() -> None:
    """`kioku worker --summary-delay 0` runs what `serve` queued 30 s ahead at once; a retry
    still waits for its backoff."""
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    for i in range(5):
        store.append("c", Message.user(f"m{i}"), 3)
    now = time.time()
    store.enqueue_job("c", "chapter", 0, 3, run_after=now + 30)
    clock = Clock(now + 1)
    patient = Worker(store, FlakySummarizer(always_fail=True), LOCAL_8K, clock=clock)
    assert patient.run_once() is None  # the job's own delay: 29 s to go
    eager = Worker(store, FlakySummarizer(always_fail=True), LOCAL_8K, clock=clock, delay_s=0)
    eager.backoff_s = 10
    assert eager.run_once().status == "retry"  # type: ignore[union-attr]
    assert eager.run_once() is None  # a retry keeps its backoff
    clock.advance(10)
    assert eager.run_once().status == "retry"  # type: ignore[union-attr]
    slower = Worker(store, FlakySummarizer(), LOCAL_8K, clock=Clock(now + 1), delay_s=5)
    store.enqueue_job("c", "chapter", 0, 3, run_after=now + 30)
    assert [j.status for j in store.jobs("c")].count("queued") == 2
    assert slower.run_once() is None  # 5 s after queueing, not yet


def test_a_conversation_begun_again_under_its_id_is_measured_by_its_own_log() -> None:
    habit = "I like the fog."
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    worker = Worker(kk.store, ExtractiveSummarizer(ScriptEstimator()), LOCAL_8K)
    conv = kk.conversation("c")
    for _ in range(3):
        conv.append(Message.user(habit))
    job = kk.store.enqueue_job("c", "chapter", 0, 2, run_after=0)
    task = worker.task_for(next(j for j in kk.store.jobs("c") if j.id == job))
    assert task is not None and task.usage is not None and task.usage.times(habit) == 3
    kk.store.delete_conversation("c")
    conv = kk.conversation("c")  # the same id, another conversation
    for text in ("The ferry leaves at noon.", "Mina bought two tickets.", "It rained."):
        conv.append(Message.user(text))
    job = kk.store.enqueue_job("c", "chapter", 0, 2, run_after=0)
    task = worker.task_for(next(j for j in kk.store.jobs("c") if j.id == job))
    assert task is not None and task.usage is not None and task.usage.times(habit) == 0
