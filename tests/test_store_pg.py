"""The whole engine on PostgreSQL: the same turns give the same memory as on SQLite.

tests/test_store.py runs every store test on both backends; this drives everything above the
store (folds, major GCs, notes ledger, recall segments, cut, counters) through a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kioku import notes as notes_layer
from kioku.engine import Kioku
from kioku.errors import InputError
from kioku.layers import Layers
from kioku.memory import coverage_gaps
from kioku.messages import Message
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from tests.helpers import Clock
from tests.pg import fresh_schema
from tests.test_layers import grow

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store() -> Iterator[Store]:
    with fresh_schema() as url:
        st = Store.open(url)
        yield st
        st.close()


def run(store: Store) -> dict[str, Any]:
    clock = Clock()
    layers = Layers(store)
    kk = Kioku(store, profile=LOCAL_8K, clock=clock, layers=layers)
    grow(kk, clock, "c", 150, first="My sister Hana lives in Sapporo and loves the snow festival.")
    conv = kk.conversation("c")
    base = notes_layer.render_editable(notes_layer.notes(store, "c"))
    conv.edit_notes(base + "- [promise] Mika: to visit the lighthouse in May\n")
    folded_before_cut = conv.info().raw_start
    conv.cut()
    info = conv.info()
    assert layers.indexes is not None
    recalled = layers.indexes.recall(
        "c",
        "Where does Hana live?",
        before_seq=info.raw_start,
        budget_tokens=300,
        counter=kk.counter,
    )
    active = store.items("c", "active")
    assert not coverage_gaps(active, info.raw_start)
    return {
        "info": (info.next_seq, info.raw_start, info.memory_version),
        "folded_before_cut": folded_before_cut,
        "items": [(i.kind, i.first_seq, i.last_seq, i.text, i.status) for i in store.items("c")],
        "notes": notes_layer.render_editable(notes_layer.notes(store, "c")),
        "snapshot": store.notes_snapshot("c"),
        "recalled": [(r.first_seq, r.last_seq) for r in recalled],
        "counters": store.counters("c"),
        "jobs": [(j.kind, j.first_seq, j.last_seq, j.status) for j in store.jobs("c")],
        "log": [(e["event"], e["outcome"]) for e in store.log_entries("c")],
    }


@pytest.mark.slow
def test_the_engine_remembers_the_same_on_postgres_as_on_sqlite(pg_store: Store) -> None:
    sqlite = Store.open("sqlite://")
    try:
        on_sqlite = run(sqlite)
    finally:
        sqlite.close()
    on_pg = run(pg_store)
    assert on_sqlite["info"][1] == on_sqlite["info"][0]  # the cut folded everything
    assert on_sqlite["folded_before_cut"] > 0
    assert "lighthouse in May" in on_pg["notes"]
    assert on_pg["recalled"], "archive recall found nothing on PostgreSQL"
    assert on_pg == on_sqlite


def test_a_nul_character_is_bad_input_on_postgres_and_nothing_is_half_stored(
    pg_store: Store,
) -> None:
    pg_store.ensure_conversation("c")
    with pytest.raises(InputError, match="NUL"):
        pg_store.append("c", Message.user("a\x00b"), 1)
    with pytest.raises(InputError, match="NUL"):
        pg_store.conversation("c\x00")
    assert pg_store.append("c", Message.user("fine"), 1).seq == 0  # no seq was used up
