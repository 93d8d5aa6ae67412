"""The OpenAI-compatible client: mocked transport for the protocol, a real llama.cpp for the rest."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kioku.client import (
    AsyncOpenAIChatModel,
    OpenAIChatModel,
    Timeouts,
    api_root,
)
from kioku.errors import ConfigError, ModelError, ModelTimeout, ModelUnavailable
from kioku.models import ChatMessage, ChatRequest, Completion, ToolCall, Usage
from kioku.profiles import LOCAL_64K

if TYPE_CHECKING:
    from tests.llama import LlamaServer
# the llama_server / fresh_llama_server fixtures
pytest_plugins = ["tests.llama"]

REQ = ChatRequest(messages=(ChatMessage("user", "hello"),), max_tokens=16, purpose="reply")


def ok_payload(text: str = "hi there", finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


class Recorder:
    """A MockTransport handler answering from a list, recording each request."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        if callable(a):
            return a(request)  # type: ignore[no-any-return]
        return a  # type: ignore[no-any-return]

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) if r.content else None for r in self.requests]


def client(handler: Recorder, **kw: Any) -> tuple[OpenAIChatModel, list[float]]:
    slept: list[float] = []
    m = OpenAIChatModel(
        "http://model.test:8080",
        model="m1",
        transport=httpx.MockTransport(handler),
        sleep=slept.append,
        **kw,
    )
    return m, slept


# --- protocol, mocked ---------------------------------------------------------------------------


def test_api_root_adds_v1_only_to_bare_hosts() -> None:
    assert api_root("http://h:1") == "http://h:1/v1"
    assert api_root("http://h:1/v1/") == "http://h:1/v1"
    assert api_root("https://openrouter.ai/api/v1") == "https://openrouter.ai/api/v1"
    with pytest.raises(ConfigError):
        api_root("h:1")


def test_complete_reads_text_finish_reason_usage_and_sends_the_request() -> None:
    rec = Recorder(httpx.Response(200, json=ok_payload()))
    m, _ = client(rec, api_key="sk-test")
    c = m.complete(
        ChatRequest(
            messages=(ChatMessage("system", "s"), ChatMessage("user", "u")),
            max_tokens=7,
            temperature=0.2,
            stop=("END",),
        )
    )
    assert (c.text, c.finish_reason, c.model) == ("hi there", "stop", "m1")
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (12, 3)
    r = rec.requests[0]
    assert str(r.url) == "http://model.test:8080/v1/chat/completions"
    assert r.headers["authorization"] == "Bearer sk-test"
    assert rec.bodies()[0] == {
        "model": "m1",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "max_tokens": 7,
        "temperature": 0.2,
        "stop": ["END"],
    }


def test_length_finish_is_reported_not_hidden() -> None:
    m, _ = client(Recorder(httpx.Response(200, json=ok_payload("cut mid", "length"))))
    c = m.complete(REQ)
    assert c.finish_reason == "length" and c.truncated


def test_5xx_and_connection_errors_are_retried_with_backoff() -> None:
    rec = Recorder(
        httpx.Response(503, json={"error": {"message": "loading model"}}),
        httpx.ConnectError("refused"),
        httpx.Response(200, json=ok_payload()),
    )
    m, slept = client(rec)
    assert m.complete(REQ).text == "hi there"
    assert len(rec.requests) == 3
    assert slept == [0.5, 1.0]


def test_unreachable_server_raises_model_unavailable_after_retries() -> None:
    rec = Recorder(*[httpx.ConnectError("refused")] * 3)
    m, slept = client(rec, retries=2)
    with pytest.raises(ModelUnavailable, match="after 3 tries"):
        m.complete(REQ)
    assert len(rec.requests) == 3 and len(slept) == 2


def test_persistent_5xx_raises_model_unavailable_with_server_message() -> None:
    rec = Recorder(*[httpx.Response(500, json={"error": {"message": "CUDA out of memory"}})] * 3)
    m, _ = client(rec)
    with pytest.raises(ModelUnavailable, match="CUDA out of memory"):
        m.complete(REQ)


def test_4xx_is_not_retried_and_carries_the_server_message() -> None:
    body = {"error": {"message": "Requested tokens (5000) exceed context window of 4096"}}
    rec = Recorder(httpx.Response(400, json=body))
    m, slept = client(rec)
    with pytest.raises(ModelError, match="exceed context window") as info:
        m.complete(REQ)
    assert not isinstance(info.value, ModelUnavailable)
    assert len(rec.requests) == 1 and slept == []


def test_server_messages_in_other_dialects() -> None:
    for body, want in (
        ({"object": "error", "message": "vllm says no"}, "vllm says no"),
        ({"detail": "fastapi says no"}, "fastapi says no"),
        ({"error": "plain"}, "plain"),
    ):
        m, _ = client(Recorder(httpx.Response(422, json=body)))
        with pytest.raises(ModelError, match=want):
            m.complete(REQ)


def test_read_timeout_raises_model_timeout_without_resending() -> None:
    rec = Recorder(httpx.ReadTimeout("slow"))
    m, slept = client(rec)
    with pytest.raises(ModelTimeout):
        m.complete(REQ)
    assert len(rec.requests) == 1 and slept == []


def test_timeouts_follow_the_purpose_and_profile() -> None:
    t = Timeouts.from_profile(LOCAL_64K)
    assert t.for_purpose("reply").read == LOCAL_64K.reply_timeout_s
    assert t.for_purpose("chapter").read == LOCAL_64K.summary_timeout_s
    assert t.for_purpose("chapter").connect == LOCAL_64K.connect_timeout_s
    seen: list[dict[str, Any]] = []

    def grab(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json=ok_payload())

    m, _ = client(Recorder(grab, grab), profile=LOCAL_64K)
    m.complete(REQ)
    m.complete(ChatRequest(messages=REQ.messages, purpose="synopsis"))
    assert seen[0]["read"] == LOCAL_64K.reply_timeout_s
    assert seen[1]["read"] == LOCAL_64K.summary_timeout_s


def test_answer_without_choices_is_an_error_not_an_empty_reply() -> None:
    m, _ = client(Recorder(httpx.Response(200, json={"object": "chat.completion"})))
    with pytest.raises(ModelError, match="choices"):
        m.complete(REQ)


def sse(*chunks: Any, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def delta(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    d = {"content": text} if text is not None else {}
    return {"model": "m1", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def test_stream_yields_deltas_then_reports_the_ending() -> None:
    body = sse(delta("Hel"), delta("lo"), delta(finish="length"))
    rec = Recorder(httpx.Response(200, content=body, headers={"content-type": "text/event-stream"}))
    m, _ = client(rec)
    s = m.stream(REQ)
    assert list(s) == ["Hel", "lo"]
    assert s.finish_reason == "length"
    assert s.completion().text == "Hello" and s.completion().truncated
    assert rec.bodies()[0]["stream"] is True


def test_stream_cut_off_without_finish_reason_raises() -> None:
    body = sse(delta("Hel"), delta("lo"), done=False)
    m, _ = client(Recorder(httpx.Response(200, content=body)))
    s = m.stream(REQ)
    got: list[str] = []
    with pytest.raises(ModelUnavailable, match="without a finish_reason"):
        for d in s:
            got.append(d)
    assert got == ["Hel", "lo"]
    with pytest.raises(ModelError):
        s.completion()


def test_stream_retries_before_the_first_byte() -> None:
    rec = Recorder(httpx.Response(503), httpx.Response(200, content=sse(delta("x", "stop"))))
    m, slept = client(rec)
    assert list(m.stream(REQ)) == ["x"]
    assert len(slept) == 1


@pytest.mark.parametrize(
    ("answers", "want_path"),
    [
        # llama.cpp server
        ([lambda r: httpx.Response(200, json={"tokens": [1, 2, 3]})], "/tokenize"),
        # vLLM: wants "prompt", rejects "content"
        (
            [
                httpx.Response(422, json={"detail": "prompt: field required"}),
                lambda r: httpx.Response(200, json={"tokens": [5, 6], "count": 2}),
            ],
            "/tokenize",
        ),
        # llama-cpp-python: only /extras/tokenize
        (
            [
                httpx.Response(404, json={"detail": "Not Found"}),
                httpx.Response(404, json={"detail": "Not Found"}),
                lambda r: httpx.Response(200, json={"tokens": [2, 9]}),
            ],
            "/extras/tokenize",
        ),
    ],
)
def test_tokenize_finds_the_servers_endpoint(answers: list[Any], want_path: str) -> None:
    rec = Recorder(*answers, *answers[-1:])
    m, _ = client(rec)
    first = m.tokenize("hello")
    assert first and all(isinstance(t, int) for t in first)
    assert rec.requests[-1].url.path == want_path
    n = len(rec.requests)
    assert m.tokenize("again") == first  # the endpoint is remembered: one request
    assert len(rec.requests) == n + 1 and rec.requests[-1].url.path == want_path


def test_tokenize_returns_none_when_the_server_has_none() -> None:
    rec = Recorder(*[httpx.Response(404)] * 3)
    m, _ = client(rec)
    assert m.tokenize("x") is None
    assert m.tokenize("y") is None
    assert len(rec.requests) == 3


def test_models_lists_ids() -> None:
    rec = Recorder(httpx.Response(200, json={"data": [{"id": "gemma"}, {"id": "qwen"}]}))
    m, _ = client(rec)
    assert m.models() == ["gemma", "qwen"]
    assert rec.requests[0].url.path == "/v1/models"


TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
}


def tool_payload() -> dict[str, Any]:
    p = ok_payload(finish="tool_calls")
    p["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
    return p


def tool_deltas() -> bytes:
    def call(**kw: Any) -> dict[str, Any]:
        return {"model": "m1", "choices": [{"index": 0, "delta": {"tool_calls": [kw]}}]}

    return sse(
        call(index=0, id="call_1", type="function", function={"name": "get_weather"}),
        call(index=0, function={"arguments": '{"city": '}),
        call(index=0, function={"arguments": '"Tokyo"}'}),
        delta(finish="tool_calls"),
    )


def streamed(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def script() -> list[tuple[str, list[Any]]]:
    """One scripted server conversation: (call, the server's answers in order), made afresh
    for each client. Everything that can go wrong does: retries, refusals, dead servers,
    garbage, cut streams, error events."""
    return [
        ("complete", [httpx.Response(502), httpx.Response(200, json=ok_payload("same", "length"))]),
        ("complete", [httpx.Response(400, json={"error": {"message": "bad request"}})]),
        ("complete", [httpx.ConnectError("refused")] * 3),
        ("complete", [httpx.ReadTimeout("slow")]),
        ("complete", [httpx.Response(200, content=b"<html>proxy error</html>")]),
        ("complete", [httpx.Response(200, json={"object": "chat.completion"})]),
        ("complete", [httpx.Response(200, json=tool_payload())]),
        ("stream", [httpx.Response(503), streamed(sse(delta("Hel"), delta("lo", "stop")))]),
        ("stream", [streamed(sse(delta("Hel")) + b"data: {not json\n\n")]),
        ("stream", [streamed(sse(delta("Hel"), delta("lo"), done=False))]),
        ("stream", [streamed(sse(delta("Hel"), {"error": {"message": "CUDA out of memory"}}))]),
        ("stream", [streamed(tool_deltas())]),
        ("stream", [httpx.Response(400, json={"error": {"message": "no such model"}})]),
        ("stream", [httpx.ConnectError("refused")] * 3),
        ("models", [httpx.Response(200, json={"data": [{"id": "gemma"}, {"id": "qwen"}]})]),
        (
            "tokenize",
            [
                httpx.Response(404),
                httpx.Response(404),
                httpx.Response(200, json={"tokens": [2, 9]}),
            ],
        ),
        ("tokenize", [httpx.Response(200, json={"tokens": [2, 9]})]),
    ]


def run_sync(m: OpenAIChatModel, kind: str) -> tuple[Any, ...]:
    """What one call gave: its result, or the type and message of its error (and, for a
    stream, the deltas it yielded before)."""
    got: list[str] = []

    def call() -> Any:
        if kind == "stream":
            s = m.stream(REQ)
            for d in s:
                got.append(d)
            return s.completion()
        if kind == "models":
            return m.models()
        return getattr(m, kind)("hi" if kind == "tokenize" else REQ)

    try:
        result: tuple[Any, ...] = ("ok", call())
    except ModelError as e:
        result = ("error", type(e).__name__, str(e))
    return (*result, got) if kind == "stream" else result


async def run_async(m: AsyncOpenAIChatModel, kind: str) -> tuple[Any, ...]:
    """`run_sync`, line for line, with `await`."""
    got: list[str] = []

    async def call() -> Any:
        if kind == "stream":
            s = m.stream(REQ)
            async for d in s:
                got.append(d)
            return s.completion()
        if kind == "models":
            return await m.models()
        return await getattr(m, kind)("hi" if kind == "tokenize" else REQ)

    try:
        result: tuple[Any, ...] = ("ok", await call())
    except ModelError as e:
        result = ("error", type(e).__name__, str(e))
    return (*result, got) if kind == "stream" else result


def test_sync_and_async_clients_give_identical_results_and_errors() -> None:
    calls = [kind for kind, _ in script()]
    sync_rec = Recorder(*[a for _, answers in script() for a in answers])
    async_rec = Recorder(*[a for _, answers in script() for a in answers])
    m, sync_slept = client(sync_rec)
    a_slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        a_slept.append(s)

    am = AsyncOpenAIChatModel(
        "http://model.test:8080",
        model="m1",
        transport=httpx.MockTransport(async_rec),
        sleep=fake_sleep,
    )

    async def run_all() -> list[tuple[Any, ...]]:
        out = [await run_async(am, kind) for kind in calls]
        await am.aclose()
        return out

    sync_out = [run_sync(m, kind) for kind in calls]
    async_out = asyncio.run(run_all())
    for kind, s_out, a_out in zip(calls, sync_out, async_out, strict=True):
        assert s_out == a_out, kind
    assert a_slept == sync_slept == [0.5, 0.5, 1.0, 0.5, 0.5, 1.0]
    assert [(r.method, str(r.url)) for r in async_rec.requests] == [
        (r.method, str(r.url)) for r in sync_rec.requests
    ]
    assert async_rec.bodies() == sync_rec.bodies()
    assert not sync_rec.answers and not async_rec.answers  # every answer was asked for

    # and what they said is right, not only the same
    kinds = [o[:2] for o in sync_out]
    assert kinds[:7] == [
        ("ok", Completion("same", "length", Usage(12, 3), "m1")),
        ("error", "ModelError"),
        ("error", "ModelUnavailable"),
        ("error", "ModelTimeout"),
        ("error", "ModelError"),
        ("error", "ModelError"),
        ("ok", Completion("", "tool_calls", Usage(12, 3), "m1", (WEATHER,))),
    ]
    assert sync_out[7][:2] == ("ok", Completion("Hello", "stop", Usage(), "m1"))
    assert sync_out[8][1] == "ModelError" and "not JSON" in sync_out[8][2]
    assert sync_out[8][3] == ["Hel"]
    assert sync_out[9][1] == "ModelUnavailable" and "without a finish_reason" in sync_out[9][2]
    assert sync_out[10][1] == "ModelError" and "CUDA out of memory" in sync_out[10][2]
    assert sync_out[11][:2] == ("ok", Completion("", "tool_calls", Usage(), "m1", (WEATHER,)))
    assert sync_out[12][1] == "ModelError" and "no such model" in sync_out[12][2]
    assert sync_out[13][1] == "ModelUnavailable"
    assert sync_out[14:] == [("ok", ["gemma", "qwen"]), ("ok", [2, 9]), ("ok", [2, 9])]


WEATHER = ToolCall("call_1", "get_weather", '{"city": "Tokyo"}')


# --- a real llama.cpp server ---------------------------------------------------------------------

LONG = " ".join(
    f"Entry {i}: the lighthouse keeper wrote that the tide rose {i % 7} feet and the wind came from the "
    f"{['north', 'south', 'east', 'west'][i % 4]}."
    for i in range(20)  # ~500 tokens: a cold prefill of a few seconds on 2 threads
)


@pytest.mark.slow
@pytest.mark.llama
def test_real_server_length_finish_and_usage(llama_server: LlamaServer) -> None:
    with OpenAIChatModel(llama_server.url, model=llama_server.alias) as m:
        assert llama_server.alias in m.models()
        c = m.complete(
            ChatRequest(
                messages=(ChatMessage("user", "Count from one to one hundred: one, two,"),),
                max_tokens=8,
            )
        )
        assert c.finish_reason == "length"
        assert c.usage.completion_tokens == 8
        assert 10 <= c.usage.prompt_tokens <= 40
        ids = m.tokenize("The lighthouse keeper")
        assert ids is not None and 3 <= len(ids) <= 8


@pytest.mark.slow
@pytest.mark.llama
def test_real_server_prefix_cache_makes_a_shared_prefix_fast(llama_server: LlamaServer) -> None:
    # a fresh random prefix so no earlier test warmed it
    prefix = f"Log {uuid.uuid4().hex}. {LONG}"
    with OpenAIChatModel(llama_server.url, model=llama_server.alias) as m:

        def ask(q: str) -> float:
            t = time.perf_counter()
            m.complete(
                ChatRequest(messages=(ChatMessage("user", f"{prefix}\n\n{q}"),), max_tokens=1)
            )
            return time.perf_counter() - t

        cold = ask("What did entry 3 say?")
        warm = ask("What did entry 5 say?")
    assert warm < cold * 0.5, f"cold {cold:.2f} s, warm {warm:.2f} s"


def _kill_soon(server: LlamaServer, after_s: float) -> threading.Timer:
    t = threading.Timer(after_s, server.kill)
    t.start()
    return t


@pytest.mark.slow
@pytest.mark.llama
def test_real_server_dying_mid_request_raises_not_hangs(fresh_llama_server: LlamaServer) -> None:
    m = OpenAIChatModel(
        fresh_llama_server.url,
        model=fresh_llama_server.alias,
        timeouts=Timeouts(connect=2, reply=60, summary=60),
        retries=1,
        backoff_s=0.1,
    )
    long_request = ChatRequest(
        messages=(ChatMessage("user", "Write a very long story about the sea."),),
        max_tokens=2000,
        extra={"stop": []},
    )
    timer = _kill_soon(fresh_llama_server, 2.0)
    started = time.monotonic()
    with pytest.raises((ModelUnavailable, ModelError)):
        m.complete(long_request)
    timer.join()
    assert time.monotonic() - started < 20
    m.close()


@pytest.mark.slow
@pytest.mark.llama
def test_real_server_dying_mid_stream_raises_after_partial_text(
    fresh_llama_server: LlamaServer,
) -> None:
    m = OpenAIChatModel(fresh_llama_server.url, model=fresh_llama_server.alias, retries=0)
    s = m.stream(
        ChatRequest(
            messages=(ChatMessage("user", "Write a very long story about the sea."),),
            max_tokens=2000,
        )
    )
    got: list[str] = []
    with pytest.raises(ModelUnavailable):
        for d in s:
            got.append(d)
            if len(got) == 5:
                fresh_llama_server.kill()
    assert len(got) >= 5
    assert s.finish_reason is None
    m.close()


def test_stream_closed_early_releases_the_connection() -> None:
    body = sse(delta("a"), delta("b"), delta("c", "stop"))
    m, _ = client(Recorder(httpx.Response(200, content=body)))
    with m.stream(REQ) as s:
        for d in s:
            assert d == "a"
            break
    assert s.finish_reason is None
    with pytest.raises(ModelError):
        s.completion()
