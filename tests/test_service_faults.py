"""Faults behind the proxy that must not become 500s or dropped streams (issue 21).

An upstream whose `usage` does not fit a number (`1e999`, `Infinity`) made `wire._usage` raise
`OverflowError` on 36c9307: the valid reply was thrown away as a 500, and a stream dropped with no
error event. And a stream whose reply cannot be stored (a full disk) must end with an SSE `error`
event, the way a failing upstream's does, not stop mid-way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from tests.test_service_support import Harness, running

CID = {"X-Kioku-Conversation": "faults-1"}


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    with running(f"sqlite:///{tmp_path / 'k.db'}") as harness:
        yield harness


def completion(text: str, usage: str) -> bytes:
    return (
        '{"id": "c1", "object": "chat.completion", "model": "m", "choices": [{"index": 0, '
        f'"message": {{"role": "assistant", "content": "{text}"}}, "finish_reason": "stop"}}], '
        f'"usage": {{"prompt_tokens": {usage}, "completion_tokens": 3}}}}'
    ).encode()


def stream(text: str, usage: str) -> bytes:
    events = [
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}
        for d in ({"role": "assistant", "content": text},)
    ]
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    lines.append(
        'data: {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
        f'"usage": {{"prompt_tokens": {usage}, "completion_tokens": 3}}}}\n\n'
    )
    return ("".join(lines) + "data: [DONE]\n\n").encode()


@pytest.mark.parametrize("usage", ["1e999", "Infinity", "-Infinity", "1.5", '"12"', "-4"])
def test_a_usage_that_is_no_count_is_ignored_and_the_reply_kept(h: Harness, usage: str) -> None:
    h.up.raw = lambda body: (200, "application/json", completion("kept reply", usage))
    with h.http() as c:
        r = c.post("/v1/chat/completions", headers=CID, json={"messages": [_user("hi")]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "kept reply"
    assert h.texts("faults-1") == ["hi", "kept reply"]


@pytest.mark.parametrize("usage", ["1e999", "Infinity"])
def test_a_stream_whose_usage_is_no_count_still_ends_and_is_stored(h: Harness, usage: str) -> None:
    h.up.raw = lambda body: (200, "text/event-stream", stream("streamed reply", usage))
    body = {"messages": [_user("hi")], "stream": True}
    with h.http() as c, c.stream("POST", "/v1/chat/completions", headers=CID, json=body) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert not any('"error"' in ln for ln in lines)
    assert h.texts("faults-1") == ["hi", "streamed reply"]


def test_a_stream_whose_reply_cannot_be_stored_ends_with_an_error_event(h: Harness) -> None:
    """The disk fills while the upstream answers: the reply cannot be committed, so the client
    gets an error event in place of the finish and `[DONE]` (never a reply it would think
    stored), its message stays stored, and once there is room the conversation goes on."""
    full = {"on": False}

    @event.listens_for(h.store.engine, "connect")
    def _limit(dbapi: Any, _rec: Any) -> None:
        if full["on"]:
            pages = dbapi.execute("PRAGMA page_count").fetchone()[0]
            dbapi.execute(f"PRAGMA max_page_count = {pages}")

    def fill(body: dict[str, Any]) -> str:
        full["on"] = True
        h.store.engine.dispose()
        return "a reply long enough to need a page " + "x" * 20_000

    h.up.reply = fill
    body = {"messages": [_user("hi")], "stream": True}
    with h.http() as c, c.stream("POST", "/v1/chat/completions", headers=CID, json=body) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert "[DONE]" not in lines[-1]
    error = json.loads(lines[-1][6:])["error"]
    assert error["code"] == "stream_failed" and "not stored" in error["message"]
    full["on"] = False
    h.store.engine.dispose()
    h.up.reply = lambda body: "and now it is stored"
    with h.http() as c:
        r = c.post("/v1/chat/completions", headers=CID, json={"messages": [_user("again")]})
    assert r.status_code == 200, r.text
    assert h.texts("faults-1") == ["hi", "again", "and now it is stored"]


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}
