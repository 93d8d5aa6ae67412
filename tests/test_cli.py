from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kioku.cli import app, register_extensions
from kioku.datasets import message_to_json
from kioku.messages import Message
from tests.conftest import shared_file

register_extensions()
runner = CliRunner()


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


def write_chat(path: Path, turns: int) -> None:
    lines = [json.dumps({"kioku": 1, "system_prompt": "You are Mika.", "character": "Mika"})]
    for i in range(turns):
        lines.append(
            json.dumps(
                message_to_json(
                    Message.user(f"I planted tomatoes on day {i} in the garden.", author="Ken")
                )
            )
        )
        lines.append(
            json.dumps(
                message_to_json(
                    Message.assistant(f"Tomatoes again on day {i}! Lovely.", author="Mika")
                )
            )
        )
    path.write_text("\n".join(lines), encoding="utf-8")


def test_import_memory_search_tics_cut_stats(tmp_path: Path) -> None:
    chat = tmp_path / "mika.jsonl"
    write_chat(chat, 300)
    db = str(tmp_path / "k.db")
    env = {"KIOKU_PROFILE": "local-8k"}
    r = runner.invoke(app, ["import", "--data", str(chat), "--db", db], env=env)
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["imported"] == 600 and result["raw_start"] > 0

    r = runner.invoke(app, ["memory", "--db", db, "--json"], env=env)
    assert json.loads(r.stdout)[0]["id"] == "mika"
    r = runner.invoke(app, ["memory", "mika", "--db", db], env=env)
    assert r.exit_code == 0 and "Chapter" in r.stdout

    r = runner.invoke(app, ["search", "mika", "tomatoes day 3", "--db", db], env=env)
    hits = json.loads(r.stdout)
    assert hits and any("day 3 " in h["text"] for h in hits)

    r = runner.invoke(app, ["tics", "mika", "--db", db], env=env)
    assert r.exit_code == 0 and isinstance(json.loads(r.stdout), list)

    r = runner.invoke(app, ["cut", "mika", "--db", db], env=env)
    assert json.loads(r.stdout)["raw_start"] == 600


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    r = runner.invoke(app, ["import", "--data", str(bad), "--db", str(tmp_path / "k.db")])
    assert r.exit_code != 0
    assert "not JSON" in str(r.exception) or "not JSON" in r.output


def test_bench_turn_shape() -> None:
    r = runner.invoke(app, ["bench", "turn", "--sizes", "100,400", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert (
        set(data["p50_ms"]) == {"100", "400"} and "ratio_p50" in data and "naive_ratio_p50" in data
    )


@pytest.mark.slow
def test_bench_prefix_on_locomo_slice() -> None:
    path = shared_file("datasets", "locomo", "locomo10.json")
    r = runner.invoke(
        app,
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
    ):
        assert key in data
    assert data["overflows"] == 0
    assert data["folds"] >= 1
    for base in ("sliding_window", "summary_in_system", "immediate_fold"):
        assert "prefix_reuse_mean" in data[base]
    assert data["prefix_reuse_mean"] > data["sliding_window"]["prefix_reuse_mean"]
