"""Summarize now (the panel's button, `POST /v1/conversations/{id}/summarize`) cuts the backlog
as a fold does: every chapter it schedules fits the chronicler's prompt, not only
`summary_chunk` (local-8k's small model reads 1,400-token prompts; a 2,500-token chunk would
not fit one)."""

from __future__ import annotations

from kioku.chronicle_prompt import chunk_budget, entry_cost
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.profiles import LOCAL_8K
from kioku.service.client_api import _unsummarized
from kioku.store import Store
from kioku.tokens import ScriptEstimator
from tests.helpers import Clock

LINE = "We walked to the old harbour and you told me about the lighthouse keeper's daughter."


def test_summarize_now_schedules_chapters_that_fit_the_chroniclers_prompt() -> None:
    store = Store.open("sqlite://")
    counter = ScriptEstimator()
    kk = Kioku(store, profile=LOCAL_8K, clock=Clock(), counter=counter, layers=Layers(store))
    conv = kk.conversation("now", system_prompt="You are Mika.")
    for i in range(60):  # below the trigger: nothing folds on its own
        conv.prepare(f"{LINE} ({i})")
        conv.record(f"{LINE} Reply {i}.")
    assert conv.info().raw_start == 0
    ranges = _unsummarized(conv)
    budget = chunk_budget(LOCAL_8K, counter, conv.lang)
    assert budget is not None and budget < LOCAL_8K.summary_chunk
    entries = {e.seq: e for e in store.entries(conv.id, 0)}
    costs = [
        sum(entry_cost(entries[s], counter, conv.lang) for s in range(lo, hi + 1))
        for lo, hi in ranges
    ]
    backlog = sum(entries[s].tokens for lo, hi in ranges for s in range(lo, hi + 1))
    assert backlog > budget, "the backlog is more than one prompt holds"
    assert len(ranges) > 1 and all(c <= budget for c in costs), (ranges, costs, budget)
    # the ranges follow each other and leave the minimum raw window
    assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:], strict=False))
    assert ranges[0][0] == 0 and ranges[-1][1] < conv.info().next_seq - 1
