"""The whole chat-completions protocol through `kioku serve`, with the real openai SDK: tool-call
round trips (stateful and stateless, streamed and not), images, n=2.

The fake upstream records every request. Each test makes the same calls once straight to the
upstream (a direct call, as the client would without kioku) and once through kioku, and asserts
that what reached the upstream is exactly what the direct call sent, plus kioku's memory."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from sqlalchemy import select

from kioku.alternation import alternate
from kioku.client import server_message
from kioku.config import Settings
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.service.app import create_app
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, ServerThread, default_reply
from kioku.store import Store
from kioku.store import schema as s
from tests.llama import llama_server
from tests.test_service_support import SERVICE_PROFILE, Harness, words

if TYPE_CHECKING:
    from tests.llama import LlamaServer

__all__ = ["llama_server"]  # the fixture, for the real-server test

IMAGE_TOKENS = 120
PROFILE = replace(SERVICE_PROFILE, name="protocol-test", image_tokens=IMAGE_TOKENS)
CARD = "You are Mika, a cheerful cat who runs a tea shop."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city today.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8).decode()
IMAGE = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}


def make_kioku(tenant: str, store: Store) -> Kioku:
    return Kioku(store, profile=PROFILE, tenant=tenant, layers=Layers(store))


@pytest.fixture(scope="module")
def proto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('protocol')) / 'kioku.db'}"
    store = Store.open(db)
    with FakeUpstream() as up:
        app = create_app(
            Settings(db=db, llm_url=up.url),
            store=store,
            make_kioku=make_kioku,
            worker=False,
            profile=PROFILE,
        )
        with ServerThread(app) as server:
            yield Harness(server.url, up, store, app.state.service)


@pytest.fixture
def svc(proto: Harness) -> Iterator[Harness]:
    yield proto
    proto.idle()
    proto.up.reply = default_reply


# the scripted upstream ------------------------------------------------------------------------


def call(i: int, city: str) -> dict[str, Any]:
    args = json.dumps({"city": city})  # as json.dumps writes it (LangChain re-serializes so)
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
    }


def completion(*messages: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [
            {"index": i, "message": {"role": "assistant", **m}, "finish_reason": finish}
            for i, m in enumerate(messages)
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    }


def weather_agent(*cities: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Asks for the weather of `cities` when the last message is the user's; answers from the
    tool results when they are in."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "tool":
            results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
            return completion({"content": "Mika says: " + "; ".join(results)})
        calls = [call(i, c) for i, c in enumerate(cities)]
        return completion({"content": None, "tool_calls": calls}, finish="tool_calls")

    return reply


def direct(svc: Harness) -> openai.OpenAI:
    """The client as it would be without kioku: straight to the upstream."""
    return openai.OpenAI(base_url=svc.up.url, api_key="sk-upstream", max_retries=0)


def kioku(svc: Harness, cid: str, **headers: str) -> openai.OpenAI:
    return svc.openai(default_headers={"X-Kioku-Conversation": cid, **headers})


def last_sent(svc: Harness) -> dict[str, Any]:
    return svc.up.chats()[-1]


def same_request(through_kioku: dict[str, Any], straight: dict[str, Any]) -> None:
    """What kioku sent is what the client sent straight, except kioku's cap on max_tokens and
    roles made to alternate (`kioku.alternation`: the identity on a list that alternates)."""
    assert through_kioku.pop("max_tokens") <= PROFILE.response_reserve
    expected = {k: v for k, v in straight.items() if k != "max_tokens"}
    expected["messages"] = alternate(straight["messages"])
    assert through_kioku == expected


def first_turn() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": CARD},
        {"role": "user", "content": "Is it raining in Tokyo?"},
    ]


def tool_message(msg: Any, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": content}


# tool calls -------------------------------------------------------------------------------------


def test_tool_round_trip_stateless(svc: Harness) -> None:
    svc.up.reply = weather_agent("Tokyo")
    results: dict[str, list[dict[str, Any]]] = {}
    for name, c in (("direct", direct(svc)), ("kioku", kioku(svc, "tool-sl"))):
        messages: list[Any] = first_turn()
        r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert r.choices[0].finish_reason == "tool_calls"
        msg = r.choices[0].message
        assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
        first = last_sent(svc)
        messages += [msg, tool_message(msg, "sunny, 25C")]
        r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert r.choices[0].message.content == "Mika says: sunny, 25C"
        results[name] = [first, last_sent(svc)]
    for through, straight in zip(results["kioku"], results["direct"], strict=True):
        same_request(through, straight)
    # the assistant's call and the tool's answer are in the log, as the protocol has them
    svc.idle()
    rows = svc.store.entries("tool-sl")
    assert [e.role for e in rows] == ["user", "assistant", "tool", "assistant"]
    assert [p.kind for p in rows[1].message.parts] == ["tool_call"]
    assert rows[2].message.parts[0].ref == "call_0" and rows[2].text == "sunny, 25C"
    with svc.http() as h:
        shown = h.get("/v1/conversations/tool-sl/messages").json()["data"]
    assert shown[1]["parts"] == [
        {"kind": "tool_call", "text": '{"city": "Tokyo"}', "speaker": None, "ref": "call_0",
         "name": "get_weather"}
    ]  # fmt: skip


def test_tool_round_trip_stateful_sends_only_the_tool_result(svc: Harness) -> None:
    svc.up.reply = weather_agent("Tokyo")
    c = kioku(svc, "tool-sf")
    r = c.chat.completions.create(model="m", messages=first_turn(), tools=TOOLS)
    msg = r.choices[0].message
    # a stateful client sends only what is new: the tool's result
    c.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": CARD}, tool_message(msg, "rain, 18C")],
        tools=TOOLS,
    )
    # the upstream gets the whole exchange, exactly as a stateless direct call would send it
    straight = [*first_turn(), msg, tool_message(msg, "rain, 18C")]
    direct(svc).chat.completions.create(model="m", messages=straight, tools=TOOLS)
    want = last_sent(svc)
    got = svc.up.chats()[-2]
    same_request(got, want)


@pytest.mark.parametrize("stateful", [True, False])
def test_streamed_tool_round_trip(svc: Harness, stateful: bool) -> None:
    svc.up.reply = weather_agent("Tokyo", "Osaka")  # two calls at once
    cid = f"tool-stream-{stateful}"
    c = kioku(svc, cid)
    with c.chat.completions.stream(model="m", messages=first_turn(), tools=TOOLS) as stream:
        msg = stream.get_final_completion().choices[0].message
    assert [t.function.arguments for t in msg.tool_calls or ()] == [
        '{"city": "Tokyo"}',
        '{"city": "Osaka"}',
    ]
    calls = msg.tool_calls or []
    results = [
        {"role": "tool", "tool_call_id": calls[0].id, "content": "rain"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "sun"},
    ]
    history: list[Any] = [{"role": "system", "content": CARD}]
    history += results if stateful else [*first_turn()[1:], msg, *results]
    stream2 = c.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream2 if ch.choices)
    assert text == "Mika says: rain; sun"
    sent = last_sent(svc)["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert sent[2]["tool_calls"] == [call(0, "Tokyo"), call(1, "Osaka")]
    assert sent[2]["content"] is None
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("call_0", "rain"),
        ("call_1", "sun"),
    ]
    svc.idle()
    roles = [e.role for e in svc.store.entries(cid)]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]  # each stored once


def test_a_retried_tool_result_is_not_stored_twice(svc: Harness) -> None:
    svc.up.reply = weather_agent("Tokyo")
    c = kioku(svc, "tool-retry")
    msg = (
        c.chat.completions.create(model="m", messages=first_turn(), tools=TOOLS).choices[0].message
    )
    svc.up.fail = lambda body: 500
    with pytest.raises(openai.APIStatusError):
        c.chat.completions.create(model="m", messages=[tool_message(msg, "fog")], tools=TOOLS)
    svc.up.fail = None
    c.chat.completions.create(model="m", messages=[tool_message(msg, "fog")], tools=TOOLS)
    svc.idle()
    assert [e.role for e in svc.store.entries("tool-retry")] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "sunny"}, "messages.1.tool_call_id"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            "messages.1.tool_calls",
        ),
        ({"role": "user", "content": [{"text": "no type"}]}, "messages.1"),
    ],
)
def test_malformed_protocol_messages_are_refused_clearly(
    svc: Harness, message: dict[str, Any], param: str
) -> None:
    with svc.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": "bad-proto"},
            json={"messages": [{"role": "user", "content": "hi"}, message]},
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    with pytest.raises(Exception, match="no conversation"):
        svc.store.conversation("bad-proto")


# images -----------------------------------------------------------------------------------------


def test_an_image_goes_upstream_as_sent_while_raw_and_is_remembered_once_folded(
    svc: Harness,
) -> None:
    c = kioku(svc, "img-1")
    shown = [
        {"role": "system", "content": CARD},
        {
            "role": "user",
            "content": [{"type": "text", "text": "The harbour at dusk, from my window."}, IMAGE],
        },
    ]
    c.chat.completions.create(model="m", messages=shown)
    direct(svc).chat.completions.create(model="m", messages=shown)
    same_request(svc.up.chats()[-2], last_sent(svc))

    # stored by content hash: the row read every turn holds the hash, the blob the data
    svc.idle()
    entry = svc.store.entries("img-1")[0]
    [image] = [p for p in entry.message.parts if p.kind == "image"]
    assert PIXEL not in entry.message.parts_json() and PIXEL not in entry.text
    blob = json.loads(svc.store.blobs([image.ref or ""])[image.ref or ""])
    assert blob == IMAGE
    # the budget counts the image at the profile's cost, not as zero
    assert entry.tokens >= IMAGE_TOKENS

    # every turn while the message is raw sends the image again; after the fold, the chapter
    # says it was shared, with its caption
    seen_while_raw = 0
    for i in range(40):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": words(i)}])
        svc.idle()
        svc.run_jobs()
        sent = json.dumps(last_sent(svc)["messages"])
        if svc.store.conversation("img-1").raw_start > 0:
            break
        assert PIXEL in sent
        seen_while_raw += 1
    assert seen_while_raw >= 1
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "and now?"}])
    assert PIXEL not in json.dumps(last_sent(svc)["messages"])
    memory = "\n".join(i.text for i in svc.store.items("img-1", "active"))
    assert "shared an image: The harbour at dusk, from my window." in memory


def test_an_image_sent_twice_is_stored_once(svc: Harness) -> None:
    c = kioku(svc, "img-2", **{"X-Kioku-Mode": "stateful"})
    for text in ("first look", "second look"):
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "text", "text": text}, IMAGE]}],
        )
    with svc.store.engine.connect() as conn:
        refs = [r.sha256 for r in conn.execute(select(s.blobs.c.sha256))]
    assert len(refs) == len(set(refs))
    entries = svc.store.entries("img-2")
    assert entries[0].message.parts[1].ref == entries[2].message.parts[1].ref


def test_a_refused_request_keeps_no_image(svc: Harness) -> None:
    c = kioku(svc, "img-3")
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    other = {**IMAGE, "image_url": {"url": "data:image/png;base64,b3RoZXI="}}
    with pytest.raises(openai.ConflictError):  # another chat under the same id
        c.chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "a different chat"}, other]},
                {"role": "assistant", "content": "entirely"},
                {"role": "user", "content": "yes"},
            ],
        )
    with svc.store.engine.connect() as conn:
        stored = [r.data for r in conn.execute(select(s.blobs.c.data))]
    assert not any(b"b3RoZXI=" in d for d in stored)


# n > 1 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_n_2_stores_choice_0_and_offers_the_other(svc: Harness, stream: bool) -> None:
    svc.up.reply = lambda body: completion({"content": "Choice A."}, {"content": "Choice B."})
    cid = f"n2-{stream}"
    c = kioku(svc, cid)
    chat = [{"role": "user", "content": "Pick one."}]
    if stream:
        chunks = list(c.chat.completions.create(model="m", messages=chat, n=2, stream=True))
        texts = ["".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices
                         and ch.choices[0].index == i) for i in (0, 1)]  # fmt: skip
    else:
        r = c.chat.completions.create(model="m", messages=chat, n=2)
        texts = [ch.message.content or "" for ch in r.choices]
    assert texts == ["Choice A.", "Choice B."]  # the client gets both
    assert last_sent(svc)["n"] == 2
    assert svc.texts(cid) == ["Pick one.", "Choice A."]
    with svc.http() as h:
        offered = h.get(f"/v1/conversations/{cid}/messages/1/choices").json()["data"]
    assert [(x["choice"], x["text"]) for x in offered] == [(1, "Choice B.")]
    # the client shows choice B and goes on: B becomes the stored reply (an edit)
    svc.up.reply = default_reply
    chat += [{"role": "assistant", "content": "Choice B."}, {"role": "user", "content": "B!"}]
    c.chat.completions.create(model="m", messages=chat)
    assert svc.texts(cid)[:3] == ["Pick one.", "Choice B.", "B!"]


# a real llama.cpp server ------------------------------------------------------------------------


@pytest.mark.llama
@pytest.mark.parametrize("content", [None, ""], ids=["content-null", "content-empty"])
def test_a_real_llama_server_gets_the_tool_transcript_the_client_wrote(
    llama_server: LlamaServer, tmp_path: Path, content: str | None
) -> None:
    """llama.cpp accepts the transcript or refuses it; either way the client through kioku gets
    what a direct call got: the same reply (greedy decoding, so the prompt was the same), or
    the server's own error message."""
    transcript = [
        {"role": "system", "content": CARD},
        {"role": "user", "content": "Is it raining in Tokyo?"},
        {"role": "assistant", "content": content, "tool_calls": [call(0, "Tokyo")]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 25C"},
    ]
    body = {"model": llama_server.alias, "messages": transcript, "tools": TOOLS,
            "max_tokens": 8, "temperature": 0, "seed": 1}  # fmt: skip
    straight = httpx.post(f"{llama_server.url}/v1/chat/completions", json=body, timeout=120)
    store = Store.open(f"sqlite:///{tmp_path / 'kioku.db'}")
    app = create_app(
        Settings(db=str(store.engine.url), llm_url=f"{llama_server.url}/v1"),
        store=store,
        make_kioku=make_kioku,
        worker=False,
        profile=replace(PROFILE, reply_timeout_s=120.0),  # a real model on 2 cores
    )
    with ServerThread(app) as server:
        through = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=body,
            headers={
                "Authorization": f"Bearer {create_key(store, 'acme')[1]}",
                "X-Kioku-Conversation": "llama-tools",
            },
            timeout=120,
        )
    if straight.status_code == 200:
        assert through.status_code == 200, through.text
        got, want = through.json()["choices"][0], straight.json()["choices"][0]
        assert got["message"] == want["message"]
        assert through.json()["usage"]["prompt_tokens"] == straight.json()["usage"]["prompt_tokens"]
    else:
        # the server's own refusal, whole, inside kioku's error object (5xx: status 502)
        assert through.status_code in (straight.status_code, 502)
        assert server_message(straight, 100_000) in through.json()["error"]["message"]
