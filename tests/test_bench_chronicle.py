"""`kioku bench chronicle` on real spans with a scripted chronicler: the figures it reports
(grounded share, drops by reason, fallbacks, seconds, tokens, answers against extractive and
the span) come out of what the chronicler did, and a line the model invents never counts."""

from __future__ import annotations

import re
from typing import Any

from kioku.bench.chronicle import Span, run
from kioku.chronicler import LLMChronicler
from kioku.models import ChatRequest, ScriptedModel
from kioku.profiles import LOCAL_8K
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
