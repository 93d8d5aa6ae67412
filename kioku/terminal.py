"""What the command line shows and how it fails: one place for every command.

- Failures: `KiokuGroup` runs every command (subcommands included) and turns whatever escapes
  into one line on stderr that says what to do, and a non-zero exit (`explain`). Commands never
  catch errors themselves; a traceback only with `KIOKU_DEBUG=1`.
- Stores: `open_store` opens the database read-only for a read (it never creates a file) and
  for writing otherwise; a database this command created is removed again when the command
  fails before writing anything into it, so a failed command leaves nothing behind.
- Tenants: one rule for every command that reads or writes a conversation (`pick_tenant`):
  --tenant (env KIOKU_TENANT), else the database's only tenant, else an error listing them.
- Output: a table or plain text for people, `--json` for scripts. Piped output is never wrapped
  (a table's rows stay one line each, text is written as it is), so it can be edited or grepped.

Nothing here imports the database or HTTP stack: `kioku --help` and every error path stay light.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from typer.core import TyperGroup

from kioku.errors import InputError, KiokuError, NotFound

if TYPE_CHECKING:
    from kioku.config import Settings
    from kioku.engine import Kioku
    from kioku.store import ConversationInfo, Store

# Optional dependencies, by the extra that installs them.
EXTRAS = {"fastapi": "server", "uvicorn": "server", "psycopg": "server", "starlette": "server"}
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
DEBUG_ENV = "KIOKU_DEBUG"
DEFAULT_TENANT = "default"  # a database with no tenant yet


# failures ----------------------------------------------------------------------------------


def explain(e: BaseException) -> str:
    """One line for an error a command raised: what went wrong and what to do."""
    if isinstance(e, KiokuError):
        return str(e)
    if isinstance(e, ModuleNotFoundError):
        top = (e.name or "").split(".")[0]
        if top in EXTRAS:
            extra = EXTRAS[top]
            return (
                f"this command needs {top}: pip install -e '.[{extra}]' "
                f"(or pip install 'kioku[{extra}]')"
            )
        return f"a module is missing: {e.name} (reinstall kioku: pip install -e .)"
    if isinstance(e, IsADirectoryError):
        return f"{e.filename} is a folder; give a file"
    if isinstance(e, FileNotFoundError):
        return f"no such file: {e.filename}"
    if isinstance(e, PermissionError):
        return f"permission denied: {e.filename} (check who owns it)"
    if isinstance(e, UnicodeDecodeError):
        return "the file is not UTF-8 text; save it as UTF-8 and try again"
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON ({e.msg} at line {e.lineno}); check the file and its --format"
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror or e}{where}"
    if type(e).__module__.startswith(("sqlalchemy", "psycopg", "sqlite3")):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"database error: {first}"
    return (
        f"unexpected {type(e).__name__}: {e}; this is a bug in kioku: run again with "
        f"{DEBUG_ENV}=1 for the traceback and report it"
    )


class KiokuGroup(TyperGroup):
    """The root command: runs the chosen command and maps what it raises to one line."""

    def invoke(self, ctx: Any) -> Any:
        opened.clear()
        try:
            result = super().invoke(ctx)
        except typer.Exit as e:
            _close(failed=e.exit_code != 0)
            raise
        except BrokenPipeError:
            # the reader went away (`kioku export … | head`): not an error of the command
            _close(failed=False)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except (typer.Abort, typer.TyperException):
            _close(failed=True)
            raise  # usage errors: typer prints them with a pointer to -h
        except Exception as e:
            _close(failed=True)
            if os.environ.get(DEBUG_ENV):
                raise
            fail(explain(e))
        except KeyboardInterrupt:
            _close(failed=True)
            typer.echo("interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        _close(failed=False)
        return result


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit non-zero (a refusal, not a crash)."""
    line = " ".join(message.split())  # one line, whatever the message held
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(EXIT_ERROR)


# stores ------------------------------------------------------------------------------------

# the stores this command opened, with the SQLite file it created (if it did)
opened: list[tuple[Store, Path | None]] = []


def open_store(db: str, *, write: bool) -> Store:
    """The store at `db`: read-only unless `write`; a read never creates a database."""
    from kioku.dburl import check_sqlite_path, database_url, sqlite_path

    path = sqlite_path(database_url(db))
    if path is not None:
        check_sqlite_path(path, readonly=not write)  # before the database stack is imported
    created = path if write and path is not None and not path.exists() else None
    from kioku.store import Store

    try:
        store = Store.open(db, readonly=not write)
    except BaseException:
        _remove(created)
        raise
    opened.append((store, created))
    return store


def open_kioku(
    settings: Settings,
    *,
    write: bool,
    background: bool = False,
    tenant: str | None | EllipsisType = ...,
) -> Kioku:
    """The engine over `open_store(settings.db, write=write)`, with the layers attached; with
    `tenant` (a command's --tenant, None when not given), for the tenant `pick_tenant` says."""
    from dataclasses import replace

    from kioku.config import build_kioku

    store = open_store(settings.db, write=write)
    if not isinstance(tenant, EllipsisType):
        settings = replace(settings, tenant=pick_tenant(store, tenant))
    return build_kioku(settings, store=store, background=background)


def pick_tenant(store: Store, given: str | None) -> str:
    """The tenant a command acts for: the one it was given (--tenant, env KIOKU_TENANT); else
    the database's only tenant (`kioku keys create … acme` made it), "default" in a database
    with none; with several, an error that lists them: a command never guesses among them."""
    if given:
        return given
    tenants = store.tenants()
    if len(tenants) <= 1:
        return tenants[0] if tenants else DEFAULT_TENANT
    counts = store.tenant_counts()
    shown = ", ".join(f"{t} ({plural(counts.get(t, 0), 'conversation')})" for t in tenants[:20])
    more = f" and {len(tenants) - 20} more" if len(tenants) > 20 else ""
    raise InputError(
        f"this database has {len(tenants)} tenants: {shown}{more}; say which with "
        f"--tenant NAME (or KIOKU_TENANT=NAME)"
    )


def find_conversation(store: Store, conversation_id: str, tenant: str) -> ConversationInfo:
    """The tenant's conversation by its id (ids are per tenant; use the returned `.id`, the
    store's key), or NotFound naming the ones that exist, and the tenants that hold this id
    (a read never creates one)."""
    try:
        return store.find_conversation(tenant, conversation_id)
    except NotFound:
        ids = [c.public_id or c.id for c in store.conversations(tenant)]
        hint = elsewhere(store, tenant, conversation_id)
        if not ids:
            raise NotFound(
                f"no conversation {conversation_id!r}"
                + (
                    hint
                    or ": this database has none yet (`kioku import` or `kioku serve` adds them)"
                )
            ) from None
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        raise NotFound(
            f"no conversation {conversation_id!r}{hint or ''}; tenant {tenant!r} has "
            f"{plural(len(ids), 'conversation')}: {shown}"
        ) from None


def has_conversation(store: Store, conversation_id: str, tenant: str) -> bool:
    try:
        store.find_conversation(tenant, conversation_id)
    except NotFound:
        return False
    return True


def elsewhere(store: Store, tenant: str, conversation_id: str | None = None) -> str:
    """Where the conversations a command did not find under `tenant` are: ", but tenant 'acme'
    holds 3 (run it with --tenant acme)", or "" when no other tenant holds any."""
    others = {t: n for t, n in store.tenant_counts(conversation_id).items() if t != tenant}
    if not others:
        return ""
    ranked = sorted(others.items(), key=lambda tn: (-tn[1], tn[0]))
    held = ", ".join(f"{t!r} ({n})" for t, n in ranked[:5])
    what = "it" if conversation_id is not None else plural(sum(others.values()), "conversation")
    return (
        f" under tenant {tenant!r}, but tenant{'s' if len(others) > 1 else ''} {held} "
        f"hold{'' if len(others) > 1 else 's'} {what} (run the command with "
        f"--tenant {ranked[0][0]})"
    )


def _close(*, failed: bool) -> None:
    for store, created in opened:
        empty = failed and created is not None and _empty(store)
        store.close()
        if empty:
            _remove(created)
    opened.clear()


def _empty(store: Store) -> bool:
    try:
        return store.holds_nothing()
    except Exception:
        return False  # when in doubt, keep the file


def _remove(path: Path | None) -> None:
    if path is None:
        return
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        p.unlink(missing_ok=True)


# output ------------------------------------------------------------------------------------


def piped() -> bool:
    return not sys.stdout.isatty()


def emit(data: Any) -> None:
    """JSON on stdout, for scripts."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=1, default=str) + "\n")


def text(s: str) -> None:
    """Plain text on stdout, never wrapped: piped, it is a file you can edit."""
    sys.stdout.write(s if s.endswith("\n") else s + "\n")


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    right: Sequence[str] = (),
) -> None:
    """A table for people; piped, plain columns with one row per line."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    flat = piped()
    t = Table(
        title=title,
        title_justify="left",
        box=None if flat else box.SIMPLE_HEAD,
        pad_edge=not flat,
    )
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=flat)
    for r in rows:
        t.add_row(*(Text("" if v is None else str(v)) for v in r))
    if not flat:
        Console(highlight=False).print(t)
        return
    buf = io.StringIO()
    Console(file=buf, width=100_000, highlight=False, color_system=None).print(t)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))


def outline(data: Any, indent: str = "") -> list[str]:
    """A JSON-like result as indented `key: value` lines (what `--json` prints, for people)."""
    lines: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, dict | list) and v and not _flat(v):
                lines.append(f"{indent}{k}:")
                lines.extend(outline(v, indent + "  "))
            else:
                lines.append(f"{indent}{k}: {_scalar(v)}")
    elif isinstance(data, list):
        for v in data:
            if isinstance(v, dict | list) and not _flat(v):
                lines.append(f"{indent}-")
                lines.extend(outline(v, indent + "  "))
            else:
                lines.append(f"{indent}- {_scalar(v)}")
    else:
        lines.append(f"{indent}{_scalar(data)}")
    return lines


def _flat(v: Any) -> bool:
    """A short list of numbers or words fits on one line."""
    return isinstance(v, list) and len(v) <= 12 and all(not isinstance(x, dict | list) for x in v)


def _scalar(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{}"
    return str(v)


def note(message: str) -> None:
    """A line for people on stderr (progress, what was written where)."""
    typer.echo(message, err=True)


def plural(n: int, word: str, words: str | None = None) -> str:
    """`1 item`, `2 items`, `1,200 messages`."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def _is(n: int) -> str:
    return "is" if n == 1 else "are"


def when(ts: float | str | None) -> str:
    """A time people read: `2025-06-01 14:03` in local time ('' when unknown)."""
    if ts is None or ts == "":
        return ""
    if isinstance(ts, str):
        try:
            d = datetime.fromisoformat(ts)
        except ValueError:
            return ts
        return d.strftime("%Y-%m-%d %H:%M")
    return datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M")


def one_line(s: str, width: int = 100) -> str:
    """A message squeezed to one line for a table cell."""
    flat = " ".join(s.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
