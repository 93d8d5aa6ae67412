"""A fold — with its retirements, notes snapshot, counters and log line — is one transaction, on
SQLite and on PostgreSQL: a failure anywhere in it leaves the memory state the turn started from.
A cut likewise. The failure is scripted by a store that refuses one counter, as a full disk
would."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from kioku.engine import Kioku
from kioku.errors import StoreError
from kioku.layers import Layers
from kioku.memory import coverage_gaps
from kioku.messages import Message
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from tests.helpers import Clock
from tests.pg import BACKENDS, backend_url
from tests.test_layers import FILLER


class RefusingStore(Store):
    """Refuses the next increment of counter `refuse` (then works again); `refused` counts."""

    refuse = ""
    refused = 0

    def incr(self, conversation_id: str, name: str, by: int = 1) -> None:
        if name == self.refuse:
            self.refuse = ""
            self.refused += 1
            raise StoreError(f"scripted: cannot count {name}")
        super().incr(conversation_id, name, by)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[RefusingStore]:
    with backend_url(request.param, tmp_path) as url:
        st = RefusingStore.open(url)
        yield st
        st.close()


@dataclass(frozen=True)
class Snapshot:
    raw_start: int
    memory_version: int
    items: frozenset[tuple[int | None, str]]
    notes: str
    counters: dict[str, int]
    log: tuple[tuple[str, str], ...]
    jobs: frozenset[tuple[int, str]]


def snapshot(store: Store, cid: str) -> Snapshot:
    info = store.conversation(cid)
    return Snapshot(
        raw_start=info.raw_start,
        memory_version=info.memory_version,
        items=frozenset((i.id, i.status) for i in store.items(cid)),
        notes=store.notes_snapshot(cid),
        counters=store.counters(cid),
        log=tuple((e["event"], e["outcome"]) for e in store.log_entries(cid)),
        jobs=frozenset((j.id, j.status) for j in store.jobs(cid)),
    )


def turn(kk: Kioku, clock: Clock, i: int) -> None:
    clock.advance(20)
    conv = kk.conversation("c", system_prompt="You are Mika.")
    conv.prepare(FILLER[i % len(FILLER)] + f" My name is Aki ({i}).")
    conv.record(FILLER[(i + 2) % len(FILLER)] + f" Reply {i}.")


def test_a_fold_that_fails_midway_changes_nothing(store: RefusingStore) -> None:
    clock = Clock()
    # notes on: the fold writes their snapshot in its transaction
    layers = Layers(store, recall=False, tics=False)
    kk = Kioku(store, profile=LOCAL_8K, clock=clock, layers=layers)
    kk.conversation("c", system_prompt="You are Mika.")
    store.refuse = "folds"  # the counter written after the fold itself, inside its transaction
    for i in range(200):
        kk.worker.run_until_idle()
        before, ready = snapshot(store, "c"), {r.id for r in store.items("c", "ready")}
        turn(kk, clock, i)
        if store.refused:
            break
    else:
        pytest.fail("the conversation never folded")
    assert ready
    after = snapshot(store, "c")
    # the fold, its retirements, notes snapshot, counters and log line: none of it happened
    assert replace(after, log=before.log) == before
    new_log = after.log[len(before.log) :]
    assert ("fold", "ok") not in new_log and ("fold", "skipped") in new_log
    assert {r.id for r in store.items("c", "ready")} == ready  # still waiting to fold
    # the next turn folds, whole
    turn(kk, clock, i + 1)
    folded = snapshot(store, "c")
    assert folded.raw_start > before.raw_start and folded.counters["folds"] == 1
    assert folded.notes  # rendered with the fold
    info = store.conversation("c")
    assert coverage_gaps(store.items("c", "active"), info.raw_start) == []


def test_a_cut_that_fails_midway_changes_nothing(store: RefusingStore) -> None:
    clock = Clock()
    kk = Kioku(store, profile=LOCAL_8K, clock=clock)
    conv = kk.conversation("c")
    for i in range(30):
        turn(kk, clock, i)
    kk.worker.run_until_idle()
    before = snapshot(store, "c")
    store.refuse = "cuts"
    with pytest.raises(StoreError, match="scripted"):
        conv.cut()
    assert snapshot(store, "c") == before
    conv.cut()
    info = store.conversation("c")
    assert info.raw_start == info.next_seq
    assert store.counters("c")["cuts"] == 1


def test_atomic_joins_an_open_transaction(store: RefusingStore) -> None:
    store.ensure_conversation("c")
    with pytest.raises(StoreError, match="scripted"), store.atomic():
        store.append("c", Message.user("kept only with the rest"), 3)
        store.log("c", "note", "ok")
        assert len(store.entries("c")) == 1  # a read inside sees the transaction's writes
        store.refuse = "x"
        store.incr("c", "x")
    assert store.entries("c") == [] and store.log_entries("c") == []
    assert store.conversation("c").next_seq == 0
