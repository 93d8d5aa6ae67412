"""The proxy through the real `openai` client: stateful and stateless clients, streaming, a
SillyTavern-style session with an edit and a swipe, concurrency, disconnects, upstream failures."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from kioku.memory import coverage_gaps
from kioku.revisions import versions
from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service

CARD = "You are Mika, a cheerful cat who runs a tea shop."


def conv_header(cid: str) -> dict[str, str]:
    return {"X-Kioku-Conversation": cid}


def user_turn(c: openai.OpenAI, cid: str, text: str, **kw: Any) -> Any:
    return c.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": CARD}, {"role": "user", "content": text}],
        extra_headers=conv_header(cid),
        **kw,
    )


def test_stateful_client_sends_only_the_new_message(service: Harness) -> None:
    c = service.openai()
    for i in range(3):
        r = user_turn(c, "sf-1", f"message {i}")
        assert r.choices[0].message.content == f"(reply to: message {i})"
        assert r.choices[0].finish_reason == "stop"
    assert service.texts("sf-1") == [
        t for i in range(3) for t in (f"message {i}", f"(reply to: message {i})")
    ]
    last = service.up.chats()[-1]["messages"]
    assert last[0] == {"role": "system", "content": CARD}
    assert [m["content"] for m in last[1:]] == service.texts("sf-1")[:-1]
    assert service.up.chats()[-1]["max_tokens"] <= 256  # never more than the reserve


def test_the_user_field_names_the_conversation(service: Harness) -> None:
    c = service.openai()
    c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "by user field"}], user="uf-1"
    )
    assert service.texts("uf-1") == ["by user field", "(reply to: by user field)"]


def test_stateless_client_stores_each_message_once(service: Harness) -> None:
    c = service.openai()
    transcript: list[dict[str, str]] = [{"role": "system", "content": CARD}]
    for i in range(4):
        transcript.append({"role": "user", "content": f"stateless {i}"})
        r = c.chat.completions.create(
            model="m", messages=transcript, extra_headers=conv_header("sl-1")
        )
        transcript.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    assert service.texts("sl-1") == [m["content"] for m in transcript[1:]]


def test_streaming_stateful_and_stateless(service: Harness) -> None:
    c = service.openai()
    stream = user_turn(c, "st-1", "stream please", stream=True)
    parts = []
    finish = None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == "(reply to: stream please)" and finish == "stop"
    transcript = [
        {"role": "user", "content": "stream please"},
        {"role": "assistant", "content": "".join(parts)},
        {"role": "user", "content": "and again"},
    ]
    stream = c.chat.completions.create(
        model="m", messages=transcript, stream=True, extra_headers=conv_header("st-1")
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == "(reply to: and again)"
    assert service.texts("st-1") == [m["content"] for m in transcript] + [text]


def test_length_finish_passes_through_and_is_counted(service: Harness) -> None:
    def cut(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "x",
            "object": "chat.completion",
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "and then she"},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3},
        }

    service.up.reply = cut
    r = user_turn(service.openai(), "len-1", "tell me everything")
    assert r.choices[0].finish_reason == "length"
    service.idle()
    assert service.store.counters("len-1")["truncated_replies"] == 1
    assert service.store.entries("len-1")[-1].meta["finish_reason"] == "length"
    assert any(e["event"] == "truncated_reply" for e in service.store.log_entries("len-1"))


def test_system_messages_inside_the_history_go_last_and_are_not_stored(service: Harness) -> None:
    c = service.openai()
    c.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": CARD},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "[Author's note: it is raining]"},
            {"role": "user", "content": "what's the weather?"},
            {"role": "system", "content": "[Stay in character]"},
        ],
        extra_headers=conv_header("sys-1"),
    )
    sent = service.up.chats()[-1]["messages"]
    # in order, and as a strict chat template takes them: the system messages inside the
    # history become the user's, and neighbours of one role merge
    assert [m["role"] for m in sent] == ["system", "user"]
    merged = "hi\n\n[Author's note: it is raining]\n\nwhat's the weather?\n\n[Stay in character]"
    assert [m["content"] for m in sent] == [CARD, merged]
    # stored: the chat, not the system messages; the reply is what the upstream wrote
    assert service.texts("sys-1") == ["hi", "what's the weather?", f"(reply to: {merged[-60:]})"]


# SillyTavern -----------------------------------------------------------------------------------


def test_sillytavern_transcript_with_an_edit_and_a_swipe(service: Harness) -> None:
    """A stateless client resends its window every turn; the user edits a message that memory
    already covers, then swipes the last reply."""
    counter = itertools.count()
    service.up.reply = lambda body: f"Mika purrs, answer {next(counter)}: " + support.words(500)
    c = service.openai()
    cid = "tavern-1"
    chat: list[dict[str, str]] = [{"role": "assistant", "content": "Welcome to my tea shop!"}]

    def send(messages: list[dict[str, str]]) -> str:
        r = c.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": CARD}, *messages],
            extra_headers={"X-Kioku-Conversation": cid, "X-Kioku-Character": "Mika"},
        )
        service.idle()
        service.run_jobs()
        return r.choices[0].message.content or ""

    for i in range(16):
        chat.append({"role": "user", "content": support.words(i)})
        chat.append({"role": "assistant", "content": send(chat)})
    info = service.store.conversation(cid)
    chapters = [i for i in service.store.items(cid, "active") if i.kind == "chapter"]
    assert info.raw_start > 0 and chapters, "memory must cover the start for this test"
    assert service.texts(cid) == [m["content"] for m in chat]

    # 1. the user edits message #2 (a reply), which a chapter covers, and sends a new message
    target = next(c for c in chapters if c.first_seq <= 2 <= c.last_seq)
    old = chat[2]["content"]
    chat[2] = {"role": "assistant", "content": "Mika admits the lantern was BLUE all along."}
    chat.append({"role": "user", "content": "So what colour was the lantern?"})
    chat.append({"role": "assistant", "content": send(chat)})
    rows = service.store.entries(cid)
    assert len(rows) == len(chat)  # nothing appended twice, no row removed
    assert rows[2].text == chat[2]["content"]
    assert [v["text"] for v in versions(service.store, cid, 2)] == [old]
    stale = next(i for i in service.store.items(cid) if i.id == target.id)
    prompt = service.up.chats()[-1]["messages"]
    seen = "\n".join(m["content"] for m in prompt)
    assert "lantern was BLUE all along" in seen and old not in seen
    # the worker re-summarized the stale chapter; the next turn swaps the revision in
    assert stale.stale or stale.status == "retired"
    chat.append({"role": "user", "content": "Thanks!"})
    chat.append({"role": "assistant", "content": send(chat)})
    active = service.store.items(cid, "active")
    assert not any(i.stale for i in active)
    revised = next(i for i in active if i.span == target.span)
    assert revised.replaces == (target.id,)
    assert coverage_gaps(active, service.store.conversation(cid).raw_start) == []

    # 2. a swipe: the client asks again without the last reply
    before = service.store.conversation(cid).next_seq
    swiped = send(chat[:-1])
    assert service.store.conversation(cid).next_seq == before  # the reply took the old seq
    last = service.store.entries(cid)[-1]
    assert last.text == swiped != chat[-1]["content"]
    [v] = versions(service.store, cid, last.seq)
    assert v["text"] == chat[-1]["content"] and v["change"] == "regenerate"
    # the upstream answered the same user message, without the old reply in the prompt
    prompt = service.up.chats()[-1]["messages"]
    assert prompt[-1]["content"].endswith("Thanks!")
    assert chat[-1]["content"] not in "\n".join(m["content"] for m in prompt)
    chat[-1] = {"role": "assistant", "content": swiped}

    # 3. the next turn with the swiped reply in the window changes nothing else
    chat.append({"role": "user", "content": "One more cup, please."})
    chat.append({"role": "assistant", "content": send(chat)})
    assert service.texts(cid) == [m["content"] for m in chat]

    # the REST API shows the edit
    with service.http() as h:
        page = h.get(f"/v1/conversations/{cid}/messages", params={"limit": 5}).json()
        assert [m["edited"] for m in page["data"]][2] is True
        vs = h.get(f"/v1/conversations/{cid}/messages/2/versions").json()["data"]
        assert vs[0]["text"] == old


def test_deleting_a_message_in_the_raw_window(service: Harness) -> None:
    c = service.openai()
    chat: list[dict[str, str]] = []
    for text in ("hello", "I hate tea, by the way", "what's new?"):
        chat.append({"role": "user", "content": text})
        r = c.chat.completions.create(model="m", messages=chat, extra_headers=conv_header("del-1"))
        chat.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    # the user deletes their tea confession (#2) and the reply to it (#3), then goes on
    window = [*chat[:2], *chat[4:], {"role": "user", "content": "any news?"}]
    c.chat.completions.create(model="m", messages=window, extra_headers=conv_header("del-1"))
    seen = "\n".join(m["content"] for m in service.up.chats()[-1]["messages"])
    assert "hate tea" not in seen and "what's new?" in seen
    with service.http() as h:
        rows = h.get("/v1/conversations/del-1/messages").json()["data"]
    assert [r["seq"] for r in rows if r["deleted"]] == [2, 3]
    assert [v["text"] for v in versions(service.store, "del-1", 2)] == ["I hate tea, by the way"]
    service.idle()
    # the next request, without the deleted pair, changes nothing more
    window.append({"role": "assistant", "content": "(reply to: any news?)"})
    window.append({"role": "user", "content": "bye"})
    c.chat.completions.create(model="m", messages=window, extra_headers=conv_header("del-1"))
    service.idle()
    live = [e.text for e in service.store.entries("del-1") if not e.message.is_empty()]
    assert live == [m["content"] for m in window] + ["(reply to: bye)"]


# concurrency, disconnects, failures --------------------------------------------------------------


def test_fifty_concurrent_turns_on_one_conversation(service: Harness) -> None:
    """They take turns (one at a time per conversation), so the last waits for 49 others."""
    service.up.delay_s = 0.05
    c = service.openai(timeout=60)
    texts = [f"concurrent {i}" for i in range(50)]
    gate = service.svc.gate
    wait, gate.wait_s = gate.wait_s, 60.0
    try:
        with ThreadPoolExecutor(max_workers=50) as pool:
            replies = list(pool.map(lambda t: user_turn(c, "many-1", t), texts))
    finally:
        gate.wait_s = wait
    assert all(r.choices[0].finish_reason == "stop" for r in replies)
    service.idle()
    rows = service.store.entries("many-1")
    assert [e.seq for e in rows] == list(range(100))
    users = [e.text for e in rows if e.role == "user"]
    assert sorted(users) == sorted(texts)  # each once
    replies_stored = [e.text for e in rows if e.role == "assistant"]
    assert sorted(replies_stored) == sorted(r.choices[0].message.content for r in replies)


def test_client_disconnect_keeps_the_user_message(service: Harness) -> None:
    service.up.delay_s = 1.0
    with (
        service.http(timeout=0.3) as h,
        pytest.raises(httpx.ReadTimeout),
    ):
        h.post(
            "/v1/chat/completions",
            headers=conv_header("gone-1"),
            json={"messages": [{"role": "user", "content": "are you there?"}]},
        )
    assert [e.text for e in service.store.entries("gone-1")][0] == "are you there?"


def test_streaming_client_that_hangs_up_keeps_the_user_message(service: Harness) -> None:
    service.up.chunk_delay_s = 0.2
    service.up.reply = lambda body: "a long story " * 20
    with (
        service.http() as h,
        h.stream(
            "POST",
            "/v1/chat/completions",
            headers=conv_header("gone-2"),
            json={"stream": True, "messages": [{"role": "user", "content": "tell me a story"}]},
        ) as r,
    ):
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        log = service.store.log_entries("gone-2")
        if any(e["event"] == "stream" for e in log):
            break
        time.sleep(0.05)
    assert [e.text for e in service.store.entries("gone-2")] == ["tell me a story"]
    assert any(e["event"] == "stream" and e["outcome"] == "interrupted" for e in log)


def test_upstream_errors_are_clear_json_and_keep_the_message(service: Harness) -> None:
    c = service.openai()
    service.up.fail = lambda body: 500
    with pytest.raises(openai.APIStatusError) as e:
        user_turn(c, "fail-1", "hello?")
    assert e.value.status_code == 502
    assert "failed with 500" in e.value.body["message"]  # type: ignore[index]
    service.up.fail = lambda body: 400
    with pytest.raises(openai.BadRequestError) as e2:
        user_turn(c, "fail-1", "hello?")
    assert "refused the request" in e2.value.body["message"]  # type: ignore[index]
    service.up.fail = None
    r = user_turn(c, "fail-1", "hello?")  # the retry is not stored twice
    assert r.choices[0].message.content == "(reply to: hello?)"
    assert service.texts("fail-1") == ["hello?", "(reply to: hello?)"]
    assert service.store.counters("fail-1")["upstream_errors"] == 2


def test_streaming_upstream_error_before_the_first_byte_is_an_http_error(service: Harness) -> None:
    service.up.fail = lambda body: 503
    with pytest.raises(openai.APIStatusError) as e:
        list(user_turn(service.openai(), "fail-2", "stream?", stream=True))
    assert e.value.status_code == 502


def test_upstream_slower_than_the_profile_answers_504(service: Harness) -> None:
    service.up.delay_s = 3.0  # the test profile's reply_timeout_s is 2 s
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        user_turn(service.openai(), "slow-1", "hurry")
    assert e.value.status_code == 504
    assert time.monotonic() - started < 3.0
    message = e.value.body["message"]  # type: ignore[index]
    assert "--reply-timeout" in message and "KIOKU_REPLY_TIMEOUT" in message
    assert service.texts("slow-1") == ["hurry"]


def test_unreachable_upstream_answers_502(harness: Harness) -> None:
    from kioku.service.upstream import Upstream

    svc = harness.svc
    real = svc.upstream
    svc.upstream = Upstream("http://127.0.0.1:9/v1", svc.profile)
    try:
        with pytest.raises(openai.APIStatusError) as e:
            user_turn(harness.openai(), "down-1", "anyone?")
        assert e.value.status_code == 502
        assert "cannot reach the upstream" in e.value.body["message"]  # type: ignore[index]
    finally:
        svc.upstream = real
    assert harness.texts("down-1") == ["anyone?"]


def test_models_come_from_the_upstream(service: Harness) -> None:
    assert [m.id for m in service.openai().models.list()] == ["fake-model"]


def test_requests_kioku_cannot_serve_say_why(service: Harness) -> None:
    with service.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "X-Kioku-Conversation" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", headers=conv_header("bad-1"), json={"messages": []})
        assert r.status_code == 400
        r = h.post(
            "/v1/chat/completions",
            headers=conv_header("bad-1"),
            json={"messages": [{"role": "wizard", "content": "x"}]},
        )
        assert r.status_code == 400 and "unknown role" in r.json()["error"]["message"]
        h.post(
            "/v1/chat/completions",
            headers=conv_header("bad-2"),
            json={"messages": [{"role": "user", "content": "one"}]},
        )
        other = [
            {"role": "user", "content": "a different chat"},
            {"role": "assistant", "content": "entirely"},
            {"role": "user", "content": "yes"},
        ]
        r = h.post("/v1/chat/completions", headers=conv_header("bad-2"), json={"messages": other})
        assert r.status_code == 409
    assert service.texts("bad-2") == ["one", "(reply to: one)"]


def test_metrics_count_turns_and_prefix_reuse(service: Harness) -> None:
    c = service.openai()
    for i in range(3):
        user_turn(c, "met-1", f"metrics {i}")
    service.idle()
    with service.http() as h:
        text = h.get("/metrics").text
    assert 'kioku_turns_total{tenant="acme"}' in text
    assert "kioku_prefix_reuse_ratio_count" in text
    assert "kioku_upstream_latency_seconds_bucket" in text
    for name in ("folds", "major_gcs", "forced_cuts", "refusal"):
        assert f"kioku_{name}_total" in text
    assert "kioku_queue_depth" in text and "kioku_summary_duration_seconds" in text


def test_concurrent_conversations_do_not_mix(service: Harness) -> None:
    c = service.openai()
    errors: list[BaseException] = []

    def talk(n: int) -> None:
        try:
            for t in range(3):
                user_turn(c, f"mix-{n}", f"conv {n} turn {t}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for n in range(8):
        assert service.texts(f"mix-{n}") == [
            x for t in range(3) for x in (f"conv {n} turn {t}", f"(reply to: conv {n} turn {t})")
        ]


def test_slow_streaming_upstream_gets_keepalives_then_the_reply(service: Harness) -> None:
    service.svc.keepalive_s = 0.2
    service.up.delay_s = 0.7
    try:
        with (
            service.http() as h,
            h.stream(
                "POST",
                "/v1/chat/completions",
                headers=conv_header("ka-1"),
                json={"stream": True, "messages": [{"role": "user", "content": "take your time"}]},
            ) as r,
        ):
            assert r.status_code == 200
            lines = list(r.iter_lines())
        assert lines[0].startswith(":")  # a comment: the openai SDK and browsers skip it
        assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
        # the SDK reads it as an ordinary stream
        stream = user_turn(service.openai(), "ka-1", "again, slowly", stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert text == "(reply to: again, slowly)"
    finally:
        service.svc.keepalive_s = 10.0


def test_upstream_failing_after_keepalives_ends_the_stream_with_an_error(service: Harness) -> None:
    service.svc.keepalive_s = 0.2
    service.up.delay_s = 0.7
    service.up.fail = lambda body: 500
    try:
        with pytest.raises(openai.APIError, match="failed with 500"):
            list(user_turn(service.openai(), "ka-2", "will it work?", stream=True))
    finally:
        service.svc.keepalive_s = 10.0
    assert service.texts("ka-2") == ["will it work?"]
    assert service.store.counters("ka-2")["upstream_errors"] == 1


def test_conversation_ids_and_names_in_any_script(service: Harness) -> None:
    c = service.openai()
    r = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "こんにちは"}], user="ミカとの会話"
    )
    assert (
        r.headers["x-kioku-conversation"]
        == "%E3%83%9F%E3%82%AB%E3%81%A8%E3%81%AE%E4%BC%9A%E8%A9%B1"
    )
    with service.http() as h:
        r2 = h.post(
            "/v1/chat/completions",
            headers={
                "X-Kioku-Conversation": "ミカとの会話".encode(),
                "X-Kioku-Character": "ミカ".encode(),
            },
            json={"messages": [{"role": "user", "content": "また来たよ"}]},
        )
        assert r2.status_code == 200
        assert [c["id"] for c in h.get("/v1/conversations").json()["data"]].count(
            "ミカとの会話"
        ) == 1
        r3 = h.get("/v1/conversations/ミカとの会話/messages")
        assert [m["text"] for m in r3.json()["data"]][:1] == ["こんにちは"]


def test_request_fields_kioku_does_not_use_reach_the_upstream(service: Harness) -> None:
    user_turn(
        service.openai(),
        "fields-1",
        "hi",
        temperature=0.3,
        stop=["###"],
        max_tokens=100_000,
        extra_body={"top_k": 5, "cache_prompt": True},
    )
    sent = service.up.chats()[-1]
    assert sent["temperature"] == 0.3 and sent["stop"] == ["###"]
    assert sent["top_k"] == 5 and sent["cache_prompt"] is True
    assert sent["max_tokens"] == 256  # capped at the profile's response reserve
    assert "user" not in sent and "stream" not in sent


def test_a_streamed_request_answered_with_something_else_is_refused_before_relaying(
    service: Harness,
) -> None:
    junk = b'{"choices": [{"message": {"content": "not a stream"}}]}'
    service.up.raw = lambda body: (200, "application/json", junk) if body.get("stream") else None
    try:
        with service.http() as h:
            r = h.post(
                "/v1/chat/completions",
                headers=conv_header("junk-1"),
                json={"stream": True, "messages": [{"role": "user", "content": "stream?"}]},
            )
        assert r.status_code == 502
        assert "instead of an event stream" in r.json()["error"]["message"]
        assert set(r.json()) == {"error"} and "data:" not in r.text  # nothing was relayed
        # SSE under a wrong content type is still a stream
        sse = b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}}]}\n\n'
        sse += b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        sse += b"data: [DONE]\n\n"
        service.up.raw = lambda body: (200, "text/plain", sse)
        text = "".join(
            ch.choices[0].delta.content or ""
            for ch in user_turn(service.openai(), "junk-1", "stream?", stream=True)
            if ch.choices
        )
        assert text == "ok"
    finally:
        service.up.raw = None
    assert service.texts("junk-1") == ["stream?", "ok"]


def test_upstream_failures_are_logged_with_their_cause(
    service: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    from kioku.service.upstream import Upstream

    svc = service.svc
    real = svc.upstream
    svc.upstream = Upstream("http://127.0.0.1:9/v1", svc.profile)
    try:
        with caplog.at_level(logging.WARNING, logger="kioku.service"):
            with pytest.raises(openai.APIStatusError):
                user_turn(service.openai(), "cause-1", "anyone?")
            service.up.fail = lambda body: 503
            svc.upstream = real
            with pytest.raises(openai.APIStatusError):
                user_turn(service.openai(), "cause-1", "anyone?")
    finally:
        svc.upstream = real
    lines = [r.getMessage() for r in caplog.records if r.name == "kioku.service"]
    assert any("cause-1" in m and "ConnectError" in m for m in lines), lines
    assert any("cause-1" in m and "failed with 503" in m for m in lines), lines
