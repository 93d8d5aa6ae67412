"""Worker processes on a real PostgreSQL: several at once, killed, stopped, through the CLI.

The workers are real processes (`run_jobs`, the loop of `kioku worker`) with a summarizer double
that writes when each job started and ended to a shared file, so the test can check that no two
jobs of one conversation ever ran at the same time and that every job ran to the end once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kioku.messages import Message
from kioku.store import Store
from tests.pg import BACKENDS, backend_url, fresh_schema

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from kioku.profiles import LOCAL_8K
    from kioku.service.worker_cli import run_jobs, stop_on_signals
    from kioku.store import Store
    from kioku.summarizer import ExtractiveSummarizer
    from kioku.tokens import ScriptEstimator
    from kioku.worker import Worker

    url, record, name, lease, seconds, hang_marker, poll = sys.argv[1:8]

    def write(**rec):
        with open(record, "a") as f:  # one short append per line: lines never interleave
            f.write(json.dumps(rec) + "\\n")

    def first_to_hang():
        try:
            os.close(os.open(hang_marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    class Recording:
        def __init__(self):
            self.inner = ExtractiveSummarizer(ScriptEstimator())

        def summarize(self, task):
            conv = task.entries[0].text.split(":")[0]
            span = dict(conv=conv, first=task.entries[0].seq, last=task.entries[-1].seq)
            start = time.time()
            write(event="start", pid=os.getpid(), at=start, **span)
            if hang_marker != "-" and first_to_hang():
                time.sleep(120)  # the test kills this worker here
            time.sleep(float(seconds))
            summary = self.inner.summarize(task)
            write(event="end", pid=os.getpid(), start=start, end=time.time(), **span)
            return summary

    store = Store.open(url)
    worker = Worker(store, Recording(), LOCAL_8K, name=name, lease_s=float(lease))
    stop = threading.Event()
    stop_on_signals(stop)
    print("ready", flush=True)
    ran = run_jobs(worker, stop=stop, poll_s=float(poll))
    print("bye", ran, flush=True)
    """
)


@pytest.fixture
def pg() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


class Workers:
    """Worker processes started by a test; all of them are gone when the test ends."""

    def __init__(self, url: str, record: Path) -> None:
        self.url = url
        self.record = record
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(
        self,
        name: str,
        *,
        lease: float = 60,
        seconds: float = 0.05,
        hang: str = "-",
        poll: float = 0.05,
    ) -> None:
        args = [self.url, str(self.record), name, str(lease), str(seconds), hang, str(poll)]
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs[name] = p

    def wait_ready(self) -> None:
        for name, p in self.procs.items():
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", f"worker {name} did not start"

    def stop(self, name: str, timeout: float = 20) -> str:
        p = self.procs[name]
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker {name} exited {p.returncode}"
        return out

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()

    def records(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


@pytest.fixture
def workers(pg: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(pg, tmp_path / "record.jsonl")
    try:
        yield w
    finally:
        w.close()


def until(
    cond: Callable[[], Any], timeout: float, what: str, check: Callable[[], None] = lambda: None
) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        check()
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def seed(store: Store, conversation: str, n: int) -> None:
    store.ensure_conversation(conversation)
    for i in range(n):
        text = f"{conversation}: message {i} about the lighthouse and the red door"
        store.append(conversation, Message.user(text), 12)


def test_worker_killed_mid_job_with_another_running_job_done_exactly_once(
    workers: Workers, tmp_path: Path
) -> None:
    store = Store.open(workers.url)
    try:
        seed(store, "c", 12)
        before = store.conversation("c")
        job_id = store.enqueue_job("c", "chapter", 0, 7, run_after=0)
        workers.start("w1", lease=3, hang=str(tmp_path / "hang"))
        workers.start("w2", lease=3, hang=str(tmp_path / "hang"))
        workers.wait_ready()

        started = until(workers.records, 30, "a worker to start the job")
        victim = started[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        (dead,) = [n for n, p in workers.procs.items() if p.pid == victim]
        workers.procs[dead].wait(10)
        survivor = "w2" if dead == "w1" else "w1"

        def memory_unchanged_until_done() -> None:
            items = store.items("c")  # read before the job: its item and "done" commit together
            (job,) = store.jobs("c")
            assert not items or job.status == "done"
            info = store.conversation("c")
            assert (info.raw_start, info.memory_version) == (
                before.raw_start,
                before.memory_version,
            )

        until(
            lambda: store.jobs("c")[0].status == "done",
            30,
            "the survivor to take the job over",
            check=memory_unchanged_until_done,
        )
        out = workers.stop(survivor)
        assert out.strip() == "bye 1"

        (job,) = store.jobs("c")
        assert (job.id, job.status, job.attempts) == (job_id, "done", 2)
        items = store.items("c")
        assert [(i.first_seq, i.last_seq, i.status) for i in items] == [(0, 7, "ready")]
        after = store.conversation("c")
        assert (after.next_seq, after.raw_start, after.memory_version) == (12, 0, 0)
        assert [e.text for e in store.entries("c")] == [
            f"c: message {i} about the lighthouse and the red door" for i in range(12)
        ]
        recs = workers.records()
        assert [r["event"] for r in recs] == ["start", "start", "end"]
        assert recs[-1]["pid"] == workers.procs[survivor].pid
        assert [e["event"] for e in store.log_entries("c")].count("chapter") == 1
    finally:
        store.close()


@pytest.mark.slow
def test_many_jobs_many_workers_each_done_once_never_two_of_a_conversation_at_once(
    workers: Workers,
) -> None:
    # fewer conversations than workers, short jobs, eager polling: the workers keep reaching
    # for the same conversation at the same moment
    convs, per_conv, size = ["a", "b"], 12, 2
    store = Store.open(workers.url)
    try:
        for c in convs:
            seed(store, c, per_conv * size)
        for name in ("w1", "w2", "w3"):
            workers.start(name, seconds=0.02, poll=0.005)
        workers.wait_ready()
        due = time.time() + 0.5  # all due at one moment, after every worker is up
        for k in range(per_conv):
            for c in convs:
                store.enqueue_job(c, "chapter", k * size, k * size + size - 1, run_after=due)
        total = len(convs) * per_conv

        def all_done() -> bool:
            return all(j.status == "done" for c in convs for j in store.jobs(c))

        until(all_done, 90, "every job to be done")
        ran = sum(int(workers.stop(n).split()[-1]) for n in ("w1", "w2", "w3"))
        assert ran == total

        for c in convs:
            jobs = store.jobs(c)
            assert len(jobs) == per_conv
            assert all((j.status, j.attempts) == ("done", 1) for j in jobs)
            spans = sorted((i.first_seq, i.last_seq) for i in store.items(c))
            assert spans == [(k * size, k * size + size - 1) for k in range(per_conv)]

        ends = [r for r in workers.records() if r["event"] == "end"]
        assert len(ends) == total
        assert len({(r["conv"], r["first"]) for r in ends}) == total  # each once
        for c in convs:
            runs = sorted((r["start"], r["end"]) for r in ends if r["conv"] == c)
            for (_, end), (start, _) in zip(runs, runs[1:], strict=False):
                assert start >= end, f"two jobs of {c} ran at once"
        assert len({r["pid"] for r in ends}) >= 2, "the jobs were not shared between workers"
    finally:
        store.close()


def test_sigterm_lets_the_current_job_finish_then_exits(workers: Workers) -> None:
    store = Store.open(workers.url)
    try:
        seed(store, "c", 8)
        seed(store, "d", 8)
        store.enqueue_job("c", "chapter", 0, 7, run_after=0)
        store.enqueue_job("d", "chapter", 0, 7, run_after=time.time() + 1)
        workers.start("w", seconds=1.5)
        workers.wait_ready()
        until(workers.records, 30, "the job to start")
        out = workers.stop("w")  # sent mid-job
        assert out.strip() == "bye 1"
        assert [r["event"] for r in workers.records()] == ["start", "end"]
        assert [j.status for j in store.jobs("c")] == ["done"]
        assert [i.status for i in store.items("c")] == ["ready"]
        assert [j.status for j in store.jobs("d")] == ["queued"]  # not started after SIGTERM
    finally:
        store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_kioku_worker_command_runs_the_due_jobs_once(backend: str, tmp_path: Path) -> None:
    with backend_url(backend, tmp_path) as url:
        store = Store.open(url)
        try:
            seed(store, "c", 10)
            store.enqueue_job("c", "chapter", 0, 4, run_after=0)
            store.enqueue_job("c", "chapter", 5, 9, run_after=0)
            cmd = [sys.executable, "-c", "from kioku.cli import main; main()", "worker"]
            args = ["--db", url, "--profile", "local-8k", "--once", "--name", "cli-worker"]
            env = {k: v for k, v in os.environ.items() if not k.startswith("KIOKU_")}
            r = subprocess.run(
                cmd + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, r.stderr
            assert "ran 2 job(s)" in r.stderr
            assert [(j.status, j.attempts) for j in store.jobs("c")] == [("done", 1)] * 2
            items = store.items("c")
            assert [(i.first_seq, i.last_seq, i.source) for i in items] == [
                (0, 4, "extractive"),
                (5, 9, "extractive"),
            ]
        finally:
            store.close()
