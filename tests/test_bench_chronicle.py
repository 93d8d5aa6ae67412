"""`kioku bench chronicle` on real spans with a scripted chronicler: the figures it reports
(grounded share, drops by reason, fallbacks, seconds, tokens, answers against extractive and
the span) come out of what the chronicler did, and a line the model invents never counts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kioku.bench.chronicle import Span, run
from kioku.chronicler import LLMChronicler
from kioku.errors import InputError
from kioku.models import ChatRequest, ScriptedModel
from kioku.profiles import LOCAL_8K
from kioku.reply_log import Replayed, ReplyLog
from kioku.summarizer import ExtractiveSummarizer
from tests.chronicle_requests import numbered, span
from tests.conftest import shared_file


class Counter4:
    def count(self, text: str) -> int:
        return max(1, len(text) // 4)


def half_true(request: ChatRequest) -> str:
    """Each user message restated (true), plus one line the span never says (invented)."""
    user = numbered(request)
    said = re.findall(r"#(\d+) · (?:[^\n]*· )?Caroline \(user\)\n  ([^\n]+)", user)
    lines = [f"- Caroline said: {text} (#{seq})" for seq, text in said[:6]]
    lines.append(f"- Aoi reached the harbour town at night (#{span(request)[0]})")
    return "\n".join(lines)


def test_the_benchmark_reports_what_the_chronicler_did() -> None:
    shared_file("datasets", "locomo")
    model = ScriptedModel(default=half_true)
    counter = Counter4()
    chron = LLMChronicler(model, counter, ExtractiveSummarizer(counter))
    result: dict[str, Any] = run(
        chron, counter, LOCAL_8K, spans=[Span("locomo", "0", 60)], model="scripted", n_samples=5
    )
    (span,) = result["spans"]
    assert span["span"] == "locomo:0:60" and span["messages"] == 60
    rows = span["chapters"]
    assert rows and all(r["source"] == "llm" for r in rows)
    t = span["totals"]
    assert t["dropped"].get("name", 0) == len(rows)  # the invented line, once a chapter
    assert 0.5 <= t["grounded_share"] < 1.0 and t["fallbacks"] == 0
    assert t["requests"] == len(model.history) and t["tokens_in"] > 0
    every = t["all_replies"]  # one reply a chapter, each stored: the same figures
    assert every["replies"] == len(rows) and every["lines"] == t["lines"]
    assert every["dropped"] == t["dropped"]
    assert span["recheck"]["ungrounded"] == 0 and result["floors"]["stored_ungrounded"] == 0
    answers = span["answers"]
    assert answers["questions"] > 0
    for arm in ("llm", "llm_model_lines_only", "extractive", "span"):
        assert 0 <= answers[arm]["answer_in_context"] <= 1
    assert answers["span"]["found"] >= answers["extractive"]["found"]
    assert len(span["samples"]) == 5 and {s["by"] for s in span["samples"]} <= {"model", "span"}
    for s in span["samples"]:
        assert "harbour" not in s["line"] and s["source"].startswith(("Caroline: ", "Melanie: "))


def invents(request: ChatRequest) -> str:
    """Only what the span never says: a stranger, a place, a marriage."""
    seq = span(request)[0]
    return (
        f"- Aoi reached the harbour town at night (#{seq})\n"
        f"- Caroline has been married to Kenji for five years (#{seq})"
    )


def test_a_chapter_that_falls_back_still_reports_what_the_model_wrote() -> None:
    shared_file("datasets", "locomo")
    model = ScriptedModel(default=invents)
    counter = Counter4()
    chron = LLMChronicler(model, counter, ExtractiveSummarizer(counter))
    result = run(chron, counter, LOCAL_8K, spans=[Span("locomo", "0", 30)], n_samples=5)
    (span,) = result["spans"]
    t = span["totals"]
    assert t["fallbacks"] == t["chapters"] >= 1 and t["lines"] == 0  # nothing of it stored
    every = t["all_replies"]
    assert every["replies"] == len(model.history) == 3 * t["chapters"]
    assert every["lines"] == 2 * every["replies"] and every["grounded"] == 0
    assert every["dropped"].get("name", 0) >= every["replies"]  # Aoi, Kenji
    assert span["samples"] == [] and result["floors"]["stored_ungrounded"] == 0


def test_a_kept_reply_log_replays_the_run_and_counts_what_it_lacks(tmp_path: Path) -> None:
    """`--replies` then `--replay`: the same memory from what the model wrote, without it; a
    request the log lacks gets an empty reply (the chapter falls back) and is counted."""
    shared_file("datasets", "locomo")
    path = tmp_path / "replies.jsonl"
    recorded = ReplyLog(ScriptedModel(default=half_true), path)
    live = on_60_messages(recorded)

    replayed = Replayed(path)
    again = on_60_messages(replayed)
    assert replayed.misses == []
    (a,), (b,) = live["spans"], again["spans"]
    assert figures(a["chapters"]) == figures(b["chapters"]) and len(a["chapters"]) >= 2
    assert a["answers"] == b["answers"] and a["samples"] == b["samples"]
    answers = a["answers"]
    for q in answers["differ"]:
        assert q["llm"] != q["extractive"] and q["evidence"] and max(q["evidence"]) < 60
    won = sum(q["llm"] for q in answers["differ"])
    assert answers["llm"]["found"] - answers["extractive"]["found"] == 2 * won - len(
        answers["differ"]
    )

    # the last chapter's reply lost: that chapter falls back, the others are as they were
    rows = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(rows[-1])["purpose"] == "chapter"
    path.write_text("\n".join(rows[:-1]) + "\n", encoding="utf-8")
    short = Replayed(path)
    partial = on_60_messages(short)
    (c,) = partial["spans"]
    assert short.misses and set(short.misses) == {"chapter"}
    assert c["chapters"][-1]["source"] == "extractive" and c["totals"]["fallbacks"] == 1
    assert figures(c["chapters"][:-1]) == figures(a["chapters"][:-1])


def on_60_messages(model: Any) -> dict[str, Any]:
    """The benchmark on LoCoMo 0's first 60 messages, `model` as the chronicler's."""
    counter = Counter4()
    chron = LLMChronicler(model, counter, ExtractiveSummarizer(counter))
    return run(chron, counter, LOCAL_8K, spans=[Span("locomo", "0", 60)], n_samples=5)


def figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_a_reply_log_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "replies.jsonl"
    bad.write_text('{"purpose": "chapter"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="line 1: not a reply log row"):
        Replayed(bad)
    with pytest.raises(InputError, match="--replay"):
        Replayed(tmp_path / "missing.jsonl")
