"""Where a database lives: the URL kioku opens for a path, and what is wrong with a path.

Kept apart from `kioku.store.db` so that a misspelled `--db`, a folder or a URL kioku does not
speak is refused before the database stack is imported: the command line's error paths stay
light.
"""

from __future__ import annotations

from pathlib import Path

from kioku.errors import ConfigError, StoreError

SCHEMES = ("sqlite", "postgresql")


def database_url(url: str) -> str:
    """A SQLite path or a URL, as the URL SQLAlchemy opens; refuses what kioku does not speak."""
    if "://" not in url:
        return f"sqlite:///{url}"
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme == "postgres":
        return "postgresql://" + url.split("://", 1)[1]
    if scheme not in SCHEMES:
        raise ConfigError(
            f"kioku stores in SQLite (a file path or sqlite:///path) or PostgreSQL "
            f"(postgresql://user:password@host/db), not {scheme}://"
        )
    return url


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (None for another database or an in-memory one)."""
    if not url.startswith("sqlite") or url in ("sqlite://", "sqlite:///:memory:"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path.startswith("file:"):
        path = path[len("file:") :].split("?", 1)[0]
    return Path(path) if path else None


def check_sqlite_path(path: Path, readonly: bool) -> None:
    """A SQLite file that can be opened (`readonly`: that exists), or a StoreError saying why
    not."""
    if path.is_dir():
        raise StoreError(f"{path} is a folder; give a database file, e.g. {path / 'kioku.db'}")
    if readonly and not path.exists():
        raise StoreError(
            f"no database at {path} (a misspelled --db?); `kioku import` or `kioku serve` "
            "creates one"
        )
    folder = path.parent
    if not readonly and not folder.is_dir():
        raise StoreError(f"cannot create {path}: the folder {folder} does not exist")
