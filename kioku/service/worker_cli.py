"""`kioku worker`: a process that runs summary jobs from the database; start as many as you like.

Each worker claims one due job at a time (`Store.claim_job`: `FOR UPDATE SKIP LOCKED` on
PostgreSQL, and never a job of a conversation that another worker is compacting), runs it and
claims the next, so any number of them on any number of machines can share one database. The
job's result and its completion are written in one transaction: a worker killed at any moment
leaves the job to be taken over once its lease (renewed while the job runs) expires, or at once
by a worker on the same host, and nothing half-written.

SIGTERM (or Ctrl-C) lets the current job finish, then exits; a second signal exits at once (the
job's lease then expires and another worker takes it over).
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from kioku.cli_options import SummaryTimeoutOpt
from kioku.job import DEFAULT_LEASE_S  # a value module: `--help` stays light

if TYPE_CHECKING:  # the command line imports the database stack only when a command runs
    from kioku.worker import JobOutcome, Worker

DEFAULT_POLL_S = 1.0

Say = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def describe(o: JobOutcome) -> str:
    j = o.job
    line = f"job {j.id} {j.kind} {j.conversation_id}[{j.first_seq}..{j.last_seq}] {o.status}"
    line += f" in {o.duration_s:.1f}s (attempt {j.attempts})"
    return line + (f": {o.error}" if o.error else "")


def run_jobs(
    worker: Worker,
    *,
    stop: threading.Event,
    poll_s: float = DEFAULT_POLL_S,
    once: bool = False,
    say: Say = _quiet,
) -> int:
    """Run due jobs until `stop` is set (or, with `once`, until none is due); return how many
    ran. A job is never interrupted by `stop`: it is checked between jobs."""
    ran = 0
    while not stop.is_set():
        try:
            outcome = worker.run_once()
        except Exception as e:  # a worker outlives one bad job or a database blip
            if once:
                raise
            say(f"error, retrying in {poll_s}s: {type(e).__name__}: {e}")
            say(traceback.format_exc().rstrip())
            stop.wait(poll_s)
            continue
        if outcome is None:
            if once:
                break
            stop.wait(poll_s)
            continue
        ran += 1
        say(describe(outcome))
    return ran


def stop_on_signals(stop: threading.Event, say: Say = _quiet) -> None:
    """SIGTERM/SIGINT: finish the current job, then stop; a second one: exit now.
    Call from the main thread."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        say(f"{signal.Signals(signum).name}: finishing the current job, then exiting")
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


_DbOpt = Annotated[
    str | None, typer.Option("--db", help="Database URL or SQLite path (env KIOKU_DB).")
]

_SummarizerUpstreamOpt = Annotated[
    str | None,
    typer.Option(
        "--summarizer-upstream",
        help="OpenAI-compatible base URL of the chronicler's model (env KIOKU_SUMMARIZER_URL)."
        " Without one, chapters are extractive.",
    ),
]

_SummarizerModelOpt = Annotated[
    str | None, typer.Option("--summarizer-model", help="Model name to ask the upstream for.")
]

_ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="local-64k, cloud-1m or local-8k; the same as `serve`."),
]

_WindowOpt = Annotated[
    int | None,
    typer.Option(
        "--window",
        help="Scale the profile to this window (tokens; default: asked of the upstream, as "
        "`kioku serve --window auto` does).",
    ),
]

_PollOpt = Annotated[
    float, typer.Option("--poll", help="Seconds between looks when no job is due.")
]

_OnceOpt = Annotated[bool, typer.Option("--once", help="Run the jobs that are due now, then exit.")]

_NameOpt = Annotated[
    str | None, typer.Option("--name", help="Worker name in the jobs table (host:pid).")
]

_LeaseOpt = Annotated[
    float,
    typer.Option(
        "--lease",
        help="Seconds a job stays claimed without its worker renewing it (every third of "
        "it, while the job runs) before others may take it.",
    ),
]

_SummaryDelayOpt = Annotated[
    float | None,
    typer.Option(
        "--summary-delay",
        min=0,
        help="Seconds after a summary job is queued before this worker runs it, whatever "
        "delay `serve` queued it with (env KIOKU_SUMMARY_DELAY; default: the job's own, 30 s;"
        " 0 for replays and tests).",
    ),
]


def worker_command(
    db: _DbOpt = None,
    summarizer_upstream: _SummarizerUpstreamOpt = None,
    summarizer_model: _SummarizerModelOpt = None,
    profile: _ProfileOpt = None,
    window: _WindowOpt = None,
    poll: _PollOpt = DEFAULT_POLL_S,
    once: _OnceOpt = False,
    name: _NameOpt = None,
    lease: _LeaseOpt = DEFAULT_LEASE_S,
    summary_delay: _SummaryDelayOpt = None,
    summary_timeout: SummaryTimeoutOpt = None,
) -> None:
    """Run summary jobs from the database; start any number, on any number of machines.

    SIGTERM finishes the current job, then exits.

    Example: kioku worker --db postgresql://kioku:secret@db/kioku --summarizer-upstream http://127.0.0.1:8080/v1
    """
    import logging.config

    from kioku import terminal
    from kioku.config import from_env, writes_chapters
    from kioku.service.logs import log_config

    # each job's outcome (written by the model, or fell back and why) as `serve` prints it
    logging.config.dictConfig(log_config("info"))

    def say(line: str) -> None:
        typer.echo(line, err=True)

    settings = from_env().with_(
        db=db,
        profile=profile,
        window=window,
        summarizer_url=summarizer_upstream,
        summarizer_model=summarizer_model,
        summary_delay_s=summary_delay,
        summary_timeout_s=summary_timeout,
    )
    if not writes_chapters(settings):
        say("no --summarizer-upstream: chapters will be extractive (excerpts, no LLM)")
    upstream = settings.llm_url or settings.summarizer_url
    if settings.window is None and upstream:
        # the window `kioku serve --window auto` found: the reply model's (KIOKU_LLM_URL), else
        # the chronicler's; chapters are sized for it
        from kioku.service.discovery import find_window

        found = find_window(upstream, model=settings.llm_model, api_key=settings.api_key)
        found = found.within(settings.profile_obj.window)
        say(found.line())
        settings = settings.with_(window=found.size)
    kk = terminal.open_kioku(settings, write=True)
    worker = kk.worker
    worker.lease_s = lease
    worker.delay_s = settings.summary_delay_s
    if name:
        worker.name = name
    stop = threading.Event()
    stop_on_signals(stop, say)
    say(f"worker {worker.name} on {settings.profile_obj.name}: waiting for jobs")
    try:
        ran = run_jobs(worker, stop=stop, poll_s=poll, once=once, say=say)
    finally:
        kk.store.close()
    say(f"worker {worker.name}: ran {ran} job(s), exiting")


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
