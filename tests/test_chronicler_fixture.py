"""What a real 1.5B model wrote as kioku's chronicler, replayed through today's chronicler.

`shared/fixtures/chronicler-small-model/` holds every request main at 36c9307 sent to Qwen2.5
Coder 1.5B and every reply: chapters that copied the prompt's example, renamed Caroline "Aoi",
stored Melanie's marriage as the user's and cited a thought LoCoMo does not have. A scripted
model answers with those replies, in order, for each chapter's span; what is stored may hold
none of the example's content, no name absent from the span and no line with the wrong author.
The audit, reading the chapters main stored, must score them as invented.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kioku.chronicler import LLMChronicler
from kioku.datasets import Transcript, load
from kioku.errors import BadSummary
from kioku.eval.audit import audit_store
from kioku.grounding.evidence import evidence_for
from kioku.grounding.records import ground_record
from kioku.grounding.terms import read
from kioku.memory import MemoryItem
from kioku.messages import LogEntry
from kioku.models import ScriptedModel
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.structure import parse_record, record_from_data
from kioku.summarizer import ExtractiveSummarizer, Summary, SummaryTask
from tests.conftest import shared_file

# what the old prompts' examples said: none of it may reach memory
EXAMPLE = (
    "Aoi",
    "harbour",
    "lighthouse",
    "aoi-past",
    "new job in April",
    "アオイ",
    "港町",
    "灯台",
    "4 月から新しい仕事",
    "この町で育った",
)


class Counter4:
    def count(self, text: str) -> int:
        return max(1, len(text) // 4)


COUNTER = Counter4()


@dataclass(frozen=True)
class Recorded:
    first: int
    last: int
    replies: tuple[str, ...]  # in the order the model gave them


def recorded(name: str) -> list[Recorded]:
    """The fixture's requests grouped by the span they asked about, in order."""
    path = shared_file("fixtures", "chronicler-small-model", f"{name}.requests.jsonl")
    spans: dict[tuple[int, int], list[str]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        req = json.loads(line)
        tail = req["messages"][-1]["content"].rsplit("\n", 3)[-3:]
        m = re.search(r"#(\d+)[–〜]#(\d+)", "\n".join(tail))
        assert m, tail
        spans.setdefault((int(m.group(1)), int(m.group(2))), []).append(req["text"])
    return [Recorded(a, b, tuple(r)) for (a, b), r in spans.items()]


def transcript(name: str) -> Transcript:
    shared_file("datasets")
    if name.startswith("locomo"):
        t = load(None, "locomo", conversation=0)
        n = 141
    else:
        t = load(None, "realpersonachat", speaker="CP")
        n = 297
    return replace(t, messages=t.messages[:n], meta=t.meta[:n])


def entries_of(t: Transcript, first: int, last: int) -> tuple[LogEntry, ...]:
    return tuple(LogEntry(i, t.messages[i], 10) for i in range(first, last + 1))


def replays(name: str) -> Iterator[tuple[Transcript, Recorded, SummaryTask, Summary]]:
    t = transcript(name)
    for rec in recorded(name):
        task = SummaryTask(
            "chapter",
            LOCAL_8K.chapter_tokens,
            entries_of(t, rec.first, rec.last),
            lang=t.lang,
            character=t.character,
            user_name=t.user,
            window_tokens=LOCAL_8K.window,
        )
        # the model's replies for this span in order; asked again, it says the last again
        model = ScriptedModel(list(rec.replies), default=rec.replies[-1])
        chron = LLMChronicler(model, COUNTER, ExtractiveSummarizer(COUNTER))
        yield t, rec, task, chron.summarize(task)


FIXTURES = ["locomo0_llm", "cp_llm"]


@pytest.mark.parametrize("name", FIXTURES)
def test_replayed_replies_store_nothing_of_the_example_no_stranger_and_no_wrong_author(
    name: str,
) -> None:
    for t, rec, task, s in replays(name):
        stored = s.text
        for phrase in EXAMPLE:
            assert phrase not in stored, (rec.first, phrase)
        ev = evidence_for(task.entries, lang=t.lang, user_name=t.user, character=t.character)
        # every name in memory is a name of the span
        for n in read(stored, t.lang).names:
            assert ev.known_name(n), (rec.first, n)
        if s.source != "llm":
            assert s.events[-1] == "fallback"
            continue
        # every line the model wrote, read again: cited in the span, by its author, supported
        record = record_from_data(s.data)
        _, g = ground_record(record, ev)
        assert g.dropped == (), g.dropped
        by_seq = {e.seq: e.message for e in task.entries}
        for f in record.user_facts:
            assert by_seq[f.seq].role == "user"
        for c in record.claims:
            assert ev.wrote(c.speaker, ev.sources[c.seq])
        assert s.data["grounding"]["share"] >= 0.5


@pytest.mark.parametrize("name", FIXTURES)
def test_the_fixtures_invented_chapters_are_caught_line_by_line(name: str) -> None:
    """What main stored from these replies was mostly invented; grounding says so."""
    seen = 0
    for t, rec, task, _ in replays(name):
        for text in rec.replies:
            try:
                record = parse_record(text, (rec.first, rec.last))  # main's own check
            except BadSummary:
                continue
            seen += 1
            ev = evidence_for(task.entries, lang=t.lang, user_name=t.user, character=t.character)
            _, g = ground_record(record, ev)
            assert g.share < 0.5, (rec.first, g.to_json())
    assert seen >= 1  # main stored at least one chapter of each fixture


def stored_by_main(name: str) -> tuple[Transcript, list[MemoryItem]]:
    """The chapters main stored: the first reply of each span that passed its parser, else
    the extractive fallback."""
    t = transcript(name)
    items = []
    for rec in recorded(name):
        for text in rec.replies:
            try:
                record = parse_record(text, (rec.first, rec.last))
            except BadSummary:
                continue
            data: dict[str, Any] = record.to_data(t.lang)
            items.append(MemoryItem("chapter", rec.first, rec.last, text, 300, "llm", data=data))
            break
        else:
            task = SummaryTask("chapter", 300, entries_of(t, rec.first, rec.last), lang=t.lang)
            s = ExtractiveSummarizer(COUNTER).summarize(task)
            items.append(MemoryItem("chapter", rec.first, rec.last, s.text, s.tokens, data=s.data))
    return t, items


@pytest.mark.parametrize(("name", "invented"), [("locomo0_llm", 2), ("cp_llm", 1)])
def test_the_audit_scores_the_invented_chapters_as_invented(name: str, invented: int) -> None:
    t, items = stored_by_main(name)
    store = Store.open("sqlite://")
    store.ensure_conversation("c", character=t.character)
    for m in t.messages:
        store.append("c", m, 10)
    for item in items:
        store.add_item("c", replace(item, status="active"))
    result = audit_store(store, "c")
    totals = result["totals"]
    assert totals["invented_items"] == invented == totals["invented_items_in_memory"]
    assert totals["ungrounded_by_reason"].get("name", 0) >= 1  # Aoi / アオイ
    llm_rows = [r for r in result["items"] if r["source"] == "llm"]
    assert len(llm_rows) == invented
    assert all(r["invented"] and r["grounding"]["share"] < 0.5 for r in llm_rows)
    # the extractive chapter beside them quotes the log: nothing in it is invented
    assert all(not r["invented"] for r in result["items"] if r["source"] == "extractive")
    store.close()
