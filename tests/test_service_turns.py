"""One turn at a time per conversation, through the running service: a double submit gets one
reply and never jams the conversation, an Idempotency-Key replays its reply, a request that
waits too long gets 409, the reply is stored before the response, and two services on one
database (SQLite and PostgreSQL) take turns as one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import test_service_support as support
from tests.pg import BACKENDS, backend_url
from tests.test_service_support import Harness, running

harness, service = support.harness, support.service

CARD = {"role": "system", "content": "You are Mika, a cheerful cat who runs a tea shop."}


def post(
    h: httpx.Client,
    cid: str,
    messages: list[dict[str, str]],
    headers: dict[str, str] | None = None,
    **body: Any,
) -> httpx.Response:
    return h.post(
        "/v1/chat/completions",
        headers={"X-Kioku-Conversation": cid, **(headers or {})},
        json={"messages": messages, **body},
    )


def asked(service: Harness, text: str) -> int:
    """How often the upstream was asked to answer `text`."""
    users = (
        [m["content"] for m in b["messages"] if m["role"] == "user"] for b in service.up.chats()
    )
    return sum(1 for u in users if u and u[-1] == text)


def at_once(n: int, send: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    start = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        start.wait()
        return send(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def content(r: httpx.Response) -> str:
    return str(r.json()["choices"][0]["message"]["content"])


def test_a_double_submit_gets_one_reply_and_the_conversation_goes_on(service: Harness) -> None:
    service.up.delay_s = 0.3
    chat = [CARD, {"role": "user", "content": "hello, twice"}]
    with service.http() as h:
        rs = at_once(8, lambda _: post(h, "dup-1", chat))
        assert [r.status_code for r in rs] == [200] * 8
        assert {content(r) for r in rs} == {"(reply to: hello, twice)"}
        assert sorted(r.headers.get("x-kioku-replayed", "") for r in rs) == [""] + ["true"] * 7
        assert asked(service, "hello, twice") == 1
        assert service.texts("dup-1") == ["hello, twice", "(reply to: hello, twice)"]
        # not jammed: the next stateless turn is an ordinary one
        chat += [
            {"role": "assistant", "content": content(rs[0])},
            {"role": "user", "content": "and?"},
        ]
        r = post(h, "dup-1", chat)
        assert r.status_code == 200, r.text
    assert service.texts("dup-1")[2:] == ["and?", "(reply to: and?)"]


def test_identical_stateful_requests_store_one_turn(service: Harness) -> None:
    service.up.delay_s = 0.2
    with service.http() as h:
        rs = at_once(3, lambda _: post(h, "dup-2", [{"role": "user", "content": "just once"}]))
    assert [r.status_code for r in rs] == [200] * 3
    assert service.texts("dup-2") == ["just once", "(reply to: just once)"]


def test_different_requests_take_turns(service: Harness) -> None:
    """Two messages sent at once: each reply follows its own message in the log."""
    service.up.delay_s = 0.2
    with service.http() as h:
        rs = at_once(4, lambda i: post(h, "turns-1", [{"role": "user", "content": f"msg {i}"}]))
    assert all(r.status_code == 200 for r in rs)
    texts = service.texts("turns-1")
    assert len(texts) == 8
    for user, reply in zip(texts[::2], texts[1::2], strict=True):
        assert user.startswith("msg ") and reply == f"(reply to: {user})"


def test_an_idempotency_key_replays_the_reply(service: Harness) -> None:
    msg = [{"role": "user", "content": "remember the comet"}]
    key = {"Idempotency-Key": "2f1c7a40-comet"}
    with service.http() as h:
        first = post(h, "idem-1", msg, key)
        assert first.status_code == 200 and "x-kioku-replayed" not in first.headers
        again = post(h, "idem-1", msg, key)
        assert again.status_code == 200, again.text
        assert again.headers["x-kioku-replayed"] == "true"
        assert content(again) == content(first)
        assert again.headers["x-kioku-reply-seq"] == first.headers["x-kioku-reply-seq"] == "1"
        assert asked(service, "remember the comet") == 1
        # the same key with another request is refused, and changes nothing
        other = post(h, "idem-1", [{"role": "user", "content": "something else"}], key)
        assert other.status_code == 422 and "Idempotency-Key" in other.json()["error"]["message"]
        elsewhere = post(h, "idem-2", msg, key)
        assert elsewhere.status_code == 422
        assert post(h, "idem-1", msg, {"Idempotency-Key": ""}).status_code == 400
    # keys are per tenant: another tenant's identical key is its own request
    with service.http("zeta") as z:
        mine = post(z, "idem-1", msg, key)
        assert mine.status_code == 200 and "x-kioku-replayed" not in mine.headers
    assert service.texts("idem-1") == ["remember the comet", "(reply to: remember the comet)"]


def test_a_streamed_request_replays_as_a_stream(service: Harness) -> None:
    msg = [{"role": "user", "content": "a streamed comet"}]
    key = {"Idempotency-Key": "stream-key-1"}
    with service.http() as h:
        lines = [post(h, "idem-3", msg, key, stream=True).text for _ in range(2)]
    assert lines[0].rstrip().endswith("data: [DONE]") and lines[1].rstrip().endswith("[DONE]")
    assert '"content": "(reply to: a streamed comet)"' in lines[1]
    assert asked(service, "a streamed comet") == 1
    assert service.texts("idem-3") == ["a streamed comet", "(reply to: a streamed comet)"]


def test_a_retry_with_its_key_after_an_upstream_failure_runs_again(service: Harness) -> None:
    msg = [{"role": "user", "content": "try again"}]
    key = {"Idempotency-Key": "retry-after-failure"}
    service.up.fail = lambda body: 500
    with service.http() as h:
        assert post(h, "idem-4", msg, key).status_code == 502
        service.up.fail = None
        r = post(h, "idem-4", msg, key)
    assert r.status_code == 200 and "x-kioku-replayed" not in r.headers
    assert service.texts("idem-4") == ["try again", "(reply to: try again)"]


def test_a_request_that_waits_too_long_gets_409_and_stores_nothing(service: Harness) -> None:
    service.up.delay_s = 1.0
    gate = service.svc.gate
    wait, gate.wait_s = gate.wait_s, 0.3
    try:
        with service.http() as h, ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, h, "busy-1", [{"role": "user", "content": "first"}])
            time.sleep(0.2)
            second = post(h, "busy-1", [{"role": "user", "content": "second"}])
            assert second.status_code == 409, second.text
            assert second.json()["error"]["code"] == "turn_in_progress"
            assert int(second.headers["retry-after"]) >= 1
            assert first.result().status_code == 200
    finally:
        gate.wait_s = wait
    assert service.texts("busy-1") == ["first", "(reply to: first)"]


def test_a_side_request_does_not_wait_for_the_turn_and_a_test_message_ends_its_turn(
    service: Harness,
) -> None:
    """Side requests store nothing, so they take no turn lock: a quiet request is answered while
    a turn of its conversation runs. A Test Message (a lone message in a transcript
    conversation) is found inside a turn: that turn ends with no reply, and the next goes on."""
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "(reply to: hello)"},
    ]
    with service.http() as h:
        assert post(h, "side-1", [history[0]], {"X-Kioku-Mode": "stateless"}).status_code == 200
        service.up.delay_s = 1.0
        gate = service.svc.gate
        wait, gate.wait_s = gate.wait_s, 0.3
        try:
            with ThreadPoolExecutor(1) as pool:
                turn = pool.submit(
                    post, h, "side-1", [*history, {"role": "user", "content": "slow"}]
                )
                time.sleep(0.2)
                quiet = post(h, "side-1", [{"role": "user", "content": "[summarize]"}],
                             {"X-Kioku-Generation": "quiet"})  # fmt: skip
                assert quiet.status_code == 200, quiet.text  # no 409: it did not wait
                assert quiet.headers["x-kioku-stored"] == "false"
                assert turn.result().status_code == 200
        finally:
            gate.wait_s = wait
            service.up.delay_s = 0.0
        test_message = post(h, "side-1", [{"role": "user", "content": "Hi"}])
        assert test_message.status_code == 200
        assert test_message.headers["x-kioku-stored"] == "false"
        after = [*history, {"role": "user", "content": "slow"},
                 {"role": "assistant", "content": "(reply to: slow)"},
                 {"role": "user", "content": "and now?"}]  # fmt: skip
        assert post(h, "side-1", after).status_code == 200  # the turn lock was let go
    assert service.texts("side-1") == [
        "hello", "(reply to: hello)", "slow", "(reply to: slow)", "and now?",
        "(reply to: and now?)",
    ]  # fmt: skip


def test_a_reply_is_in_the_store_when_its_response_arrives(service: Harness) -> None:
    """No waiting for the service to settle: the reply was committed before the response."""
    service.up.reply = lambda body: support.words(len(service.up.chats()), 12)
    with service.http() as h:
        for i in range(10):
            stream = i % 2 == 1
            r = post(h, "read-1", [{"role": "user", "content": f"turn {i}"}], stream=stream)
            assert r.status_code == 200
            reply = support.words(len(service.up.chats()), 12)
            rows = service.store.entries("read-1")
            assert [e.text for e in rows[-2:]] == [f"turn {i}", reply]
            page = h.get("/v1/conversations/read-1/messages", params={"after": 2 * i}).json()
            assert [m["text"] for m in page["data"]] == [reply]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_services_on_one_database_take_turns_as_one(backend: str, tmp_path: Path) -> None:
    """Two `kioku serve`s (each with its own lock in memory) share the store's turn lock."""
    with backend_url(backend, tmp_path) as url, running(url) as a, running(url) as b:
        a.up.delay_s = b.up.delay_s = 0.3
        chat = [CARD, {"role": "user", "content": "one of us answers"}]
        with a.http() as ha, b.http() as hb:
            rs = at_once(6, lambda i: post(ha if i % 2 else hb, "shared-1", chat))
            assert [r.status_code for r in rs] == [200] * 6
            assert asked(a, "one of us answers") + asked(b, "one of us answers") == 1
            assert a.texts("shared-1") == ["one of us answers", "(reply to: one of us answers)"]
            rs = at_once(
                4,
                lambda i: post(
                    ha if i % 2 else hb, "shared-2", [{"role": "user", "content": f"m{i}"}]
                ),
            )
        assert all(r.status_code == 200 for r in rs)
        texts = b.texts("shared-2")
        assert sorted(texts[::2]) == ["m0", "m1", "m2", "m3"]
        assert texts[1::2] == [f"(reply to: {u})" for u in texts[::2]]


def test_a_replayed_reply_that_calls_tools_keeps_its_tool_calls(service: Harness) -> None:
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
    }
    service.up.reply = lambda body: {
        "id": "x",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    msg = [{"role": "user", "content": "weather in Tokyo?"}]
    key = {"Idempotency-Key": "tools-1"}
    with service.http() as h:
        first = post(h, "idem-tools", msg, key)
        again = post(h, "idem-tools", msg, key)
        streamed = post(h, "idem-tools", msg, {"Idempotency-Key": "tools-2"}, stream=True)
        replayed_stream = post(h, "idem-tools", msg, {"Idempotency-Key": "tools-2"}, stream=True)
    assert again.headers["x-kioku-replayed"] == "true"
    choice = again.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == first.json()["choices"][0]["message"]["tool_calls"]
    assert streamed.status_code == replayed_stream.status_code == 200
    assert replayed_stream.headers["x-kioku-replayed"] == "true"
    assert '"tool_calls": [{"index": 0, "id": "call_0"' in replayed_stream.text
