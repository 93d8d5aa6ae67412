"""The chronicler on a real small instruct model (Qwen2.5 Coder 1.5B, Q4_K_M, llama.cpp on CPU).

The weak local model a user runs: it copies, renames and cites the wrong message. Whatever it
writes on a short LoCoMo span, what is stored must be grounded — every line cited inside the
span, by its true author, with names the span has, borne out by the message — or the
extractive chapter stands in. The GGUF comes from `.ci/qwen.sh` ($KIOKU_QWEN_GGUF, or the cache
under ~/.cache/kioku/); locally the test skips without it, under CI=true it fails. Kept short:
20 messages, two requests at most, well under 10 minutes on 2 cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kioku.chronicler import ChroniclerConfig, LLMChronicler
from kioku.client import OpenAIChatModel, Timeouts
from kioku.counters import counter_from_spec
from kioku.datasets import load
from kioku.grounding.evidence import evidence_for
from kioku.grounding.records import ground_record
from kioku.grounding.terms import read
from kioku.messages import LogEntry
from kioku.models import ChatRequest, Completion
from kioku.profiles import LOCAL_8K
from kioku.structure import is_structured, record_from_data, who_and_what
from kioku.summarizer import ExtractiveSummarizer, SummaryTask
from tests.conftest import need, shared_file
from tests.llama import LlamaServer, need_llama

QWEN = Path.home() / ".cache" / "kioku" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SPAN = (0, 19)  # LoCoMo conversation 0, session 1 and the start of session 2
EXAMPLE = ("Aoi", "harbour", "lighthouse", "new job in April")


def qwen_path() -> Path:
    need_llama()  # llama-cpp-python[server] is there
    env = os.environ.get("KIOKU_QWEN_GGUF")
    path = Path(env) if env else QWEN
    need(path.exists(), f"no Qwen GGUF at {path}: run `bash .ci/qwen.sh`")
    return path


@pytest.fixture(scope="module")
def qwen() -> Iterator[LlamaServer]:
    # its own ChatML template (no --chat_format), the window the local-8k profile assumes
    server = LlamaServer(qwen_path(), n_ctx=LOCAL_8K.window, chat_format=None, alias="qwen")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Recording:
    """The real model, with every request and completion kept for the assertions."""

    def __init__(self, model: OpenAIChatModel) -> None:
        self.model = model
        self.sent: list[tuple[ChatRequest, Completion]] = []

    def complete(self, request: ChatRequest) -> Completion:
        c = self.model.complete(request)
        self.sent.append((request, c))
        return c


@pytest.mark.slow
@pytest.mark.llama
def test_what_the_small_model_writes_is_stored_only_where_its_messages_bear_it_out(
    qwen: LlamaServer,
) -> None:
    shared_file("datasets", "locomo")
    t = load(None, "locomo", conversation=0)
    t = replace(t, messages=t.messages[: SPAN[1] + 1])
    entries = tuple(LogEntry(i, m, 0) for i, m in enumerate(t.messages))
    counter = counter_from_spec("qwen2.5")
    task = SummaryTask(
        "chapter",
        LOCAL_8K.chapter_tokens,
        entries,
        lang="en",
        character=t.character,
        user_name=t.user,
        window_tokens=LOCAL_8K.window,
    )
    timeouts = Timeouts(connect=10, reply=600, summary=600)
    with OpenAIChatModel(qwen.url, model="qwen", timeouts=timeouts) as http:
        model = Recording(http)
        chronicler = LLMChronicler(
            model, counter, ExtractiveSummarizer(counter), ChroniclerConfig(max_attempts=2)
        )
        started = time.monotonic()
        s = chronicler.summarize(task)
        took = time.monotonic() - started
    assert took < 600
    assert 1 <= len(model.sent) <= 2
    for request, completion in model.sent:  # every request fit the window
        assert completion.usage.prompt_tokens + request.max_tokens <= LOCAL_8K.window
        assert request.temperature == 0.2
    # nothing of an example, no stranger's name, in whatever was stored
    for phrase in EXAMPLE:
        assert phrase not in s.text
    ev = evidence_for(entries, lang="en", user_name=t.user, character=t.character)
    # read line by line, as the messages are read: memory's headings ("Key lines"), scene
    # markers ("8 May 2023") and a quote's first word ("Hey") are no names
    if is_structured(s.data):
        r = record_from_data(s.data)
        lines = [*r.events, *r.claims, *r.user_facts, *r.key_lines]
        names = frozenset().union(*(read(who_and_what(it)[1]).names for it in lines))
    else:
        names = read(s.text).names
    assert all(ev.known_name(n) for n in names), names
    if s.source == "extractive":
        assert s.events[-1] in ("fallback",)
        return
    assert is_structured(s.data)
    record = record_from_data(s.data)
    _, g = ground_record(record, ev)
    assert g.dropped == (), g.dropped  # every stored line passes the check that kept it
    for f in record.user_facts:
        assert t.messages[f.seq].role == "user"
    for c in record.claims:
        assert ev.wrote(c.speaker, ev.sources[c.seq])
    assert s.data["grounding"]["share"] >= 0.5
