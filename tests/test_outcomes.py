"""What happened to a summary reads as what it was (kioku/outcomes.py): a model that cannot
write the chronicler's format leaves one log line saying the chapter fell back to extractive
and why, a stand-in mark on the item, and "fell back" (never "ok") in `kioku stats`; a model
that times out leaves a line saying so and when it is tried again."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from kioku.chronicler import LLMChronicler
from kioku.cli import app
from kioku.errors import ModelTimeout
from kioku.memory import MemoryItem
from kioku.messages import Message
from kioku.models import ScriptedModel
from kioku.outcomes import dropped, dropped_text, event_outcome, stand_in
from kioku.profiles import LOCAL_8K
from kioku.stats import compaction_stats
from kioku.store import Store
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator
from kioku.worker import Worker
from tests.helpers import Clock

PROSE = "What a lovely conversation! They talked about the lighthouse and many other things."
UNGROUNDED = "the replies' lines were not borne out by the messages they cite"
BROKEN = '{"events": [{"seq": 1, "text": "Ren'
FORMAT = "the replies were not in the chronicler's format"


def conversation(store: Store, cid: str = "c", n: int = 12) -> int:
    store.ensure_conversation(cid)
    for i in range(n):
        store.append(
            cid, Message.user(f"Ren visits the old lighthouse on day {i}.", author="Ren"), 12
        )
    return store.enqueue_job(cid, "chapter", 0, n - 1, run_after=0)


@pytest.mark.parametrize(
    ("answer", "reason", "said"),
    [(PROSE, "ungrounded", UNGROUNDED), (BROKEN, "unparseable", FORMAT)],
    ids=["prose", "broken-json"],
)
def test_a_model_without_the_chronicle_format_falls_back_and_says_why_everywhere(
    caplog: pytest.LogCaptureFixture, tmp_path, answer: str, reason: str, said: str
) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    conversation(store)
    model = ScriptedModel(default=answer)
    counter = ScriptEstimator()
    chronicler = LLMChronicler(model, counter, ExtractiveSummarizer(counter))
    worker = Worker(store, chronicler, LOCAL_8K, clock=Clock(1e9))

    with caplog.at_level(logging.INFO, logger="kioku"):
        outcome = worker.run_once()
    assert outcome is not None and outcome.status == "done"
    assert len(model.history) == 3  # the chronicler's three tries, then the fallback

    # one line of the process's log for the job: it fell back, and why
    lines = [r.getMessage() for r in caplog.records if r.name == "kioku.worker"]
    assert len(lines) == 1, lines
    assert "chapter job" in lines[0] and "'c' (seq 0–11)" in lines[0]
    assert f"fell back to extractive, {said} (3 attempts" in lines[0]
    assert "written by the model" not in lines[0]

    # the item is marked as a stand-in, with the reason the last rejection gave
    (item,) = store.items("c")
    assert item.source == "extractive"
    assert item.data["fallback"]["reason"] == reason
    assert item.data["fallback"]["detail"].startswith(reason)
    assert stand_in(item.data) == said

    # the compaction log and `kioku stats` say "fell back" and "rejected", never "ok"
    events = compaction_stats(store)["events"]
    assert events["fallback"]["outcomes"] == {f"fell back: {reason}": 1}
    assert events[reason]["outcomes"] == {"rejected": 3}
    assert events["chapter"]["outcomes"] == {"fell back": 1}
    store.close()
    r = CliRunner().invoke(app, ["stats", "--db", db], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["fallback"])
    assert "fell back" in row and " ok " not in f"{row} "


def test_a_chapter_the_model_wrote_says_so_and_what_grounding_dropped() -> None:
    from kioku.summarizer import Summary
    from kioku.worker import written_line

    store = Store.open("sqlite://")
    job_id = conversation(store)
    (job,) = [j for j in store.jobs("c") if j.id == job_id]
    summary = Summary(
        "text",
        10,
        "llm",
        model="qwen",
        attempts=2,
        events=("retry", "dropped_name", "dropped_name", "dropped_author"),
    )
    line = written_line(job, summary, 3.25)
    assert line.endswith(
        "written by the model qwen (2 attempts, 3.2 s); grounding dropped 3 lines "
        "(author 1, name 2)"
    )
    extractive = written_line(job, Summary("t", 1, "extractive"), 0.1)
    assert extractive.endswith("written extractively (no chronicler model)")
    assert dropped_text(dropped(())) == ""


def test_a_model_that_times_out_is_logged_with_its_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store.open("sqlite://")
    conversation(store)
    model = ScriptedModel(default=ModelTimeout("no answer within 600 s"))
    counter = ScriptEstimator()
    chronicler = LLMChronicler(model, counter, ExtractiveSummarizer(counter))
    worker = Worker(store, chronicler, LOCAL_8K, clock=Clock(1e9), backoff_s=15)
    with caplog.at_level(logging.INFO, logger="kioku"):
        outcome = worker.run_once()
    assert outcome is not None and outcome.status == "retry"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kioku.worker"]
    assert "not written, the model timed out (ModelTimeout: no answer within 600 s)" in line
    assert "retry in 15 s (attempt 1 of 4)" in line
    assert store.items("c") == []


def test_stand_in_marks_only_what_replaced_the_models_summary() -> None:
    def item(data: dict) -> MemoryItem:
        return MemoryItem("chapter", 0, 1, "t", 1, data=data)

    assert stand_in(item({"fallback": {"reason": "refusal"}}).data) == "the model refused"
    assert (
        stand_in(item({"stand_in": True}).data) == "the summaries were late at the prompt's ceiling"
    )
    # stored before the reason was: the grounding says the model's replies were set aside
    assert stand_in(item({"grounding": {"extractive": True}}).data) == "the model failed"
    assert stand_in(item({"grounding": {"share": 1.0}}).data) is None
    assert stand_in(item({"lines": []}).data) is None  # extractive by choice: no model


def test_stats_read_rows_written_before_each_event_had_its_word() -> None:
    store = Store.open("sqlite://")
    store.ensure_conversation("c")
    for event in ("fallback", "fallback", "ungrounded", "dropped_name", "retry"):
        store.log("c", event)  # the worker wrote "ok" for each
    store.log("c", "chapter")
    events = compaction_stats(store)["events"]
    assert events["fallback"]["outcomes"] == {"fell back": 2}
    assert events["ungrounded"]["outcomes"] == {"rejected": 1}
    assert events["dropped_name"]["outcomes"] == {"dropped": 1}
    assert events["retry"]["outcomes"] == {"asked again": 1}
    assert events["chapter"]["outcomes"] == {"ok": 1}
    assert event_outcome("fold") == "ok"


@pytest.mark.parametrize("worker_runs", [True, False], ids=["model-down", "worker-idle"])
def test_a_forced_cut_says_what_kept_the_summary_from_coming(
    caplog: pytest.LogCaptureFixture, worker_runs: bool
) -> None:
    from kioku.engine import Kioku
    from tests.helpers import FlakySummarizer

    clock = Clock()
    kk = Kioku(
        Store.open("sqlite://"),
        profile=LOCAL_8K,
        clock=clock,
        summarizer=FlakySummarizer(always_fail=True),  # ModelUnavailable, every time
    )
    conv = kk.conversation("c")
    with caplog.at_level(logging.INFO, logger="kioku"):
        for i in range(400):
            clock.advance(30)
            conv.prepare(f"Ren tells Mika about the lighthouse, part {i}, with some detail.")
            conv.record(f"Mika answers about the harbour and the boats, part {i}.")
            if worker_runs:
                kk.worker.run_until_idle()
            if conv.last_turn.forced_cut:
                break
    assert conv.last_turn.forced_cut is not None
    first, last = conv.last_turn.forced_cut
    (cut,) = [i for i in kk.store.items("c", "active") if i.span == (first, last)]
    said = stand_in(cut.data)
    messages = [r.getMessage() for r in caplog.records]
    folds = [m for m in messages if m.startswith("fold of 'c'")]
    assert folds and f"chapter {first}–{last} (stand-in: {said})" in folds[-1]
    if worker_runs:
        assert said == "the model's server could not be reached"
        assert "ModelUnavailable: scripted failure" in cut.data["fallback"]["detail"]
        tries = [m for m in messages if "not written, the model's server could not be" in m]
        assert tries and "retry in" in tries[0]
    else:
        assert said == "the summaries were late at the prompt's ceiling"
        assert cut.data["fallback"]["reason"] == "late"


def test_a_failed_job_is_told_apart_from_a_failed_model() -> None:
    from kioku.errors import ModelUnavailable, StoreError, UpstreamError
    from kioku.outcomes import reason_of, reason_of_failure, why

    assert why(reason_of(ModelTimeout("slow"))) == "the model timed out"
    assert why(reason_of(UpstreamError(504, "slow"))) == "the model timed out"
    assert why(reason_of(UpstreamError(502, "down"))) == "the model's server could not be reached"
    assert why(reason_of(ModelUnavailable("down"))) == "the model's server could not be reached"
    assert why(reason_of(StoreError("disk full"))) == "the job failed"  # not the model's fault
    assert reason_of_failure("ModelTimeout: no answer") == "timeout"
    assert reason_of_failure("StoreError: disk full") is None
