"""A client's chats in the store, on SQLite and PostgreSQL: a rename keeps every row of the
conversation, a branch's start copies the parent's messages, memory and notes below its branch
point in one transaction (refusing memory that breaks coverage), and the reads the panel makes
(positions) and its requests (summarize now, write a chapter again)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kioku.branches import inherited
from kioku.errors import FoldRefused, NameTaken, NotFound
from kioku.memory import MemoryItem, coverage_gaps
from kioku.messages import Message
from kioku.notes import NoteDraft
from kioku.store import Store
from kioku.store_edits import Rewrite
from tests.pg import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with backend_url(request.param, tmp_path) as url:
        st = Store.open(url)
        yield st
        st.close()


def parent(store: Store) -> str:
    """A conversation of 12 messages with two chapters over 0..7 and a note from seq 2 and 9."""
    key = store.ensure_conversation("parent", tenant="t", character="Mika").id
    for k in range(12):
        store.append(key, Message.of("user" if k % 2 else "assistant", f"line {k}"), 3)
    a = store.add_item(key, MemoryItem("chapter", 0, 3, "chapter one", 5, status="active"))
    b = store.add_item(key, MemoryItem("chapter", 4, 7, "chapter two", 5, status="active"))
    store.fold(key, activate=[a, b], retire=[], raw_start=8)
    for seq in (2, 9):
        store.add_note(key, NoteDraft("Mika", "habit", f"note from {seq}", source_seq=seq),
                       author="extractor", origin="test")  # fmt: skip
    return key


def test_a_rename_keeps_the_conversation(store: Store) -> None:
    key = parent(store)
    store.ensure_conversation("other", tenant="t")
    with pytest.raises(NameTaken):
        store.rename_conversation("t", "parent", "other")
    assert store.rename_conversation("t", "parent", "Our walk #2") == key
    assert store.find_conversation("t", "Our walk #2").id == key
    assert store.count_messages(key) == 12 and len(store.items(key, "active")) == 2
    with pytest.raises(NotFound):
        store.find_conversation("t", "parent")
    with pytest.raises(NotFound):
        store.rename_conversation("u", "Our walk #2", "mine")  # another tenant's


def test_a_branch_starts_with_the_parents_state_below_its_point(store: Store) -> None:
    key = parent(store)
    child = store.ensure_conversation("branch", tenant="t").id
    inh = inherited(store.items(key), 6)  # inside chapter two: chapter one only
    assert [i.text for i in inh.active] == ["chapter one"] and inh.raw_start == 4
    copied = store.copy_branch(key, child, upto=6, raw_start=inh.raw_start, active=inh.active)
    assert copied == 6
    info = store.conversation(child)
    assert (info.next_seq, info.raw_start) == (6, 4)
    assert [e.text for e in store.entries(child)] == [f"line {k}" for k in range(6)]
    items = store.items(child, "active")
    assert [i.text for i in items] == ["chapter one"] and coverage_gaps(items, 4) == []
    assert [n.text for n in store.note_ledger(child)] == ["note from 2"]
    store.append(child, Message.user("the branch's own"), 3)  # seqs go on from the copy
    assert store.count_messages(child) == 7 and store.count_messages(key) == 12
    # memory that would not cover the branch's start is refused, nothing copied
    other = store.ensure_conversation("broken", tenant="t").id
    with pytest.raises(FoldRefused):
        store.copy_branch(key, other, upto=6, raw_start=6, active=inh.active)
    assert store.count_messages(other) == 0


def test_the_panels_reads_and_requests(store: Store) -> None:
    key = parent(store)
    store.rewrite_messages(key, [Rewrite(3, None, 0, "delete")], run_after=0, now=0)
    assert store.positions(key, [2, 3, 4, 11]) == {2: 2, 3: 3, 4: 3, 11: 10}
    job = store.enqueue_job(key, "chapter", 8, 9, run_after=1e12)
    assert store.hurry_jobs(key, 100.0) == 1
    assert next(j for j in store.jobs(key) if j.id == job).run_after == 100.0
    [chapter_two] = [i for i in store.items(key, "active") if i.first_seq == 4]
    assert store.resummarize(key, 4, 100.0) == (chapter_two.id,)
    assert [j.kind for j in store.jobs(key, "queued") if j.first_seq == 4] == ["revision"]
