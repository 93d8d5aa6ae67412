"""`kioku summarize` and the chronicler's settings, as a user of a local CPU model meets them:
extractive without a model, every chapter in --json/--out, one set of environment variables for
every command, the summary timeout, a low temperature, max_tokens inside the window, and an
error that says which profile or window to use."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kioku.chronicler import DEFAULT_TEMPERATURE, ChroniclerConfig, LLMChronicler
from kioku.cli import app, register_extensions
from kioku.client import OpenAIChatModel
from kioku.config import chronicler_config, chronicler_model, from_env
from kioku.datasets import message_to_json
from kioku.errors import ConfigError, ModelError
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage, ChatRequest, ScriptedModel
from kioku.profiles import LOCAL_8K, get_profile
from kioku.service.loopback import FakeUpstream
from kioku.summarizer import ExtractiveSummarizer, SummaryTask

register_extensions()
runner = CliRunner()


def chat_file(tmp_path: Path, n: int = 40) -> Path:
    """A kioku JSONL chat between Ren and Mika: what Ren says is worth remembering."""
    lines = [json.dumps({"kioku": 1, "user": "Ren", "character": "Mika", "lang": "en"})]
    for i in range(n):
        if i % 2 == 0:
            m = Message.user(f"On day {i} I planted {i} tulip bulbs in the north garden.", "Ren")
        else:
            m = Message("assistant", Message.user(f"Lovely, {i} is a good number.").parts, "Mika")
        lines.append(json.dumps(message_to_json(m)))
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, args, env={"KIOKU_PROFILE": "local-8k", **(env or {})})


def test_without_a_model_summarize_runs_the_extractive_chronicler(tmp_path: Path) -> None:
    data = chat_file(tmp_path)
    out = tmp_path / "memory.json"
    r = invoke(["summarize", "--data", str(data), "--messages", "30", "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got == json.loads(out.read_text(encoding="utf-8"))  # --out writes what --json prints
    assert got["model"] == "extractive" and got["messages"] == 30
    (row,) = got["summaries"]
    assert (row["kind"], row["first_seq"], row["last_seq"], row["source"]) == (
        "chapter",
        0,
        29,
        "extractive",
    )
    assert "tulip" in row["text"] and got["memory"]["chapters"][0]["grounded_share"] == 1.0
    assert "no chronicler model" in r.stderr
    # the old option name still works, hidden
    old = invoke(["summarize", "--data", str(data), "--limit", "30", "--json"])
    assert json.loads(old.stdout)["messages"] == 30
    assert "--limit" not in invoke(["summarize", "-h"]).stdout


def lines_reply(body: dict[str, Any]) -> str:
    """A chronicler that follows the line format: one line per message Ren wrote, citing none
    (the transcript shows no numbers): code finds the message that bears each one out."""
    user = body["messages"][-1]["content"]
    found = re.findall(r"Ren \(user\)\n  On day (\d+) I planted (\d+)", user)
    return "\n".join(f"- Ren planted {k} tulip bulbs on day {d}" for d, k in found)


def test_one_set_of_environment_variables_reaches_the_chronicler(tmp_path: Path) -> None:
    up = FakeUpstream(reply=lines_reply).start()
    env = {
        "KIOKU_SUMMARIZER_URL": up.url,
        "KIOKU_SUMMARIZER_MODEL": "qwen",
        "KIOKU_SUMMARY_TEMPERATURE": "0.1",
    }
    r = invoke(["summarize", "--data", str(chat_file(tmp_path)), "--json"], env)
    assert r.exit_code == 0, r.output
    (body,) = up.chats()
    assert body["model"] == "qwen" and body["temperature"] == 0.1
    got = json.loads(r.stdout)
    row = got["summaries"][0]
    assert row["source"] == "llm" and row["grounding"]["share"] == 1.0
    assert "- #2 Ren: planted 2 tulip bulbs on day 2" in row["text"]  # the model's line
    # without the variable: the low default; --temperature wins over both
    r = invoke(
        ["summarize", "--data", str(chat_file(tmp_path)), "--model", up.url, "--temperature", "0.3"]
    )
    assert r.exit_code == 0 and up.chats()[-1]["temperature"] == 0.3


def test_settings_build_the_chronicler_model_from_the_environment() -> None:
    s = from_env(
        {
            "KIOKU_LLM_URL": "http://127.0.0.1:9/v1",
            "KIOKU_LLM_MODEL": "gemma",
            "KIOKU_LLM_API_KEY": "sk-test",
            "KIOKU_PROFILE": "local-8k",
            "KIOKU_SUMMARY_TIMEOUT": "1200",
        }
    )
    model = chronicler_model(s)
    assert isinstance(model, OpenAIChatModel)
    assert model.api.model == "gemma" and model.http.headers["authorization"] == "Bearer sk-test"
    assert model.api.timeouts.summary == 1200.0 == s.profile_obj.summary_timeout_s
    assert chronicler_config(s).temperature == DEFAULT_TEMPERATURE == 0.2
    assert get_profile("local-8k").summary_timeout_s == 900.0  # a CPU model takes minutes
    with pytest.raises(ConfigError, match="KIOKU_SUMMARY_TIMEOUT"):
        from_env({"KIOKU_SUMMARY_TIMEOUT": "0"})
    with pytest.raises(ConfigError, match="KIOKU_SUMMARY_TEMPERATURE"):
        from_env({"KIOKU_SUMMARY_TEMPERATURE": "hot"})


def test_a_context_length_error_names_the_profile_and_window() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        msg = "Requested tokens (25766) exceed context window of 8192"
        return httpx.Response(400, json={"error": {"message": msg}})

    model = OpenAIChatModel(
        "http://x/v1", profile=get_profile("local-64k"), transport=httpx.MockTransport(handler)
    )
    with pytest.raises(ModelError) as e:
        model.complete(ChatRequest((ChatMessage("user", "hi"),)))
    text = str(e.value)
    assert "exceed context window of 8192" in text
    assert "local-64k, a 65,536-token window" in text and "--profile local-8k" in text
    assert "--window" in text


class Words:
    def count(self, text: str) -> int:
        return max(1, len(text.split()))


def test_every_request_fits_the_window_a_retry_included() -> None:
    """A cut reply is asked again at the ceiling, but never past the window: prompt +
    max_tokens stay inside it (the retry used to ask for 4,096 whatever the window)."""
    entries = tuple(
        LogEntry(i, Message.user(f"On day {i} I planted {i} tulip bulbs.", "Ren"), 10)
        for i in range(40)
    )
    from kioku.models import Completion

    model = ScriptedModel(
        [Completion("#0 Ren: planted", "length"), "#0 Ren: planted 0 tulip bulbs on day 0"]
    )
    task = SummaryTask("chapter", 300, entries, ceiling_tokens=4096, window_tokens=2200, lang="en")
    s = LLMChronicler(model, Words(), ExtractiveSummarizer(Words())).summarize(task)
    assert s.events[:2] == ("truncated", "retry")
    first, retry = model.history
    for req in (first, retry):
        prompt = sum(Words().count(m.content) + 8 for m in req.messages)
        assert prompt + req.max_tokens <= 2200 - ChroniclerConfig().window_margin
    assert retry.max_tokens > first.max_tokens  # more room, as much as the window has


def test_a_prompt_that_fills_the_window_is_never_sent() -> None:
    entries = tuple(LogEntry(i, Message.user("word " * 200, "Ren"), 200) for i in range(10))
    model = ScriptedModel()
    task = SummaryTask("chapter", 300, entries, window_tokens=LOCAL_8K.window // 4, lang="en")
    s = LLMChronicler(model, Words(), ExtractiveSummarizer(Words())).summarize(task)
    assert model.history == [] and s.events == ("no_room", "fallback")


@pytest.mark.parametrize(("fmt", "which"), [("locomo", "0"), ("realpersonachat", "CP")])
def test_a_chapter_is_sized_on_the_prompt_the_chronicler_sends(fmt: str, which: str) -> None:
    """summary_chunk bounds the rendered request (instructions, headers, labels), not the
    messages' text: the Japanese prompt was 2.4× the chunk when the chunk counted text."""
    from kioku.chronicle_prompt import build_request, chapter_ranges
    from kioku.counters import counter_from_spec
    from kioku.datasets import load
    from tests.conftest import shared_file

    shared_file("datasets")
    t = load(None, fmt, speaker=which) if fmt != "locomo" else load(None, fmt, conversation=0)
    counter = counter_from_spec("qwen2.5")
    entries = [LogEntry(i, m, counter.count(m.text)) for i, m in enumerate(t.messages[:400])]
    ranges = chapter_ranges(entries, LOCAL_8K, counter, t.lang)
    assert len(ranges) >= 5
    for chunk in ranges[:-1]:
        task = SummaryTask("chapter", 300, tuple(chunk), lang=t.lang, character=t.character)
        request, _ = build_request(task, 856)
        tokens = sum(counter.count(m.content) for m in request.messages)
        assert LOCAL_8K.summary_prompt is not None
        assert 0.75 * LOCAL_8K.summary_prompt <= tokens <= LOCAL_8K.summary_prompt


def test_memory_json_shows_each_items_grounded_share(tmp_path: Path) -> None:
    from kioku.memory import MemoryItem
    from kioku.store import Store

    db = tmp_path / "k.db"
    store = Store.open(str(db))
    store.ensure_conversation("mika", character="Mika")
    for i in range(4):
        store.append("mika", Message.user(f"message {i}", "Ren"), 5)
    grounding = {"lines": 10, "grounded": 8, "share": 0.8, "dropped": {"name": 2}}
    llm = MemoryItem("chapter", 0, 1, "- #0 Ren: x", 5, "llm", data={"grounding": grounding})
    store.add_item("mika", replace(llm, status="active"))
    store.add_item("mika", MemoryItem("chapter", 2, 3, "[2] Ren: message 2", 5, status="active"))
    store.close()
    r = invoke(["memory", "mika", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    shares = [c["grounded_share"] for c in json.loads(r.stdout)["chapters"]]
    assert shares == [0.8, 1.0]  # an extractive chapter quotes its messages: all grounded


def test_one_name_per_option_across_commands_the_old_names_still_work(tmp_path: Path) -> None:
    """--messages and --conversation mean the same everywhere; --limit, --max-messages and
    --conversation-index still run scripts written for them, hidden from the help."""
    data = chat_file(tmp_path, 200)
    for cmd in (["eval", "audit"], ["bench", "prefix"], ["summarize"]):
        shown = invoke([*cmd, "-h"]).stdout
        assert "--messages" in shown and "--conversation " in shown, cmd
        for old in ("--limit", "--max-messages", "--conversation-index"):
            assert old not in shown, (cmd, old)
    args = ["eval", "audit", "--data", str(data), "--format", "kioku", "--profile", "local-8k"]
    args += ["--window", "2048", "--tokenizer", "estimate", "--json"]
    new = invoke([*args, "--messages", "160"])
    old = invoke([*args, "--conversation-index", "0", "--messages", "160"])
    assert new.exit_code == 0 and old.exit_code == 0, (new.output, old.output)
    assert json.loads(new.stdout)["messages"] == json.loads(old.stdout)["messages"] == 160


def test_the_reply_log_keeps_each_request_and_what_the_model_wrote(tmp_path: Path) -> None:
    """`--replies`: what a model wrote, to read beside what grounding kept of it."""
    import json

    from kioku.models import ChatMessage, ChatRequest, Completion, ScriptedModel
    from kioku.reply_log import ReplyLog

    path = tmp_path / "replies.jsonl"
    model = ScriptedModel(["- Aoi reached the harbour town (#3)", Completion("- cut", "length")])
    log = ReplyLog(model, path)
    for n in (1, 2):
        request = ChatRequest((ChatMessage("user", f"chapter {n}"),), 300, 0.2, purpose="chapter")
        log.complete(request)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(r["purpose"], r["max_tokens"], r["temperature"]) for r in rows] == [
        ("chapter", 300, 0.2)
    ] * 2
    assert [r["messages"][0]["content"] for r in rows] == ["chapter 1", "chapter 2"]
    assert [(r["text"], r["finish_reason"]) for r in rows] == [
        ("- Aoi reached the harbour town (#3)", "stop"),
        ("- cut", "length"),
    ]
