"""Every SQL statement lives in the store, the folder `kioku/store/`. Anywhere else in kioku,
SQLAlchemy, raw SQL or a connection of one's own fails."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kioku

PACKAGE = Path(kioku.__file__).parent
STORE = PACKAGE / "store"
RAW_SQL = re.compile(
    r"\b(SELECT\s[\s\S]*\sFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+TABLE"
    r"|PRAGMA\s)",
)
OWN_CONNECTION = re.compile(r"\.engine\.(connect|begin)\(|exec_driver_sql|\.raw_connection\(")


def sql_in(source: str) -> list[str]:
    """What in this module's source talks to the database directly (empty: nothing)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("sqlalchemy")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            found.append(f"from {node.module} import …")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and RAW_SQL.search(node.value)
        ):
            found.append(f"SQL string {node.value[:40]!r}")
    found += [f"own connection {m.group(0)!r}" for m in OWN_CONNECTION.finditer(source)]
    return found


def outside_store() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if STORE not in p.parents]


def test_no_sql_outside_the_store() -> None:
    offenders = {
        str(p.relative_to(PACKAGE)): hits
        for p in outside_store()
        if (hits := sql_in(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "SQL belongs behind a named Store method"


def test_the_check_sees_sql() -> None:
    assert sql_in("from sqlalchemy import select\n")
    assert sql_in("import sqlalchemy as sa\n")
    assert sql_in("Q = 'SELECT seq FROM messages WHERE x = 1'\n")
    assert sql_in("q = '''\nUPDATE jobs SET status = 'done'\n'''\n")
    assert sql_in("with store.engine.connect() as c:\n    pass\n")
    assert not sql_in("text = 'select a book from the shelf'\nstore.entries('c')\n")
    assert len(outside_store()) > 40  # the walk does see the package
