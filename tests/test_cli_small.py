"""The smaller command-line items of issue 42 (point 7): a failed `kioku chat` leaves nothing,
`kioku search` shows a match's neighbours as context, `kioku notes --json`, one version, and no
"seed's" in what a user reads."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import typer.main
from typer.testing import CliRunner

import kioku
from kioku.cli import app, register_extensions
from kioku.messages import Message
from kioku.note import NoteDraft
from kioku.service.loopback import free_port
from kioku.store import Store

register_extensions()
runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
ENV = {"KIOKU_PROFILE": "local-8k", "KIOKU_TENANT": None, "KIOKU_DB": None}


def invoke(args: list[str], **kw: Any) -> Any:
    return runner.invoke(app, args, env=ENV, **kw)


def test_a_chat_whose_model_is_down_leaves_no_conversation(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    key = store.ensure_conversation("other").id
    store.append(key, Message.user("kept as it was"), 4)
    store.close()
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    r = invoke(["chat", "mika", "--model", dead, "--db", db], input="hello\n")
    assert r.exit_code != 0 and "cannot reach the model server" in r.output, r.output
    store = Store.open(db, readonly=True)
    assert [c.public_id for c in store.conversations()] == ["other"]
    assert store.conversation(key).next_seq == 1
    store.close()
    # a conversation that was there keeps the message it was sent (nothing written is lost)
    r = invoke(["chat", "other", "--model", dead, "--db", db], input="still here?\n")
    assert r.exit_code != 0
    store = Store.open(db, readonly=True)
    assert store.conversation(key).next_seq == 2
    store.close()


def test_search_lists_matches_and_shows_their_neighbours_as_context(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    key = store.ensure_conversation("mika").id
    lines = [f"We talked about the weather on day {i}." for i in range(9)]
    lines[4] = "We flew in a zeppelin over the bay."
    for i, text in enumerate(lines):
        role = Message.user if i % 2 == 0 else Message.assistant
        store.append(key, role(text), 10)
    store.close()
    r = invoke(["search", "mika", "zeppelin", "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    (hit,) = json.loads(r.stdout)  # the neighbours' windows scored too: not hits of their own
    assert hit["seq"] == 4 and "zeppelin" in hit["text"] and hit["score"] > 0
    assert [c["seq"] for c in hit["context"]] == [3, 5]
    assert all("score" not in c for c in hit["context"])
    r = invoke(["search", "mika", "zeppelin", "--db", db])
    rows = r.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["3", "4", "5"]
    scored = [row for row in rows if re.match(r"\s*\d+\s+\d+\.\d\d\s", row)]
    assert len(scored) == 1 and "zeppelin" in scored[0]


def test_notes_print_json(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    key = store.ensure_conversation("mika").id
    store.append(key, Message.user("I keep a tortoise called Basil."), 8)
    store.add_note(
        key, NoteDraft("Ren", "relation", "keeps a tortoise called Basil", 0), author="operator",
        origin="test",
    )  # fmt: skip
    store.close()
    r = invoke(["notes", "mika", "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    (note,) = json.loads(r.stdout)
    assert note["subject"] == "Ren" and note["kind"] == "relation"
    assert note["text"] == "keeps a tortoise called Basil" and note["source_seq"] == 0
    assert note["line"] in invoke(["notes", "mika", "--db", db]).stdout
    r = invoke(["notes", "mika", "--db", db, "--json", "--edit"])
    assert r.exit_code != 0


def test_one_version_everywhere() -> None:
    """pyproject reads kioku.__version__; the extension's manifests say the same."""
    r = invoke(["--version"])
    assert r.stdout.strip() == f"kioku {kioku.__version__}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kioku.__version__"}
    for manifest in (ROOT / "manifest.json", ROOT / "integrations/sillytavern/manifest.json"):
        assert json.loads(manifest.read_text())["version"] == kioku.__version__, manifest


# typer carries its own click: its commands are told by what they have, not by click's classes
def _subcommands(command: Any) -> dict[str, Any]:
    return dict(getattr(command, "commands", {}))


def _help_texts(command: Any) -> list[str]:
    texts = [command.help or "", command.short_help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    for sub in _subcommands(command).values():
        texts += _help_texts(sub)
    return texts


def test_no_seed_in_what_users_read() -> None:
    """The field notes kioku was built from are "the seed" to its authors, not its users."""
    from kioku.demo import EXPLAINED

    seen = _help_texts(typer.main.get_command(app)) + list(EXPLAINED.values())
    assert len(seen) > 200  # every command's and option's help was read (subcommands too)
    files = [*(ROOT / "kioku/console").iterdir(), *(ROOT / "integrations/sillytavern").iterdir()]
    files += list((ROOT / "docs").glob("*.md"))
    seen += [f.read_text(encoding="utf-8") for f in files if f.is_file()]
    for text in seen:
        assert not re.search(r"\bseed['’]s\b", text, re.IGNORECASE), text[:200]


def _commands(command: Any, name: str = "kioku") -> list[tuple[str, Any]]:
    out = [(name, command)]
    for sub_name, sub in _subcommands(command).items():
        out += _commands(sub, f"{name} {sub_name}")
    return out


def test_every_command_on_a_stored_conversation_takes_tenant() -> None:
    """One tenant rule (issue 42.3): a command that names a stored conversation takes --tenant."""
    checked = []
    for name, command in _commands(typer.main.get_command(app)):
        names = {p.name for p in command.params if p.param_type_name == "argument"}
        if "conversation" in names or name == "kioku import":
            options = {o for p in command.params for o in getattr(p, "opts", ())}
            assert "--tenant" in options, f"`{name}` has no --tenant"
            checked.append(name.removeprefix("kioku "))
    wanted = {"memory", "chat", "notes", "search", "tics", "cut", "export", "stats", "delete"}
    assert wanted | {"import", "eval audit"} <= set(checked), checked


def test_delete_asks_first_and_no_means_nothing_changes(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    key = store.ensure_conversation("mika").id
    store.append(key, Message.user("I keep a tortoise called Basil."), 8)
    store.close()
    r = invoke(["delete", "mika", "--db", db], input="n\n")
    assert r.exit_code != 0 and "kioku export mika --out mika.jsonl" in r.output, r.output
    assert Store.open(db, readonly=True).find_conversation("default", "mika").next_seq == 1
    r = invoke(["delete", "mika", "--db", db, "--json"], input="y\n")
    assert r.exit_code == 0, r.output
    done = json.loads(r.stdout[r.stdout.index("{") :])  # the test runner echoes the answer
    assert done["id"] == "mika" and done["deleted"]["messages"] == 1
    assert Store.open(db, readonly=True).tenant_counts() == {}
    r = invoke(["delete", "mika", "--db", db, "--yes"])
    assert r.exit_code != 0 and "no conversation 'mika'" in r.output
