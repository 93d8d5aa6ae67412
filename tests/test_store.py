from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import delete, select

from kioku.errors import InputError, LeaseLost, NotFound, StoreError
from kioku.memory import MemoryItem
from kioku.messages import Message, Part
from kioku.store import Store
from kioku.store import schema as s
from tests.helpers import store_unchecked_conversation
from tests.pg import BACKENDS, backend_url

# Every test here runs on SQLite and on PostgreSQL (`KIOKU_TEST_PG`, see tests/pg.py), each on
# a fresh database (a fresh schema on PostgreSQL).


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    st = Store.open(db_url)
    yield st
    st.close()


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


def test_concurrent_appends_never_duplicate_or_skip_a_seq(store: Store) -> None:
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


def test_migrations_are_recorded_and_not_rerun(db_url: str) -> None:
    from kioku.store import schema

    first = Store.open(db_url)
    second = Store.open(db_url)
    try:
        assert schema.migrate(second.engine) == []
    finally:
        first.close()
        second.close()


def test_other_tenant_sees_nothing(store: Store) -> None:
    a = store.ensure_conversation("c", tenant="a")
    with pytest.raises(NotFound):
        store.conversation(a.id, tenant="b")
    with pytest.raises(NotFound):
        store.find_conversation("b", "c")
    assert store.conversations("b") == []
    # the same id names b's own conversation: nothing says a has one
    b = store.ensure_conversation("c", tenant="b")
    assert b.id != a.id and [c.id for c in store.conversations("b")] == [b.id]


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


# concurrency: what several worker or server processes do at once ------------------------------


def _at_once(n: int, fn) -> list:
    """Run fn(i) in n threads released together; return what they returned."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_racing_workers_never_claim_two_jobs_of_one_conversation(store: Store) -> None:
    # Under READ COMMITTED both workers can see the conversation idle; SKIP LOCKED then hands
    # each a different job of it unless the claim serializes per conversation.
    store.ensure_conversation("c")
    store.ensure_conversation("d")
    for i in range(4):
        store.enqueue_job("c", "chapter", i, i, run_after=0)
    store.enqueue_job("d", "chapter", 0, 0, run_after=0)
    for rnd in range(8):
        now = 1000.0 * (rnd + 1)  # every earlier lease has expired by now
        jobs = [j for j in _at_once(5, lambda i, now=now: store.claim_job(f"w{i}", now, 100)) if j]
        convs = [j.conversation_id for j in jobs]
        assert sorted(convs) == ["c", "d"], convs


def test_first_increments_racing_all_count(store: Store) -> None:
    store.ensure_conversation("conv")
    for name in ("a", "b", "c"):
        _at_once(4, lambda i, name=name: store.incr("conv", name))
    assert store.counters("conv") == {"a": 4, "b": 4, "c": 4}


def test_processes_starting_together_migrate_once(db_url: str) -> None:
    code = "import sys; from kioku.store import Store; Store.open(sys.argv[1]).close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    st = Store.open(db_url)
    try:
        from kioku.store import schema

        with st.engine.connect() as conn:
            names = [r.name for r in conn.execute(select(schema.migrations_table.c.name))]
        assert sorted(names) == sorted(n for n, _ in schema.MIGRATIONS)
    finally:
        st.close()


def test_a_worker_whose_lease_was_taken_over_writes_nothing(store: Store) -> None:
    store.ensure_conversation("c")
    store.append("c", Message.user("hello"), 1)
    store.enqueue_job("c", "chapter", 0, 0, run_after=0)
    slow = store.claim_job("slow", now=10, lease_s=5)
    heir = store.claim_job("heir", now=20, lease_s=60)  # slow's lease expired
    assert slow is not None and heir is not None and slow.id == heir.id
    item = MemoryItem(kind="chapter", first_seq=0, last_seq=0, text="x", tokens=1)
    with pytest.raises(LeaseLost):
        store.complete_job(slow.id, "c", item, worker="slow")
    assert not store.retry_job(slow.id, 0, "late", worker="slow")
    assert not store.finish_job(slow.id, "failed", "late", worker="slow")
    assert store.items("c") == []
    assert store.complete_job(heir.id, "c", item, worker="heir") is not None
    (job,) = store.jobs("c")
    assert (job.status, job.attempts) == ("done", 2)
    assert len(store.items("c")) == 1


def test_blobs_are_kept_once_and_a_reply_keeps_only_its_latest_choices(store: Store) -> None:
    store.put_blobs({"a" * 64: b"first"})
    store.put_blobs({"a" * 64: b"ignored", "b" * 64: b"second"})  # a known hash stays as it is
    assert store.blobs(["a" * 64, "b" * 64, "c" * 64]) == {"a" * 64: b"first", "b" * 64: b"second"}
    assert store.blobs([]) == {}

    store.ensure_conversation("c")
    reply = store.append("c", Message.assistant("one", author="Mika"), 1)
    tool_call = Part("tool_call", '{"city": "Tokyo"}', ref="call_1", name="get_weather")
    store.set_choices(
        "c", reply.seq, [Message.assistant("two"), Message("assistant", (tool_call,))]
    )
    assert [m.text for m in store.choices("c", reply.seq)][0] == "two"
    assert store.choices("c", reply.seq)[1].parts == (tool_call,)
    with store.atomic():  # a regeneration's choices replace the old ones, in its transaction
        store.set_choices("c", reply.seq, [Message.assistant("three")])
        assert [m.text for m in store.choices("c", reply.seq)] == ["three"]
    assert [m.text for m in store.choices("c", reply.seq)] == ["three"]
    assert store.choices("c", reply.seq + 1) == []


# conversation ids per tenant (issue 11) ------------------------------------------------------


def test_conversation_ids_are_per_tenant(store: Store) -> None:
    a = store.ensure_conversation("mika", tenant="acme", system_prompt="A's card")
    b = store.ensure_conversation("mika", tenant="zeta", system_prompt="Z's card")
    assert a.id != b.id and a.public_id == b.public_id == "mika"
    assert store.ensure_conversation("mika", tenant="zeta").id == b.id  # found again, by name
    store.append(a.id, Message.user("acme's secret"), 3)
    store.append(b.id, Message.user("zeta's line"), 3)
    assert [e.text for e in store.entries(a.id)] == ["acme's secret"]
    assert [e.text for e in store.entries(b.id)] == ["zeta's line"]
    assert store.find_conversation("zeta", "mika").system_prompt == "Z's card"
    with pytest.raises(NotFound):
        store.find_conversation("other", "mika")
    with pytest.raises(NotFound):
        store.conversation(a.id, tenant="zeta")
    assert [c.public_id for c in store.conversations("zeta")] == ["mika"]


def test_a_new_conversation_id_is_checked_and_an_old_one_is_not(store: Store) -> None:
    with pytest.raises(InputError, match="conversation id"):
        store.ensure_conversation("a/b", tenant="acme")
    assert store.ensure_conversation("Branch #60 - 2026-12-01@18h34m47s", tenant="acme").id
    store_unchecked_conversation(store, "legacy/1", "acme")  # stored before the rule
    assert store.ensure_conversation("legacy/1", tenant="acme").id == "legacy/1"


def test_the_migration_gives_existing_conversations_their_names(db_url: str) -> None:
    """A database from before ids were per tenant: every row keeps its key, named by it."""
    store = Store.open(db_url)
    store.ensure_conversation("old-1", tenant="acme")
    store.append("old-1", Message.user("kept"), 1)
    with store.atomic() as conn:  # back to the schema before 0010
        conn.exec_driver_sql("DROP INDEX ux_conversations_tenant_public")
        conn.exec_driver_sql("ALTER TABLE conversations DROP COLUMN public_id")
        conn.execute(
            delete(s.migrations_table).where(
                s.migrations_table.c.name == "0010_i11_conversation_ids_per_tenant"
            )
        )
    store.close()
    store = Store.open(db_url)
    info = store.find_conversation("acme", "old-1")
    assert (info.id, info.public_id) == ("old-1", "old-1")
    assert [e.text for e in store.entries(info.id)] == ["kept"]
    # the name is unique per tenant now, and another tenant may use it
    assert store.ensure_conversation("old-1", tenant="acme").id == "old-1"
    assert store.ensure_conversation("old-1", tenant="zeta").id != "old-1"
    store.close()
