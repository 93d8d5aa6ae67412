"""Client libraries configured as a new user would (from their own docs, with kioku's URL, key
and conversation header), through `kioku serve`: LangChain's `ChatOpenAI` and LlamaIndex's
`OpenAILike`. Each scenario runs once straight against the fake upstream and once through kioku;
what reached the upstream must be the same, plus kioku's memory (none yet in these turns)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage as LIMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

from tests.test_service_protocol import CARD, completion, proto, same_request, weather_agent
from tests.test_service_support import Harness

__all__ = ["proto"]  # the module's service, shared with test_service_protocol's fixture

Run = Callable[[str, dict[str, str]], Any]  # (base_url, headers) -> what the client got


@pytest.fixture
def svc(proto: Harness) -> Iterator[Harness]:
    yield proto
    proto.idle()


def both(svc: Harness, cid: str, run: Run) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Run a scenario straight to the upstream, then through kioku; assert the client got the
    same answers, and return each request the upstream got, paired (kioku's, the direct one)."""
    before = len(svc.up.chats())
    straight = run(svc.up.url, {})
    mid = len(svc.up.chats())
    through = run(f"{svc.url}/v1", {"X-Kioku-Conversation": cid})
    svc.idle()
    assert through == straight
    chats = svc.up.chats()
    direct_requests, kioku_requests = chats[before:mid], chats[mid:]
    assert len(direct_requests) == len(kioku_requests)
    return list(zip(kioku_requests, direct_requests, strict=True))


def key(svc: Harness, url: str) -> str:
    return svc.key("acme") if url.startswith(svc.url) else "sk-upstream"


@tool
def get_weather(city: str) -> str:
    """The weather in a city today."""
    return "sunny"


def test_langchain_chat_openai_invoke_stream_and_async(svc: Harness) -> None:
    def run(url: str, headers: dict[str, str]) -> Any:
        llm = ChatOpenAI(model="m", base_url=url, api_key=key(svc, url), default_headers=headers,
                         max_retries=0)  # fmt: skip
        history: list[BaseMessage] = [SystemMessage(CARD), HumanMessage("Hello, Mika!")]
        first = llm.invoke(history)
        history += [first, HumanMessage("How is the tea?")]
        streamed = "".join(str(c.content) for c in llm.stream(history))
        # the streamed reply joins the history as an app keeps it (a transcript whose roles do
        # not alternate reaches the upstream merged: `kioku.alternation`, test_alternation)
        history += [AIMessage(streamed), HumanMessage("And tomorrow?")]
        later = asyncio.run(llm.ainvoke(history))
        return [first.content, streamed, later.content]

    for through, straight in both(svc, "lc-1", run):
        same_request(through, straight)


def test_langchain_tool_round_trip(svc: Harness) -> None:
    svc.up.reply = weather_agent("Tokyo")

    def run(url: str, headers: dict[str, str]) -> Any:
        llm = ChatOpenAI(model="m", base_url=url, api_key=key(svc, url), default_headers=headers,
                         max_retries=0).bind_tools([get_weather])  # fmt: skip
        history: list[BaseMessage] = [SystemMessage(CARD), HumanMessage("Rain in Tokyo?")]
        ai = llm.invoke(history)
        assert ai.tool_calls and ai.tool_calls[0]["args"] == {"city": "Tokyo"}
        history += [ai, ToolMessage("sunny, 25C", tool_call_id=ai.tool_calls[0]["id"])]
        answer = llm.invoke(history)
        streamed = "".join(str(c.content) for c in llm.stream(history))
        return [ai.tool_calls, answer.content, streamed]

    pairs = both(svc, "lc-tools", run)
    for through, straight in pairs:
        same_request(through, straight)
    assert [m["role"] for m in pairs[1][0]["messages"]] == ["system", "user", "assistant", "tool"]
    svc.up.reply = lambda body: completion({"content": "ok"})


def test_llamaindex_openai_like_chat_stream_and_tools(svc: Harness) -> None:
    svc.up.reply = weather_agent("Tokyo")
    weather = FunctionTool.from_defaults(fn=lambda city: "sunny", name="get_weather",
                                         description="The weather in a city today.")  # fmt: skip

    def run(url: str, headers: dict[str, str]) -> Any:
        llm = OpenAILike(model="m", api_base=url, api_key=key(svc, url), is_chat_model=True,
                         is_function_calling_model=True, default_headers=headers, max_retries=0)  # fmt: skip
        history = [LIMessage(role="system", content=CARD)]
        resp = llm.chat_with_tools([weather], chat_history=list(history), user_msg="Rain in Tokyo?")
        [call] = llm.get_tool_calls_from_response(resp)
        history += [LIMessage(role="user", content="Rain in Tokyo?"), resp.message]
        history.append(LIMessage(role="tool", content="sunny, 25C",
                                 additional_kwargs={"tool_call_id": call.tool_id}))  # fmt: skip
        answer = llm.chat_with_tools([weather], chat_history=history)
        history += [answer.message, LIMessage(role="user", content="Thanks!")]
        streamed = "".join(r.delta or "" for r in llm.stream_chat(history))
        return [call.tool_kwargs, answer.message.content, streamed]

    for through, straight in both(svc, "li-1", run):
        same_request(through, straight)
    svc.up.reply = lambda body: completion({"content": "ok"})


def test_llamaindex_default_openai_like_gets_told_to_set_is_chat_model(svc: Harness) -> None:
    """OpenAILike's default (`is_chat_model=False`) calls /v1/completions: kioku cannot
    remember a bare prompt, and says what to set instead of passing it through."""
    llm = OpenAILike(model="m", api_base=f"{svc.url}/v1", api_key=svc.key("acme"), max_retries=0)
    with pytest.raises(openai.NotFoundError, match="is_chat_model=True"):
        llm.complete("Once upon a time")
