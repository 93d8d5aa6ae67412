"""The database under the store: one engine per URL, SQLite (embedded) or PostgreSQL.

SQLite gets WAL, a busy timeout and write transactions that take the write lock at BEGIN; an
in-memory URL becomes a throwaway file so threads can share it. PostgreSQL refuses NUL in text
as bad input rather than failing deep in the driver.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from kioku import schema as s
from kioku.errors import InputError, StoreError

DEFAULT_URL = "sqlite:///kioku.db"


def make_engine(url: str) -> Engine:
    """An engine with the settings kioku relies on (WAL and immediate write locks on SQLite)."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "before_cursor_execute", _refuse_nul)
        return engine
    scratch: str | None = None
    if url in ("sqlite://", "sqlite:///:memory:"):
        # An in-memory database lives in one connection, which threads (the background worker)
        # cannot share safely; a throwaway file behaves the same and is removed with the engine.
        scratch = tempfile.mkdtemp(prefix="kioku-")
        url = f"sqlite:///{os.path.join(scratch, 'scratch.db')}"
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    if scratch is not None:
        weakref.finalize(engine, shutil.rmtree, scratch, True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE: a deferred transaction that later
        # writes can deadlock against another writer instead of waiting for it.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers (`Store.atomic`) take the write lock up front; readers never queue behind a
        # writer under WAL.
        if conn.info.get(s.WRITE_FLAG):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        # A read runs without BEGIN: each of the store's reads is one statement, which SQLite
        # runs in its own consistent snapshot anyway, and a round trip per read is saved.

    return engine


def _refuse_nul(
    _conn: Any, _cursor: Any, _statement: Any, parameters: Any, _ctx: Any, _many: Any
) -> None:
    """PostgreSQL text cannot hold a NUL character: refuse such input as bad input (nothing is
    stored), not as a database failure."""
    rows = parameters if isinstance(parameters, list | tuple) else [parameters]
    for row in rows:
        values = row.values() if isinstance(row, dict) else row
        if isinstance(values, str):
            values = [values]
        for v in values or ():
            if isinstance(v, str) and "\x00" in v:
                raise InputError(
                    "text with a NUL character (\\x00) cannot be stored in PostgreSQL; "
                    "remove it and send again"
                )


def new_id(result: Any) -> int:
    """The primary key an INSERT just made."""
    return int(result.inserted_primary_key[0])


class Database:
    """An engine with its schema migrated, and the transaction helpers every table uses."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # the connection of the transaction this thread has open, if any (see `atomic`)
        self._open = threading.local()
        s.migrate(engine)

    @classmethod
    def open(cls, url: str = DEFAULT_URL) -> Self:
        if "://" not in url:
            url = f"sqlite:///{url}"
        return cls(make_engine(url))

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def _upsert(self, table: Any) -> Any:
        """The dialect's INSERT, which has `on_conflict_do_nothing/_do_update`."""
        return pg_insert(table) if self.is_postgres else sqlite_insert(table)

    def _insert_ignore(self, table: Any) -> Any:
        return self._upsert(table).on_conflict_do_nothing()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def atomic(self) -> Iterator[Connection]:
        """One write transaction. Inside another one on the same thread it joins that one, so a
        caller makes several store methods one transaction (a fold with its retirements, notes,
        counters and log line) by calling them inside `with store.atomic():`."""
        outer: Connection | None = getattr(self._open, "conn", None)
        if outer is not None:
            yield outer
            return
        try:
            with s.writing(self.engine) as conn:
                self._open.conn = conn
                try:
                    yield conn
                finally:
                    self._open.conn = None
        except SQLAlchemyError as e:
            raise StoreError(f"database error, transaction rolled back: {e}") from e

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection to read on: the open transaction's when there is one (a read inside
        `atomic()` sees what that transaction wrote), else a fresh one."""
        outer: Connection | None = getattr(self._open, "conn", None)
        if outer is not None:
            yield outer
            return
        with self.engine.connect() as conn:
            yield conn
