"""PostgreSQL for tests: found through `KIOKU_TEST_PG` (see `.ci/postgres.sh`), one fresh schema
per test so tests never see each other's rows.

Without the variable, PostgreSQL tests skip locally and fail in CI (`need`). A schema is cheaper
than a database and isolates just as well: the URL carries `options=-csearch_path=<schema>`, so
every connection of the test (and of the worker processes it starts) lands in it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, make_url, text

from tests.conftest import need

ENV = "KIOKU_TEST_PG"


def pg_url() -> str:
    """The server's URL, or skip (fail in CI) when there is none."""
    url = os.environ.get(ENV, "")
    need(bool(url), f'{ENV} is not set; start PostgreSQL with `eval "$(.ci/postgres.sh)"`')
    return url


def _driver_url(url: str) -> str:
    return (
        "postgresql+psycopg://" + url.split("://", 1)[1] if url.startswith("postgresql://") else url
    )


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL whose connections use a new, empty schema; the schema is dropped afterwards."""
    base = pg_url()
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = create_engine(_driver_url(base))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        url = make_url(base).update_query_dict({"options": f"-csearch_path={name}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


@contextmanager
def backend_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL for `backend` ("sqlite" or "postgresql")."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'k.db'}"
        return
    with fresh_schema() as url:
        yield url


BACKENDS = ("sqlite", "postgresql")
