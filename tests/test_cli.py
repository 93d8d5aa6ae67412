from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kioku.cli import app, register_extensions
from kioku.datasets import message_to_json
from kioku.messages import Message, Part
from kioku.store import Store
from tests.conftest import shared_file

register_extensions()
runner = CliRunner()
ENV = {"KIOKU_PROFILE": "local-8k", "KIOKU_DB": "", "KIOKU_TENANT": ""}
ROOT = Path(__file__).resolve().parent.parent


def invoke(args: list[str], **kw: Any) -> Any:
    env = {k: v for k, v in ENV.items() if v} | kw.pop("env", {})
    return runner.invoke(app, args, env=env, **kw)


def commands(t: typer.Typer, prefix: str = "") -> list[tuple[str, object]]:
    out = [(prefix + (c.name or c.callback.__name__), c.callback) for c in t.registered_commands]  # type: ignore[union-attr]
    for g in t.registered_groups:
        out += commands(g.typer_instance, prefix + f"{g.name} ")  # type: ignore[arg-type]
    return out


def test_every_command_has_help_with_an_example() -> None:
    for name, callback in commands(app):
        doc = getattr(callback, "__doc__", None) or ""
        assert doc.strip(), f"`kioku {name}` has no help text"
        assert "Example:" in doc, f"`kioku {name}` help has no example"


def test_every_option_has_help_and_flags_read_as_flags() -> None:
    for name, _ in commands(app):
        r = invoke([*name.split(), "-h"])
        assert r.exit_code == 0, (name, r.output)
        options = r.output.split("Options:")[1]
        assert "<bool>" not in options, f"`kioku {name}` shows a flag as taking a value"
        assert "[default: True]" not in options and "[default: False]" not in options, name
        for line in options.splitlines():
            if line.startswith("  -") and "  " not in line.strip():
                pytest.fail(f"`kioku {name}`: option without help: {line.strip()}")


def test_version_and_short_help() -> None:
    r = invoke(["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("kioku ")
    r = invoke(["-h"])
    assert r.exit_code == 0 and "import" in r.stdout and "export" in r.stdout


def write_chat(path: Path, turns: int) -> None:
    lines = [json.dumps({"kioku": 1, "system_prompt": "You are Mika.", "character": "Mika"})]
    for i in range(turns):
        user = Message.user(f"I planted tomatoes on day {i} in the garden.", author="Ken")
        lines.append(json.dumps(message_to_json(user)))
        reply = Message.assistant(f"Tomatoes again on day {i}! Lovely.", author="Mika")
        lines.append(json.dumps(message_to_json(reply)))
    path.write_text("\n".join(lines), encoding="utf-8")


def write_sillytavern(path: Path, turns: int) -> None:
    lines = [json.dumps({"user_name": "Ken", "character_name": "Mika", "chat_metadata": {}})]
    for i in range(turns):
        at = f"2025-06-{1 + i % 28:02d}T10:00:00"
        lines.append(
            json.dumps({"name": "Ken", "is_user": True, "mes": f"hi {i}", "send_date": at})
        )
        lines.append(json.dumps({"name": "Mika", "is_user": False, "mes": f"hello {i}"}))
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def folded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with one folded conversation ('mika') and a short SillyTavern one ('st')."""
    d = tmp_path_factory.mktemp("cli")
    chat = d / "mika.jsonl"
    write_chat(chat, 300)
    db = d / "k.db"
    r = invoke(["import", "--data", str(chat), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["imported"] == 600 and result["raw_start"] > 0
    st = d / "st.jsonl"
    write_sillytavern(st, 5)
    r = invoke(["import", "--data", str(st), "--db", str(db)])  # the format is sniffed
    assert r.exit_code == 0, r.output
    assert "imported 10 messages into 'st'" in r.stdout
    return db


def test_read_commands_print_tables_and_json(folded: Path) -> None:
    db = str(folded)
    r = invoke(["memory", "--db", db, "--json"])
    assert {c["id"] for c in json.loads(r.stdout)} == {"mika", "st"}
    r = invoke(["memory", "--db", db])
    assert r.exit_code == 0 and "mika" in r.stdout and "last active" in r.stdout
    r = invoke(["memory", "mika", "--db", db])
    assert r.exit_code == 0 and "Chapter" in r.stdout

    r = invoke(["search", "mika", "tomatoes day 3", "--db", db, "--json"])
    hits = json.loads(r.stdout)
    assert hits and any("day 3 " in h["text"] for h in hits)
    r = invoke(["search", "mika", "tomatoes day 3", "--db", db])
    assert r.exit_code == 0 and r.stdout.splitlines()[0].split()[:3] == ["seq", "score", "when"]

    r = invoke(["tics", "mika", "--db", db, "--json"])
    assert r.exit_code == 0 and isinstance(json.loads(r.stdout), list)
    r = invoke(["tics", "mika", "--db", db])
    assert r.exit_code == 0 and "Lovely" in r.stdout

    r = invoke(["stats", "mika", "--db", db])
    assert r.exit_code == 0 and "1 conversation\n" in r.stdout and "chapter" in r.stdout


def test_piped_output_is_never_wrapped(tmp_path: Path) -> None:
    chat = tmp_path / "long.jsonl"
    write_chat(chat, 4)
    long = "We flew in a zeppelin over the bay," + " talking for a very long while," * 8
    with chat.open("a", encoding="utf-8") as f:
        f.write("\n" + json.dumps(message_to_json(Message.user(long, author="Ken"))))
    db = str(tmp_path / "k.db")
    assert invoke(["import", "--data", str(chat), "--db", db]).exit_code == 0
    r = invoke(["search", "long", "zeppelin", "--db", db, "-k", "1"])
    assert r.exit_code == 0
    (row,) = [x for x in r.stdout.splitlines()[1:] if "zeppelin" in x]  # one hit, one line
    assert row.rstrip().endswith("very long while,")  # the whole message on one line
    r = invoke(["notes", "long", "--db", db])
    from kioku import notes as notes_layer

    editable = notes_layer.render_editable(notes_layer.notes(Store.open(db), "long"))
    assert r.stdout == editable.rstrip("\n") + "\n"  # piped, the notes are the editable file


def test_cut_and_export_round_trip(folded: Path, tmp_path: Path) -> None:
    db = str(folded)
    out = tmp_path / "mika-export.jsonl"
    r = invoke(["export", "mika", "--db", db, "--out", str(out)])
    assert r.exit_code == 0, r.output
    store = Store.open(db, readonly=True)
    original = [e.message for e in store.entries("mika")]
    again = tmp_path / "again.db"
    r = invoke(["import", "--data", str(out), "--db", str(again), "--conversation", "m2"])
    assert r.exit_code == 0, r.output
    copy = [e.message for e in Store.open(str(again)).entries("m2")]
    assert copy == original

    st = invoke(["export", "st", "--db", db, "--format", "sillytavern"])
    assert st.exit_code == 0
    header, first = (json.loads(x) for x in st.stdout.splitlines()[:2])
    assert header["user_name"] == "Ken" and header["character_name"] == "Mika"
    assert first == {
        "name": "Ken",
        "is_user": True,
        "is_system": False,
        "send_date": "2025-06-01T10:00:00",
        "mes": "hi 0",
        "extra": {"kioku_seq": 0},
    }

    r = invoke(["cut", "st", "--db", db])
    assert r.exit_code == 0 and "raw window starts at seq 10 (was 0)" in r.stdout


def test_export_keeps_structured_parts(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "k.db"))
    store.ensure_conversation("c", character="Mika")
    parts = (Part("narration", "She smiled."), Part("speech", "Hello!", speaker="Mika"))
    store.append("c", Message(role="assistant", parts=parts, author="Mika"), 5)
    from kioku.export import export_lines

    _, line = list(export_lines(store, "c"))
    assert json.loads(line)["parts"][1] == {"kind": "speech", "text": "Hello!", "speaker": "Mika"}


# reads never write, failures leave nothing, every bad input gets one line ----------------------


def fingerprint(db: Path) -> tuple[str, list[str]]:
    """The database file's bytes and the conversations in it."""
    wal = Path(f"{db}-wal")
    data = db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    store = Store.open(str(db), readonly=True)
    try:
        ids = [c.id for c in store.conversations()]
    finally:
        store.close()
    return hashlib.sha256(data).hexdigest(), ids


def content(db: Path) -> list[str]:
    """Every row of every table: what a command may not change, whatever SQLite does with its
    files (a writer's close checkpoints the WAL into the database file)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return list(conn.iterdump())


def test_reads_never_write(folded: Path) -> None:
    db = str(folded)
    before = fingerprint(folded)
    for args in (
        ["memory", "nosuch"],
        ["notes", "nosuch"],
        ["search", "nosuch", "q"],
        ["tics", "nosuch"],
        ["stats", "nosuch"],
        ["export", "nosuch"],
        ["memory", "mika"],
        ["search", "mika", "tomatoes"],
        ["tics", "mika"],
        ["stats"],
        ["notes", "mika"],
        ["export", "mika"],
        ["keys", "list"],
    ):
        r = invoke([*args, "--db", db])
        if "nosuch" in args:
            assert r.exit_code != 0
            assert (
                "no conversation 'nosuch'; tenant 'default' has 2 conversations: mika, st"
                in r.stderr
            )
        else:
            assert r.exit_code == 0, (args, r.output)
    assert fingerprint(folded) == before

    # a writing command refuses an unknown conversation and changes nothing (its open may
    # checkpoint the WAL, so the rows are compared, not the bytes)
    rows = content(folded)
    r = invoke(["cut", "nosuch", "--db", db])
    assert r.exit_code != 0
    assert "no conversation 'nosuch'; tenant 'default' has 2 conversations: mika, st" in r.stderr
    assert content(folded) == rows


def one_error_line(r: Any) -> str:
    assert r.exit_code not in (0, None), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_every_command_against_every_bad_input(folded: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    folder = work / "a-folder"
    folder.mkdir()
    text = work / "notes.txt"
    text.write_text("just some text\n" * 50, encoding="utf-8")
    corrupt = work / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    binary = work / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    chat = work / "chat.jsonl"
    write_chat(chat, 3)
    tavern = work / "tavern.jsonl"
    write_sillytavern(tavern, 3)
    empty = work / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    made = set(work.iterdir())

    bad_dbs = {
        "a folder": (str(folder), "is a folder"),
        "a missing folder": (str(work / "nope" / "k.db"), "does not exist|no database"),
        "a missing file": (str(work / "typo.db"), "no database at|-"),
        "a text file": (str(text), "not a SQLite database"),
        "a corrupt file": (str(corrupt), "not a SQLite database"),
        "mysql": ("mysql://user@localhost/kioku", "not mysql://"),
        "refused PostgreSQL": ("postgresql://kioku:x@127.0.0.1:1/kioku", "is the server running"),
    }
    db_commands = [
        (["memory"], "read"),
        (["memory", "mika"], "read"),
        (["notes", "mika"], "read"),
        (["search", "mika", "tomatoes"], "read"),
        (["tics", "mika"], "read"),
        (["stats"], "read"),
        (["export", "mika"], "read"),
        (["eval", "audit", "mika"], "read"),
        (["keys", "list"], "read"),
        (["cut", "mika"], "write"),
        (["keys", "create", "acme"], "write"),
        (["keys", "revoke", "abc"], "write"),
        (["import", "--data", str(chat)], "write"),
    ]
    for what, (db, expect) in bad_dbs.items():
        for args, mode in db_commands:
            if what == "a missing file" and args[0] in ("import", "keys") and args[1] != "revoke":
                continue  # these create a database there, as they should
            line = one_error_line(invoke([*args, "--db", db]))
            if what == "a missing file" and mode == "write":
                assert "no conversation" in line or "no API key" in line, line
                continue  # it created the database, failed, and removed it again
            assert any(x in line for x in expect.split("|")), (what, args, line)

    bad_data = {
        "a folder": (str(folder), None, "is a folder"),
        "a missing file": (str(work / "nope.json"), None, "no such file"),
        "locomo on JSONL": (str(chat), "locomo", "looks like a kioku file, not locomo"),
        "kioku on SillyTavern": (str(tavern), "kioku", "pass --format sillytavern"),
        "binary": (str(binary), None, "cannot tell the format|not UTF-8 text"),
        "text": (str(text), "kioku", ":1: not JSON (Expecting value); check the file"),
        "empty": (str(empty), "kioku", "no messages to import"),
        "unknown format": (str(chat), "csv", "unknown format"),
    }
    new_db = work / "new.db"
    for what, (data, fmt, expect) in bad_data.items():
        fmt_args = ["--format", fmt] if fmt else []
        for args in (
            ["import", "--db", str(new_db), "--data", data, *fmt_args],
            ["bench", "prefix", "--data", data, *(fmt_args or ["--format", "kioku"])],
            ["summarize", "--data", data, *(fmt_args or ["--format", "kioku"]), "--model", "x"],
            ["eval", "audit", "--data", data, *(fmt_args or ["--format", "kioku"])],
        ):
            if what == "empty" and args[0] != "import":
                continue  # an empty conversation is a refusal only where it is imported
            line = one_error_line(r := invoke(args))
            assert any(x in line for x in expect.split("|")), (what, args, line)
        assert not r.stdout
    for args in (
        ["bench", "recall", "--data", str(chat)],
        ["eval", "locomo", "--data", str(folder)],
    ):
        line = one_error_line(invoke(args))
        assert "not a LoCoMo file" in line or "is a folder" in line, line

    for args, expect in (
        (["demo", "--lang", "fr"], "--lang is ja, en or both"),
        (["bench", "turn", "--sizes", "many"], "--sizes takes numbers"),
        (["export", "mika", "--db", str(folded), "--format", "csv"], "unknown export format"),
        (["chat", "mika", "--db", str(folded)], "no model"),
    ):
        assert expect in one_error_line(invoke(args, env={"KIOKU_LLM_URL": ""}))

    assert set(work.iterdir()) == made, "a failed command left something behind"


def test_a_failed_import_leaves_no_database(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kioku.cli", "import", "--data", str(tmp_path / "nope.json")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and r.stderr.strip() == f"error: no such file: {tmp_path}/nope.json"
    assert list(tmp_path.iterdir()) == []


def test_shared_data_resolves_under_kioku_shared(tmp_path: Path, monkeypatch: Any) -> None:
    locomo = shared_file("datasets", "locomo", "locomo10.json")
    from kioku.datasets import resolve

    shared = locomo.parent.parent.parent
    rel = Path("..") / "shared" / "datasets" / "locomo" / "locomo10.json"
    monkeypatch.chdir(tmp_path)  # a folder with no ../shared beside it
    assert not rel.exists()
    assert resolve(rel, {"KIOKU_SHARED": str(shared)}) == shared / rel.relative_to("../shared")
    assert resolve(rel, {}) == rel


# start-up stays light ------------------------------------------------------------------------


HEAVY = ("sqlalchemy", "httpx", "fastapi", "uvicorn", "psycopg", "numpy", "matplotlib")


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KIOKU_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize(
    "args",
    [["--help"], ["memory", "--db", "/nonexistent/k.db"], ["import", "--data", "/nope.json"]],
)
def test_help_and_error_paths_import_no_database_or_http_stack(args: list[str]) -> None:
    probe = (
        "import sys\n"
        "from kioku.cli import main\n"
        f"sys.argv = ['kioku', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


def test_the_worker_command_repeats_the_queue_lease() -> None:
    from kioku.service import worker_cli
    from kioku.store.jobs import DEFAULT_LEASE_S

    assert worker_cli.DEFAULT_LEASE_S == DEFAULT_LEASE_S


# benchmarks ----------------------------------------------------------------------------------


def test_bench_turn_shape() -> None:
    r = invoke(["bench", "turn", "--sizes", "100,400", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert (
        set(data["p50_ms"]) == {"100", "400"} and "ratio_p50" in data and "naive_ratio_p50" in data
    )
    r = invoke(["bench", "turn", "--sizes", "100"])
    assert r.exit_code == 0 and "p50_ms:" in r.stdout  # an outline for people


@pytest.mark.slow
def test_bench_prefix_on_locomo_slice() -> None:
    path = shared_file("datasets", "locomo", "locomo10.json")
    r = invoke(
        [
            "bench",
            "prefix",
            "--data",
            str(path),
            "--format",
            "locomo",
            "--window",
            "8192",
            "--max-turns",
            "120",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    for key in (
        "turns",
        "folds",
        "major_gcs",
        "cache_breaks",
        "prefix_reuse_mean",
        "prefix_reuse_median",
        "reprocessed_tokens",
        "prompt_tokens_max",
        "overflows",
        "forced_cuts",
        "recall_turns",
        "recall_breaks",
    ):
        assert key in data
    assert set(data["prefill_overhead"]) == {"p50", "p95", "mean"}
    assert data["overflows"] == 0
    assert data["folds"] >= 1
    assert data["recall_breaks"] <= data["folds"] + data["turns"] * data["recall_turns"]
    for base in ("sliding_window", "summary_in_system", "immediate_fold"):
        assert "prefix_reuse_mean" in data[base]
    assert data["prefix_reuse_mean"] > data["sliding_window"]["prefix_reuse_mean"]
    # the token proxy of --time-on's ratio: kioku evaluates a fraction of the sliding window's
    assert 0 < data["fresh_vs_sliding"] < 0.5
    assert data["fold_turns"] >= 1 and data["fresh_tokens_per_fold"] > 0


@pytest.mark.postgres
def test_reads_on_postgresql_run_in_read_only_transactions() -> None:
    from kioku.errors import StoreError
    from tests.pg import fresh_schema

    with fresh_schema() as url:
        store = Store.open(url)
        store.ensure_conversation("mika", character="Mika")
        store.append("mika", Message.user("I planted tomatoes in the garden.", author="Ken"), 9)
        ro = Store.open(url, readonly=True)
        assert [c.id for c in ro.conversations()] == ["mika"]
        with pytest.raises(StoreError, match="read-only transaction"):
            ro.ensure_conversation("other")
        r = invoke(["search", "mika", "tomatoes", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
        assert [h["seq"] for h in json.loads(r.stdout)] == [0]
        line = one_error_line(invoke(["memory", "nosuch", "--db", url]))
        assert "tenant 'default' has 1 conversation: mika" in line
        assert [c.id for c in store.conversations()] == ["mika"]
        ro.close()
        store.close()


def test_keys_list_reads_like_a_person_would(tmp_path: Path) -> None:
    import re

    db = str(tmp_path / "keys.db")
    assert invoke(["keys", "create", "acme", "--db", db]).exit_code == 0
    r = invoke(["keys", "list", "--db", db])
    assert r.exit_code == 0
    header, row = r.stdout.splitlines()
    assert header.split() == ["key", "id", "tenant", "scopes", "created", "revoked"]
    assert re.search(r"acme\s+chat,read,operator\s+\d{4}-\d\d-\d\d \d\d:\d\d", row), row
