"""A conversation stays answerable whatever its summaries do (issue 21).

The jam this guards against, measured on 36c9307: a summary job whose worker died kept its
600 s lease, the conversation's synopsis could not run beside it, the ceiling kept cutting
extractive stand-ins until memory alone passed the window, and every turn after that was a 400
that blamed the user's message. Here: no summary ever runs, a worker dies or hangs mid-job, the
disk is full, a summary lands late, and every turn is still served, with memory inside its share
of the window and every seq before the raw window covered once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from kioku.engine import Kioku
from kioku.memory import coverage_gaps
from kioku.messages import Message
from kioku.owners import this_host
from kioku.profiles import LOCAL_8K, MEMORY_FRAME_TOKENS
from kioku.store import Store
from kioku.summarizer import ExtractiveSummarizer, Summary, SummaryTask
from kioku.tokens import ScriptEstimator
from kioku.worker import Worker
from tests.test_service_support import words

PROFILE = replace(LOCAL_8K, summary_delay_s=0.0)
# what memory may hold: the synopsis, the chapters up to a chapter past the major GC, one more
# a fold adds, and the exchange's frame
SHARE = (
    PROFILE.synopsis_tokens + PROFILE.major_gc + 2 * PROFILE.chapter_tokens + MEMORY_FRAME_TOKENS
)


def chat(kk: Kioku, turns: int, first: int = 0, cid: str = "c") -> list[int]:
    """`turns` turns of ~100 tokens; the memory each prompt carried."""
    conv = kk.conversation(cid, system_prompt="You are Mika.", character="Mika")
    memory = []
    for t in range(first, first + turns):
        prompt = conv.prepare(f"turn {t}: " + words(t, 30))
        conv.record(f"reply {t}: " + words(t + 7, 40))
        memory.append(prompt.account.parts["memory"])
        info = conv.info()
        assert coverage_gaps(kk.store.items(conv.id, "active"), info.raw_start) == []
    return memory


def test_with_no_summary_ever_written_every_turn_is_served_and_memory_keeps_its_share() -> None:
    """No worker at all: forced cuts and extractive synopses alone keep 600 turns answerable
    (on 36c9307, 233 of the same 600 turns failed with memory at 6,873 tokens)."""
    kk = Kioku(Store.open("sqlite://"), profile=PROFILE)
    memory = chat(kk, 600)
    assert max(memory) <= SHARE, (max(memory), SHARE)
    counters = kk.store.counters("c")
    assert counters["stand_in_synopses"] >= 3 and counters["forced_cuts"] >= 20
    (syn,) = [i for i in kk.store.items("c", "active") if i.kind == "synopsis"]
    assert syn.data.get("stand_in") and syn.source == "extractive"


class Chronicler:
    """A model-written summary (source "llm"), its text naming the task, so the test can see
    which item memory holds."""

    def __init__(self) -> None:
        self.extractive = ExtractiveSummarizer(ScriptEstimator())
        self.tasks: list[SummaryTask] = []

    def summarize(self, task: SummaryTask) -> Summary:
        self.tasks.append(task)
        s = self.extractive.summarize(task)
        first, last = task.span
        return replace(s, text=f"LLM {task.kind} {first}-{last}\n{s.text}", source="llm")


def test_the_models_major_gc_replaces_the_extractive_synopsis_that_stood_in_for_it() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=PROFILE)
    chat(kk, 300)  # no worker yet: stand-ins only
    (stand_in,) = [i for i in kk.store.items("c", "active") if i.kind == "synopsis"]
    assert stand_in.data.get("stand_in")
    model = Chronicler()
    worker = Worker(kk.store, model, PROFILE)
    worker.run_until_idle("c")
    replacements = [t for t in model.tasks if t.kind == "synopsis" and t.span == stand_in.span]
    assert replacements, "the major GC the stand-in stood for was never written"
    # it waits for the next fold, so the swap shares that fold's cache break
    counters = kk.store.counters
    turn, folded = 300, False
    while not folded:
        assert turn < 400, "no turn folded"
        folds = counters("c").get("folds", 0)
        chat(kk, 1, first=turn)
        turn += 1
        folded = counters("c").get("folds", 0) > folds
        assert (stand_in.id in {i.id for i in kk.store.items("c", "active")}) is not folded
        worker.run_until_idle("c")
    assert turn > 302, "no turn waited"
    active = {i.id: i for i in kk.store.items("c", "active")}
    assert stand_in.id not in active
    (syn,) = [i for i in active.values() if i.kind == "synopsis"]
    assert syn.source == "llm" and syn.span == stand_in.span
    assert syn.text.startswith(f"LLM synopsis {stand_in.first_seq}-{stand_in.last_seq}")


def seeded(url: str, n: int = 40) -> Store:
    store = Store.open(url)
    store.ensure_conversation("c")
    for i in range(n):
        store.append("c", Message.user(f"message {i} about the lighthouse and the red door"), 12)
    return store


def test_a_synopsis_runs_beside_a_chapter_whose_worker_hangs(tmp_path: Path) -> None:
    """Jobs of a conversation run in two lanes: a chapter held by a live worker that never
    finishes does not hold up the synopsis (nor another chapter: one at a time per lane)."""
    store = seeded(f"sqlite:///{tmp_path / 'k.db'}")
    now = time.time()
    store.enqueue_job("c", "chapter", 0, 9, run_after=0)
    assert store.claim_job("otherhost:1:abcdef01", now, 600) is not None  # hangs there
    store.enqueue_job("c", "chapter", 10, 19, run_after=0)
    store.enqueue_job("c", "synopsis", 0, 9, run_after=0, payload={"chapter_ids": []})
    got = store.claim_job("w2", now, 30)
    assert got is not None and got.kind == "synopsis"
    assert store.claim_job("w3", now, 30) is None  # the second chapter waits for the first


class Sleepy:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.inner = ExtractiveSummarizer(ScriptEstimator())
        self.started = threading.Event()

    def summarize(self, task: SummaryTask) -> Summary:
        self.started.set()
        time.sleep(self.seconds)
        return self.inner.summarize(task)


def test_a_heartbeat_keeps_a_long_summary_leased_past_its_lease(tmp_path: Path) -> None:
    """A summary four times as long as its lease: renewed while it runs, so no other worker
    takes it over, and it is written once."""
    store = seeded(f"sqlite:///{tmp_path / 'k.db'}")
    store.enqueue_job("c", "chapter", 0, 9, run_after=0)
    # a lease long enough that a loaded 2-core CI machine does not miss a renewal (every third
    # of it): at 0.3 s a stall of 0.2 s let the other worker take the job over
    slow = Sleepy(4.0)
    first = Worker(store, slow, PROFILE, lease_s=1.0)
    runner = threading.Thread(target=first.run_once)
    runner.start()
    assert slow.started.wait(10)
    other = Worker(store, Sleepy(0), PROFILE, lease_s=1.0)
    takeovers = []
    while runner.is_alive():
        takeovers.append(other.run_once())
        time.sleep(0.05)
    runner.join()
    assert [t for t in takeovers if t is not None] == []
    (job,) = store.jobs("c")
    assert (job.status, job.attempts) == ("done", 1)
    assert len(store.items("c")) == 1


def test_a_job_whose_worker_died_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    store = seeded(f"sqlite:///{tmp_path / 'k.db'}")
    store.enqueue_job("c", "chapter", 0, 9, run_after=0)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    holder = f"{this_host()}:{int(gone.stdout)}:deadbeef:1"  # a worker that was
    assert store.claim_job(holder, time.time(), 600) is not None  # a lease of 10 minutes
    outcome = Worker(store, Sleepy(0), PROFILE).run_once()
    assert outcome is not None and outcome.status == "done"
    (job,) = store.jobs("c")
    assert (job.status, job.attempts) == ("done", 2)


def test_a_full_disk_during_a_summary_retries_the_job_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite's max_page_count makes the database full, as a full disk does: the summary cannot
    be stored, the job goes back to the queue (not left running under a lease), and once
    there is room again it is written, once."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store = seeded(url)
    store.enqueue_job("c", "chapter", 0, 9, run_after=0)
    full = {"on": False}

    @event.listens_for(store.engine, "connect")
    def _limit(dbapi: Any, _rec: Any) -> None:
        if full["on"]:
            pages = dbapi.execute("PRAGMA page_count").fetchone()[0]
            dbapi.execute(f"PRAGMA max_page_count = {pages}")

    class FillsTheDisk(Sleepy):
        def summarize(self, task: SummaryTask) -> Summary:
            full["on"] = True
            store.engine.dispose()  # every connection from now on sees a full disk
            out = self.inner.summarize(task)
            return replace(out, text=out.text + " " + "x" * 200_000)

    worker = Worker(store, FillsTheDisk(0), PROFILE, backoff_s=0)
    outcome = worker.run_once()
    assert outcome is not None and outcome.status == "retry"
    assert "full" in outcome.error
    full["on"] = False
    store.engine.dispose()
    (job,) = store.jobs("c")
    assert job.status == "queued"  # not left running: the next try may start now
    assert Worker(store, Sleepy(0), PROFILE).run_once() is not None
    (job,) = store.jobs("c")
    assert job.status == "done" and len(store.items("c")) == 1


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), OSError("connection reset")])
def test_a_job_that_breaks_in_any_way_is_retried_then_failed_never_left_running(
    failure: Exception, tmp_path: Path
) -> None:
    store = seeded(f"sqlite:///{tmp_path / 'k.db'}")
    store.enqueue_job("c", "chapter", 0, 9, run_after=0)

    class Broken:
        def summarize(self, task: SummaryTask) -> Summary:
            raise failure

    worker = Worker(store, Broken(), PROFILE, backoff_s=0, max_attempts=2)
    assert [worker.run_once().status for _ in range(2)] == ["retry", "failed"]  # type: ignore[union-attr]
    (job,) = store.jobs("c")
    assert job.status == "failed" and store.counters("c")["failed_jobs"] == 1
    (logged,) = [e for e in store.log_entries("c") if e["outcome"] == "failed"]
    assert type(failure).__name__ in logged["detail"]


CHILD = """
import sys, time
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.worker import Worker

class Hangs:
    def summarize(self, task):
        print("started", task.kind, flush=True)
        time.sleep(120)

Worker(Store.open(sys.argv[1]), Hangs(), LOCAL_8K).run_once()
"""


@pytest.mark.parametrize("kind", ["chapter", "synopsis"])
def test_a_worker_killed_mid_job_of_either_lane_is_replaced_at_once(
    kind: str, tmp_path: Path
) -> None:
    """kill -9 of a worker process (default name: host, pid, token) in the middle of a chapter
    or a major GC: the next worker on the host takes the job over at once, not after its lease,
    and the job is written once."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    kk = Kioku(Store.open(url), profile=PROFILE)
    chat(kk, 120)  # chapters (stand-ins) to fold
    store = kk.store
    chapters = [i for i in store.items("c", "active") if i.kind == "chapter"]
    if kind == "synopsis":
        ids = [c.id for c in chapters[:2]]
        span = (chapters[0].first_seq, chapters[1].last_seq)
        payload: dict[str, Any] = {"chapter_ids": ids, "synopsis_id": None}
        store.enqueue_job("c", "synopsis", *span, run_after=0, payload=payload)
    else:
        info = store.conversation("c")
        span = (info.raw_start, info.raw_start + 5)
        store.enqueue_job("c", "chapter", *span, run_after=0)
    for j in store.jobs("c", "queued"):
        if (j.kind, j.first_seq) != (kind, span[0]):
            store.finish_job(j.id, "cancelled")
    child = subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().split() == ["started", kind]
    child.kill()
    child.wait(10)
    child.stdout.close()
    (job,) = store.jobs("c", "running")
    assert job.kind == kind
    started = time.monotonic()
    outcome = Worker(store, Sleepy(0), PROFILE).run_once("c")
    assert outcome is not None and outcome.status == "done", outcome
    assert time.monotonic() - started < 5  # at once, not after the 30 s lease
    (again,) = [j for j in store.jobs("c") if j.id == job.id]
    assert (again.status, again.attempts) == ("done", 2)
    ready = [i for i in store.items("c", "ready") if i.span == span]
    assert len(ready) == 1


def test_kioku_bench_stuck_replays_a_conversation_whose_summaries_never_come(
    tmp_path: Path,
) -> None:
    import json as _json

    from kioku.bench.stuck import run
    from kioku.datasets import message_to_json

    path = tmp_path / "chat.jsonl"
    lines = [{"kioku": 1, "system_prompt": "You are Mika.", "character": "Mika"}]
    for n in range(300):
        lines.append(message_to_json(Message.user(f"turn {n}: " + words(n, 40), "Ren")))
        lines.append(message_to_json(Message.assistant(words(n + 5, 40), "Mika")))
    path.write_text("\n".join(_json.dumps(x) for x in lines), encoding="utf-8")
    result = run(path, "kioku", window=3072)
    assert result["user_turns"] == 300 and result["failed_turns"] == 0, result
    assert result["memory_tokens_max"] <= result["memory_share_tokens"]
    assert result["stand_in_synopses"] >= 1


def test_a_prompt_that_memory_alone_overfills_names_memory_not_the_message() -> None:
    """On 36c9307 a turn that memory alone could not fit answered 400 context_length_exceeded,
    "the raw window must be folded first", as if the user's 16-token message were too long."""
    from kioku import context
    from kioku.errors import ContextOverflow
    from kioku.memory import Memory, MemoryItem
    from kioku.messages import LogEntry
    from kioku.service.app import kioku_error

    huge = MemoryItem("chapter", 0, 99, "x " * 9000, 9000, id=1, status="active")
    new = LogEntry(100, Message.user("a short message of a few tokens"), 8)
    with pytest.raises(ContextOverflow) as info:
        context.plan(
            system_prompt="You are Mika.",
            memory=Memory(chapters=(huge,)),
            raw=[],
            new=new,
            profile=PROFILE,
            counter=ScriptEstimator(),
        )
    e = info.value
    assert e.cause == "memory" and "memory leaves no room" in str(e)
    assert "not your message" in str(e)
    response = kioku_error(e)
    assert response.status_code == 503
    assert json.loads(bytes(response.body))["error"]["code"] == "memory_over_budget"
