from __future__ import annotations

import threading

import pytest

from kioku.errors import NotFound, StoreError
from kioku.memory import MemoryItem
from kioku.messages import Message, Part
from kioku.store import Store


@pytest.fixture
def store(tmp_path) -> Store:
    return Store.open(str(tmp_path / "k.db"))


def test_append_gives_gap_free_seq_and_keeps_structure(store: Store) -> None:
    store.ensure_conversation("c")
    msg = Message(
        role="assistant",
        author="Mika",
        parts=(
            Part("narration", "She smiled."),
            Part("speech", "I'm 17.", "Mika"),
            Part("thought", "I'm 25."),
        ),
    )
    entries = [store.append("c", msg, 5) for _ in range(3)]
    assert [e.seq for e in entries] == [0, 1, 2]
    back = store.entries("c")
    assert [e.seq for e in back] == [0, 1, 2]
    assert back[0].message.parts == msg.parts
    assert store.tokens_between("c", 1) == 10


def test_concurrent_appends_never_duplicate_or_skip_a_seq(tmp_path) -> None:
    store = Store.open(str(tmp_path / "k.db"))
    store.ensure_conversation("c")

    def writer(n: int) -> None:
        for i in range(20):
            store.append("c", Message.user(f"{n}-{i}"), 1)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [e.seq for e in store.entries("c")]
    assert seqs == list(range(80))


def test_migrations_are_recorded_and_not_rerun(tmp_path) -> None:
    path = str(tmp_path / "k.db")
    Store.open(path)
    from kioku import schema

    again = schema.migrate(Store.open(path).engine)
    assert again == []


def test_other_tenant_sees_nothing(store: Store) -> None:
    store.ensure_conversation("c", tenant="a")
    with pytest.raises(NotFound):
        store.conversation("c", tenant="b")
    with pytest.raises(NotFound):
        store.ensure_conversation("c", tenant="b")
    assert store.conversations("b") == []


def test_fold_refuses_a_gap_and_changes_nothing(store: Store) -> None:
    store.ensure_conversation("c")
    for i in range(6):
        store.append("c", Message.user(f"m{i}"), 1)
    bad = MemoryItem(kind="chapter", first_seq=1, last_seq=3, text="x", tokens=1)
    with pytest.raises(StoreError, match="gap"):
        store.fold("c", activate=(), retire=(), raw_start=4, add=[bad])
    assert store.conversation("c").raw_start == 0
    assert store.items("c") == []
    good = MemoryItem(kind="chapter", first_seq=0, last_seq=3, text="x", tokens=1)
    assert store.fold("c", activate=(), retire=(), raw_start=4, add=[good]) == 1
    assert store.conversation("c").raw_start == 4


def test_fold_refuses_when_raw_window_moved(store: Store) -> None:
    store.ensure_conversation("c")
    store.append("c", Message.user("a"), 1)
    item = MemoryItem(kind="chapter", first_seq=0, last_seq=0, text="x", tokens=1)
    with pytest.raises(StoreError, match="moved"):
        store.fold("c", activate=(), retire=(), raw_start=1, expect_raw_start=5, add=[item])


def test_job_lease_expires_and_one_conversation_is_never_claimed_twice(store: Store) -> None:
    store.ensure_conversation("c")
    store.enqueue_job("c", "chapter", 0, 5, run_after=0)
    store.enqueue_job("c", "chapter", 6, 9, run_after=0)
    job = store.claim_job("w1", now=10, lease_s=60)
    assert job is not None and job.first_seq == 0 and job.attempts == 1
    assert store.claim_job("w2", now=11, lease_s=60) is None  # same conversation is busy
    again = store.claim_job("w2", now=100, lease_s=60)  # w1's lease expired: crashed
    assert again is not None and again.id == job.id and again.attempts == 2


def test_job_not_claimed_before_its_time(store: Store) -> None:
    store.ensure_conversation("c")
    store.enqueue_job("c", "chapter", 0, 5, run_after=30)
    assert store.claim_job("w", now=29) is None
    assert store.claim_job("w", now=30) is not None
