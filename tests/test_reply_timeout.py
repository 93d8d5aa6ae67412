"""Every wait is the user's to set (issue 42.2): `--reply-timeout` (env KIOKU_REPLY_TIMEOUT)
reaches the HTTP client of `kioku serve`, `chat`, `summarize` and `eval`; through a real
`kioku serve`, a model slower than the default waits is waited for, streamed and not, and a
streamed reply's wait counts from its last byte.

Time-scaled: "a model that answers in 200 s with --reply-timeout 300" is a model that answers
in 2 s with --reply-timeout 3 (and fails with --reply-timeout 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kioku.cli import app, register_extensions
from kioku.client import OpenAIChatModel, Timeouts
from kioku.config import Settings, build_kioku, from_env, to_env
from kioku.errors import ConfigError
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.service.upstream import Upstream
from kioku.store import Store
from kioku.tls import tls_context
from tests.killable import Server

register_extensions()

SLOW_S = 2.0  # the model's answer takes this long (200 s, scaled)
LONG_REPLY = "The tea house keeps its lanterns lit until the last guest has gone home. " * 2


def test_the_reply_timeout_reaches_every_http_client(tmp_path: Path) -> None:
    s = from_env({"KIOKU_REPLY_TIMEOUT": "300"})
    assert s.reply_timeout_s == 300
    assert s.profile_obj.reply_timeout_s == 300
    assert from_env(to_env(s)).reply_timeout_s == 300  # `serve --workers N` passes it on
    # the proxy's upstream: a non-streamed reply's whole wait, a stream's longest silence
    assert Upstream("http://127.0.0.1:9/v1", s.profile_obj).timeout.read == 300
    # `kioku chat`'s reply model, and the eval's answering model
    kk = build_kioku(s.with_(db=f"sqlite:///{tmp_path / 'k.db'}", llm_url="http://127.0.0.1:9"))
    assert isinstance(kk.reply_model, OpenAIChatModel)
    assert kk.reply_model.api.timeouts.for_purpose("reply").read == 300
    from kioku.eval.cli_shared import chat_model as _chat_model

    model = _chat_model("http://127.0.0.1:9", None, s)
    assert model.api.timeouts == Timeouts(reply=300)
    # the default stays the profile's
    assert Settings().profile_obj.reply_timeout_s == 120
    with pytest.raises(ConfigError, match="KIOKU_REPLY_TIMEOUT"):
        from_env({"KIOKU_REPLY_TIMEOUT": "soon"})


@pytest.mark.parametrize(
    "command", [["serve"], ["chat"], ["summarize"], ["eval", "locomo"]], ids=" ".join
)
def test_every_command_that_waits_for_a_model_takes_reply_timeout(command: list[str]) -> None:
    out = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "--reply-timeout" in out.output


@pytest.fixture
def slow() -> Iterator[FakeUpstream]:
    with FakeUpstream(delay_s=SLOW_S, reply=lambda body: LONG_REPLY) as up:
        yield up


def serve(tmp_path: Path, upstream: str, timeout_s: int) -> Server:
    db = f"sqlite:///{tmp_path / f'kioku-{timeout_s}.db'}"
    key = create_key(Store.open(db), "acme")[1]
    log = tmp_path / f"serve-{timeout_s}.log"
    server = Server(db, upstream, log, key, ("--no-worker", "--reply-timeout", str(timeout_s)))
    server.start()
    return server


def ask(server: Server, cid: str, stream: bool) -> tuple[int, str]:
    """One turn; its status and what came back (the reply's text, or the error's message)."""
    auth = {"Authorization": f"Bearer {server.key}"}
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=server.url, headers=auth, timeout=30, verify=tls_context()) as h:
        r = h.post("/v1/chat/completions", headers={"X-Kioku-Conversation": cid}, json=body)
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["message"]
    if not stream:
        return 200, r.json()["choices"][0]["message"]["content"]
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event: dict[str, Any] = json.loads(line[6:])
            if "error" in event:
                return 502, event["error"]["message"]
            text += event["choices"][0]["delta"].get("content") or ""
    return 200, text


@pytest.mark.slow
def test_a_slow_model_is_waited_for_with_a_longer_reply_timeout(
    slow: FakeUpstream, tmp_path: Path
) -> None:
    server = serve(tmp_path, slow.url, 3)
    try:
        assert ask(server, "plain", stream=False) == (200, LONG_REPLY)
        assert ask(server, "streamed", stream=True) == (200, LONG_REPLY)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_model_slower_than_the_reply_timeout_answers_504_naming_the_flag(
    slow: FakeUpstream, tmp_path: Path
) -> None:
    server = serve(tmp_path, slow.url, 1)
    try:
        for cid, stream in (("plain", False), ("streamed", True)):
            status, message = ask(server, cid, stream)
            assert status == 504, message
            assert "--reply-timeout" in message and "KIOKU_REPLY_TIMEOUT" in message
    finally:
        server.stop()


@pytest.mark.slow
def test_a_stream_that_keeps_coming_outlasts_the_reply_timeout(tmp_path: Path) -> None:
    """Each piece of the reply comes 0.3 s after the last, 20-odd pieces: the whole stream
    takes far longer than --reply-timeout 1, and is relayed whole."""
    with FakeUpstream(reply=lambda body: LONG_REPLY, chunk_delay_s=0.3) as up:
        server = serve(tmp_path, up.url, 1)
        try:
            assert len(LONG_REPLY) // 8 * 0.3 > 3  # the stream's length, well past the timeout
            assert ask(server, "trickle", stream=True) == (200, LONG_REPLY)
        finally:
            server.stop()
