"""`kioku import` cannot damage a conversation: a tenant of its own, no writing into an existing
conversation without --append, the same file twice is a no-op, times and names kept; a
SillyTavern chat imported under its chat id is the conversation the extension continues."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kioku.cli import app
from kioku.datasets import load_locomo
from kioku.engine import Kioku
from kioku.errors import InputError
from kioku.importer import import_transcript, overlap
from kioku.profiles import LOCAL_8K
from kioku.service.proxy import ChatBody, split_messages
from kioku.store import Store
from kioku.sync import sync
from tests.conftest import shared_file

runner = CliRunner()


def tavern_chat(path: Path, turns: int, start: int = 0) -> Path:
    """A SillyTavern chat file: header, greeting, `turns` exchanges, a hidden system note."""
    lines: list[dict[str, Any]] = [{"user_name": "Alex", "character_name": "Seraphina"}]
    lines.append({"name": "Seraphina", "is_user": False, "mes": "*She smiles.* Welcome.",
                  "send_date": "November 12, 2024 9:58am"})  # fmt: skip
    for i in range(start, turns):
        lines.append({"name": "Alex", "is_user": True, "mes": f"question {i}",
                      "send_date": f"November 12, 2024 10:{i:02d}am"})  # fmt: skip
        lines.append({"name": "Seraphina", "is_user": False, "mes": f"answer {i}",
                      "send_date": f"November 12, 2024 10:{i:02d}pm", "swipes": [f"answer {i}"]})  # fmt: skip
        if i == 1:
            lines.append({"name": "System", "is_user": False, "is_system": True, "mes": "(hidden)"})
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    return path


def kioku(tenant: str = "default") -> Kioku:
    return Kioku(Store.open("sqlite://"), profile=LOCAL_8K, tenant=tenant)


def texts(kk: Kioku, cid: str) -> list[str]:
    return [e.text for e in kk.store.entries(cid)]


def test_a_sillytavern_chat_keeps_times_names_and_leaves_out_system_messages(
    tmp_path: Path,
) -> None:
    kk = kioku()
    path = tavern_chat(tmp_path / "Seraphina - 2024-11-12@09h58m00s.jsonl", 3)
    out = import_transcript(kk, path, "sillytavern", progress=False)
    assert out["conversation"] == "Seraphina - 2024-11-12@09h58m00s"  # SillyTavern's chat id
    rows = kk.store.entries(out["conversation"])
    assert [e.text for e in rows] == ["*She smiles.* Welcome.", "question 0", "answer 0",
                                      "question 1", "answer 1", "question 2", "answer 2"]  # fmt: skip
    assert [e.message.author for e in rows[:3]] == ["Seraphina", "Alex", "Seraphina"]
    assert (
        rows[1].message.at is not None and rows[1].message.at.isoformat() == "2024-11-12T10:00:00"
    )
    assert rows[2].message.at is not None and rows[2].message.at.hour == 22


def test_locomo_messages_keep_their_session_dates(tmp_path: Path) -> None:
    data = shared_file("datasets", "locomo", "locomo10.json")
    t = load_locomo(data, 0)
    kk = kioku()
    import_transcript(kk, data, "locomo", conversation_id="lc", progress=False)
    first = kk.store.entries("lc", 0, 0)[0]
    assert first.message.at == t.messages[0].at is not None


def test_an_existing_conversation_is_written_only_with_append(tmp_path: Path) -> None:
    kk = kioku()
    for d in ("early", "later", "other"):
        (tmp_path / d).mkdir()
    early = tavern_chat(tmp_path / "early" / "chat.jsonl", 2)
    import_transcript(kk, early, "sillytavern", conversation_id="c", progress=False)
    before = texts(kk, "c")
    # the same file again: nothing changes (not 419 → 788 → 1,207)
    again = import_transcript(kk, early, "sillytavern", conversation_id="c", progress=False)
    assert again["imported"] == 0 and texts(kk, "c") == before
    # the chat went on in SillyTavern: the longer file is refused without --append…
    later = tavern_chat(tmp_path / "later" / "chat.jsonl", 4)
    with pytest.raises(InputError, match="continues it with 4 new message.*--append"):
        import_transcript(kk, later, "sillytavern", conversation_id="c", progress=False)
    assert texts(kk, "c") == before
    # …and with it, only what the conversation lacks is added
    out = import_transcript(kk, later, "sillytavern", conversation_id="c", append=True,
                            progress=False)  # fmt: skip
    assert out["imported"] == 4 and texts(kk, "c") == [*before, "question 2", "answer 2",
                                                       "question 3", "answer 3"]  # fmt: skip
    # a different chat under the same id is refused, and --append puts it after, whole
    other = tavern_chat(tmp_path / "other" / "chat.jsonl", 7, start=5)
    with pytest.raises(InputError, match="not a part of it"):
        import_transcript(kk, other, "sillytavern", conversation_id="c", progress=False)
    assert import_transcript(kk, other, "sillytavern", conversation_id="c", append=True,
                             progress=False)["imported"] == 5  # fmt: skip


def test_overlap_is_how_much_of_the_file_the_log_ends_with() -> None:
    assert overlap(["a", "b", "c"], ["b", "c", "d"]) == 2
    assert overlap(["a", "b"], ["x"]) == 0 and overlap([], ["a"]) == 0
    assert overlap(["a", "b", "a"], ["a", "b", "a", "c"]) == 3


def test_cli_imports_for_a_tenant_and_the_extension_continues_it(tmp_path: Path) -> None:
    """The documented path: import the chat for the key's tenant, go on in SillyTavern."""
    db = f"sqlite:///{tmp_path / 'k.db'}"
    chat = tavern_chat(tmp_path / "Seraphina - 2024-11-12@09h58m00s.jsonl", 3)
    args = ["import", "--data", str(chat), "--format", "sillytavern", "--db", db, "--json"]
    r = runner.invoke(app, [*args, "--tenant", "acme"], env={"KIOKU_PROFILE": "local-8k"})
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert first["tenant"] == "acme" and first["imported"] > 0
    r = runner.invoke(app, [*args, "--tenant", "acme"], env={"KIOKU_PROFILE": "local-8k"})
    assert json.loads(r.stdout)["imported"] == 0  # a second run is a no-op
    # ids are per tenant: another tenant's import of the same chat is a conversation of its own
    r = runner.invoke(app, [*args, "--tenant", "other"], env={"KIOKU_PROFILE": "local-8k"})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["imported"] == first["imported"]

    # the extension's next request: SillyTavern's window of the chat plus a new message
    kk = Kioku(Store.open(db), profile=LOCAL_8K, tenant="acme")
    conv = kk.conversation("Seraphina - 2024-11-12@09h58m00s")
    body = ChatBody.model_validate(
        {
            "messages": [
                {"role": "system", "content": "card"},
                *(
                    {"role": "user" if e.role == "user" else "assistant", "content": e.text}
                    for e in kk.store.entries(conv.id)
                ),
                {"role": "user", "content": "question 3"},
            ]
        }  # fmt: skip
    )
    synced = sync(conv, split_messages(body.messages).chat, named=True)
    assert not synced.plan.changes and len(synced.appended) == 1
