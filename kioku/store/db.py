"""The database under the store: one engine per URL, SQLite (embedded) or PostgreSQL.

SQLite gets WAL, a busy timeout and write transactions that take the write lock at BEGIN; an
in-memory URL becomes a throwaway file so threads can share it. PostgreSQL refuses NUL in text
as bad input rather than failing deep in the driver.

A database opened `readonly` (what every read command uses) cannot write: SQLite opens the file
with `mode=ro` and never creates one, PostgreSQL runs every transaction READ ONLY, and no
migration runs. Opening never fails with a driver's traceback: a missing file, a folder, a file
that is not a database, a server that refuses the connection or a URL kioku does not speak is a
`StoreError` / `ConfigError` saying what to do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    create_engine,
    event,
    inspect,
    make_url,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from kioku.dburl import check_sqlite_path, database_url, sqlite_path
from kioku.errors import InputError, KiokuError, StoreError
from kioku.store import schema as s

if TYPE_CHECKING:
    from kioku.memory import MemoryItem

DEFAULT_URL = "sqlite:///kioku.db"


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine with the settings kioku relies on (WAL and immediate write locks on SQLite)."""
    url = database_url(url)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not url.startswith("sqlite"):
        if readonly:  # every transaction READ ONLY, beside any options the URL carries
            u = make_url(url)
            given = u.query.get("options")
            given = " ".join(given) if isinstance(given, tuple) else (given or "")
            options = f"{given} -c default_transaction_read_only=on".strip()
            url = u.update_query_dict({"options": options}).render_as_string(hide_password=False)
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
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_path(path, readonly)
        if readonly:
            url = f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    if scratch is not None:
        weakref.finalize(engine, shutil.rmtree, scratch, True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE: a deferred transaction that later
        # writes can deadlock against another writer instead of waiting for it.
        dbapi_conn.isolation_level = None
        # lower() of SQLite folds ASCII only: searches fold every script with this one
        dbapi_conn.create_function("kioku_casefold", 1, _casefold, deterministic=True)
        cur = dbapi_conn.cursor()
        if not readonly:  # a read-only connection reads whatever journal mode the file has
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


def _casefold(text: str | None) -> str | None:
    return text.casefold() if isinstance(text, str) else text


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


def _check_schema(engine: Engine) -> None:
    """A read-only open runs no migration: the database must already be kioku's, and current."""
    where = _where(engine)
    with engine.connect() as conn:
        if not inspect(conn).has_table(s.migrations_table.name):
            raise StoreError(f"{where} is not a kioku database (no kioku tables in it)")
        done = {r.name for r in conn.execute(select(s.migrations_table.c.name))}
    missing = [name for name, _ in s.MIGRATIONS if name not in done]
    if missing:
        raise StoreError(
            f"{where} was written by an older kioku (missing {', '.join(missing)}); "
            "upgrade it with any writing command, e.g. `kioku worker --once --db …`"
        )


def _where(engine: Engine) -> str:
    """The database as people name it: a path, or the URL without its password."""
    if engine.dialect.name == "sqlite":
        name = engine.url.database or ""
        return name[len("file:") :].split("?", 1)[0] if name.startswith("file:") else name
    url = engine.url.set(drivername=engine.dialect.name)
    return url.render_as_string(hide_password=True)


def _explain(e: SQLAlchemyError, engine: Engine) -> str:
    """One line for a database that cannot be opened."""
    where = _where(engine)
    detail = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
    if "file is not a database" in detail:
        return f"{where} is not a SQLite database (a misspelled --db?)"
    if "unable to open database file" in detail:
        return f"cannot open {where}: {detail}"
    if engine.dialect.name == "postgresql":
        return (
            f"cannot use PostgreSQL at {where}: {detail}; is the server running and the URL right?"
        )
    return f"database error at {where}: {detail}"


def lock_key(*parts: str) -> int:
    """A PostgreSQL advisory lock key (signed 64 bits) for what `parts` name: the first 8 bytes
    of a BLAKE2b of them. `hashtext` has 32 bits, so two of a few tens of thousands of names
    share a lock (`acme`'s `mika-7171` and `evil`'s `e120283` did); here a collision is a 1 in
    2^64 chance per pair. The first part names what the lock is for (`turn`, `claim`): one
    kind of lock never collides with another."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def new_id(result: Any) -> int:
    """The primary key an INSERT just made."""
    return int(result.inserted_primary_key[0])


def item_values(
    conversation_id: str, item: MemoryItem, *, created_at: float, replaces: list[int] | None
) -> dict[str, Any]:
    """A memory item as a `memory_items` row (written new, or copied into a branch)."""
    return dict(
        conversation_id=conversation_id,
        kind=item.kind,
        first_seq=item.first_seq,
        last_seq=item.last_seq,
        text=item.text,
        data=dict(item.data) if item.data else None,
        tokens=item.tokens,
        source=item.source,
        model=item.model,
        prompt_version=item.prompt_version,
        status=item.status,
        ready_at=item.ready_at,
        created_at=created_at,
        replaces=replaces,
        stale=int(item.stale),
    )


class Database:
    """An engine with its schema migrated, and the transaction helpers every table uses."""

    def __init__(self, engine: Engine, *, readonly: bool = False) -> None:
        self.engine = engine
        self.readonly = readonly
        # the connection of the transaction this thread has open, if any (see `atomic`)
        self._open = threading.local()
        self._statements: dict[str, Any] = {}
        try:
            if readonly:
                _check_schema(engine)
            else:
                s.migrate(engine)
        except SQLAlchemyError as e:
            engine.dispose()
            raise StoreError(_explain(e, engine)) from e
        except KiokuError:
            engine.dispose()
            raise

    @classmethod
    def open(cls, url: str = DEFAULT_URL, *, readonly: bool = False) -> Self:
        """Open (with `readonly`: never create, never write) the database at a path or URL."""
        return cls(make_engine(url, readonly=readonly), readonly=readonly)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def _upsert(self, table: Any) -> Any:
        """The dialect's INSERT, which has `on_conflict_do_nothing/_do_update`."""
        return pg_insert(table) if self.is_postgres else sqlite_insert(table)

    def _insert_ignore(self, table: Any) -> Any:
        return self._upsert(table).on_conflict_do_nothing()

    def _built(self, name: str, build: Callable[[], Any]) -> Any:
        """A statement of this store's dialect, built once: building a SQLAlchemy statement
        costs more than SQLite takes to run it, and a turn runs a dozen. Its values come as
        parameters (`bindparam`)."""
        stmt = self._statements.get(name)
        if stmt is None:
            stmt = self._statements[name] = build()
        return stmt

    def _still_there(self, conn: Connection, conversation_id: str) -> bool:
        """Whether the conversation exists, asked by a write that may come after it was
        deleted (a summary job's log line, notes from a model's late reply): such a write is
        dropped, never left behind. On PostgreSQL the row stays locked against a delete until
        the transaction ends (a delete locks it first: `kioku.store.removal`)."""

        def build() -> Any:
            c = s.conversations.c
            return select(c.id).where(c.id == bindparam("cid")).with_for_update(key_share=True)

        return (
            conn.execute(self._built("still_there", build), {"cid": conversation_id}).first()
            is not None
        )

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        """One trivial read of kioku's own schema on a fresh connection (`/readyz`): raises
        `StoreError` when the database cannot answer. Says which error, never the URL."""
        try:
            with self.engine.connect() as conn:
                conn.execute(select(s.conversations.c.id).limit(1)).first()
        except SQLAlchemyError as e:
            raise StoreError(f"the database cannot answer a query ({type(e).__name__})") from e

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
