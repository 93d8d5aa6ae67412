"""The turn lock and idempotency keys in the store, on SQLite and PostgreSQL: one holder at a
time, a dead holder's lock taken over at once with what it was running, a lease that runs out,
and the record a duplicate reads its reply from."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kioku.store import Store
from kioku.store_turns import IDEMPOTENCY_TTL_S
from tests.pg import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with backend_url(request.param, tmp_path) as url:
        st = Store.open(url)
        yield st
        st.close()


def test_one_holder_at_a_time_then_the_next_sees_what_the_last_did(store: Store) -> None:
    a = store.take_turn("acme", "c1", "h:1:a", "req-1", now=100.0)
    assert a is not None and a.previous.done is None
    assert store.take_turn("acme", "c1", "h:2:b", "req-2", now=100.5) is None  # held
    # another conversation, or the same id of another tenant, is another lock
    other = store.take_turn("acme", "c2", "h:2:b", "req-3", now=100.5)
    tenant = store.take_turn("zeta", "c1", "h:2:b", "req-4", now=100.5)
    assert other is not None and tenant is not None
    store.end_turn(other, now=101.0)
    store.end_turn(tenant, now=101.0)
    store.end_turn(a, now=101.0, done="req-1", done_seq=7)
    b = store.take_turn("acme", "c1", "h:2:b", "req-1", now=102.0)
    assert b is not None
    assert (b.previous.done, b.previous.done_seq, b.previous.done_at) == ("req-1", 7, 101.0)
    assert b.previous.running is None and b.previous.last_owner == "h:1:a"
    store.end_turn(b, now=103.0)


def test_a_dead_holder_is_taken_over_with_the_request_it_was_running(store: Store) -> None:
    dead = store.take_turn("acme", "c1", "h:1:dead", "req-1", now=100.0)
    assert dead is not None
    if dead.session is not None:  # PostgreSQL: the dead process's connection goes away
        dead.session.invalidate()
        dead.session.close()
    taken = None
    for _ in range(200):  # PostgreSQL frees its lock once the closed session's backend exits
        taken = store.take_turn(
            "acme", "c1", "h:2:b", "req-1", now=100.1, alive=lambda owner: owner != "h:1:dead"
        )
        if taken is not None:
            break
        time.sleep(0.05)
    assert taken is not None
    assert taken.previous.running == "req-1" and taken.previous.last_owner == "h:1:dead"
    store.end_turn(taken, now=101.0, done="req-1", done_seq=3)
    # the dead owner cannot end (or overwrite) a turn that is no longer its own
    store.end_turn(dead, now=102.0, done="req-x", done_seq=99)
    again = store.take_turn("acme", "c1", "h:2:b", "req-2", now=103.0)
    assert again is not None and again.previous.done_seq == 3
    store.end_turn(again, now=104.0)


def test_a_lease_runs_out_unless_it_is_renewed(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")  # the lease is SQLite's lock
    held = store.take_turn("acme", "c1", "h:1:a", "req-1", now=100.0, lease_s=10.0)
    assert held is not None
    assert store.take_turn("acme", "c1", "h:2:b", "req-2", now=109.0) is None
    assert store.renew_turn(held, now=109.0, lease_s=10.0)
    assert store.take_turn("acme", "c1", "h:2:b", "req-2", now=118.0) is None
    late = store.take_turn("acme", "c1", "h:2:b", "req-2", now=119.5)
    assert late is not None and late.previous.running == "req-1"
    assert not store.renew_turn(held, now=120.0, lease_s=10.0)  # lost, and it knows it


def test_an_idempotency_key_is_kept_for_a_day_per_tenant(store: Store) -> None:
    held = store.take_turn("acme", "c1", "h:1:a", "k:abc", now=1000.0)
    assert held is not None
    store.end_turn(held, now=1001.0, done="k:abc", done_seq=5, key=("k:abc", "fp-1"))
    record = store.idempotency_key("acme", "k:abc", now=1002.0)
    assert record is not None and (record.fingerprint, record.reply_seq) == ("fp-1", 5)
    assert record.conversation == "c1"
    assert store.idempotency_key("zeta", "k:abc", now=1002.0) is None
    assert store.idempotency_key("acme", "k:abc", now=1001.0 + IDEMPOTENCY_TTL_S + 1) is None


def test_conversations_whose_names_share_a_32_bit_hash_never_wait_for_each_other(
    store: Store,
) -> None:
    """`acme`'s `mika-7171` and `evil`'s `e120283` have the same PostgreSQL `hashtext` (the
    turn lock's key on 36c9307, where evil's 120 s turn made acme's wait 118.7 s): each holds a
    lock of its own."""
    if store.is_postgres:
        with store.engine.connect() as conn:
            same = conn.exec_driver_sql(
                "SELECT hashtext(E'acme\\x1fmika-7171') = hashtext(E'evil\\x1fe120283')"
            ).scalar()
        assert same  # the pair still collides under the old key
    evil = store.take_turn("evil", "e120283", "h:1:e", "req-e", now=100.0)
    assert evil is not None
    started = time.monotonic()
    acme = store.take_turn("acme", "mika-7171", "h:2:a", "req-a", now=100.1)
    assert acme is not None and time.monotonic() - started < 1.0
    assert store.take_turn("evil", "e120283", "h:3:x", "req-x", now=100.2) is None  # still held
    store.end_turn(acme, now=101.0)
    store.end_turn(evil, now=101.0)
