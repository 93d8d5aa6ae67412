"""Messages as the protocol writes them: stored as parts, sent back as they came, counted with
their images, and read by the chronicler as what they are (an action, a result, a picture)."""

from __future__ import annotations

from typing import Any

import pytest

from kioku.chat_messages import chat_message, incoming, media_of, message_tokens, reply_message
from kioku.chronicle_prompt import build_request
from kioku.context import build
from kioku.errors import BadParameter
from kioku.memory import Memory
from kioku.messages import LogEntry, Message, Part, parts_from_json
from kioku.models import Completion, ToolCall
from kioku.profiles import LOCAL_8K
from kioku.recall.recollection import RecalledLine, Recollection
from kioku.summarizer import ExtractiveSummarizer, SummaryTask
from kioku.tokens import ScriptEstimator
from kioku.transcript import render_transcript

COUNTER = ScriptEstimator()
IMAGE = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
CALL = {"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Tokyo"}'}}  # fmt: skip

# request messages that must come back out exactly as they went in
ROUND_TRIPS: list[dict[str, Any]] = [
    {"role": "user", "content": "hello"},
    {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]},
    {"role": "user", "content": [IMAGE, {"type": "text", "text": "caption after"}, AUDIO]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},  # "" stays "", null stays null
    {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
    {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 25C"},
    {"role": "tool", "tool_call_id": "call_9", "name": "get_weather", "content": "sunny"},
    {"role": "function", "name": "get_weather", "content": "sunny"},
]


def stored(m: dict[str, Any]) -> tuple[Message, dict[str, Any]]:
    extra = {k: v for k, v in m.items() if k not in ("role", "content", "name")}
    parsed = incoming(m["role"], m.get("content"), name=m.get("name"), extra=extra)
    role = "tool" if m["role"] == "function" else m["role"]
    return Message(role, parsed.parts), media_of(parsed.blobs)


@pytest.mark.parametrize("m", ROUND_TRIPS, ids=lambda m: str(m["role"]) + str(len(str(m))))
def test_a_message_goes_upstream_as_the_client_wrote_it(m: dict[str, Any]) -> None:
    message, media = stored(m)
    assert chat_message(message).to_json(media) == m
    # and through the store's JSON of its parts, as the log keeps it
    again = Message(message.role, parts_from_json(message.parts_json()))
    assert chat_message(again) == chat_message(message)


def test_plain_messages_are_sent_as_before() -> None:
    for role in ("user", "assistant", "system"):
        assert chat_message(Message.of(role, "hi")).to_json() == {"role": role, "content": "hi"}  # type: ignore[arg-type]
    structured = Message(
        "assistant", (Part("narration", "Mika nods."), Part("speech", "Yes.")), "Mika"
    )
    assert chat_message(structured).to_json() == {
        "role": "assistant",
        "content": "Mika nods.\n「Yes.」",
    }


def test_stored_text_tells_calls_and_images_apart_for_syncing() -> None:
    a, _ = stored({"role": "assistant", "content": None, "tool_calls": [CALL]})
    b, _ = stored({"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "c2"}]})
    respaced = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}
    c, _ = stored({"role": "assistant", "content": None, "tool_calls": [respaced]})
    assert a.text != b.text  # another call
    assert a.text == c.text  # the same call, its JSON re-serialized by the client
    img1, _ = stored({"role": "user", "content": [IMAGE]})
    img2, _ = stored(
        {"role": "user", "content": [{**IMAGE, "image_url": {"url": "https://x/y.png"}}]}
    )
    assert img1.text != img2.text and not img1.is_empty()


def test_malformed_messages_name_the_field() -> None:
    with pytest.raises(BadParameter) as e:
        incoming("tool", "x", where="messages.3")
    assert e.value.param == "messages.3.tool_call_id"
    with pytest.raises(BadParameter):
        incoming("assistant", None, extra={"tool_calls": [{"id": 1, "function": {}}]})
    with pytest.raises(BadParameter):
        incoming("assistant", None, extra={"function_call": {"name": "f", "arguments": "{}"}})


def test_a_reply_with_tool_calls_is_stored_with_them() -> None:
    reply = Completion("", "tool_calls", tool_calls=(ToolCall("c1", "get_weather", "{}"),))
    m = reply_message(reply, "Mika")
    assert chat_message(m).to_json() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [ToolCall("c1", "get_weather", "{}").to_json()],
    }
    assert reply_message(Completion("Hi."), "Mika") == Message.assistant("Hi.", author="Mika")


def test_an_image_costs_the_profiles_tokens_in_the_budget() -> None:
    text_only, _ = stored({"role": "user", "content": "look"})
    with_image, _ = stored({"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]})
    plain = message_tokens(text_only, COUNTER, 256)
    assert message_tokens(with_image, COUNTER, 256) >= plain + 256
    assert message_tokens(with_image, COUNTER, 0) > 0  # its line of text, never zero


def test_recollections_go_next_to_a_user_message_never_into_a_tool_result() -> None:
    tool, _ = stored({"role": "tool", "tool_call_id": "call_9", "content": "sunny"})
    user, _ = stored({"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]})
    rec = [Recollection(0, 0, 1.0, (RecalledLine(0, "Mika", "an old memory"),))]
    common: dict[str, Any] = dict(
        system_prompt="card", memory=Memory(), raw=(), profile=LOCAL_8K, counter=COUNTER,
        recollections=rec,
    )  # fmt: skip
    last = build(new=LogEntry(5, tool, 5), **common).messages[-1].to_json()
    assert last == {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}
    last = build(new=LogEntry(5, user, 5), **common).messages[-1]
    assert "an old memory" in last.content and "an old memory" in str(last.parts[0])
    assert last.parts[-1].ref is not None  # the image is still there, after the text


# what the chronicler reads --------------------------------------------------------------------


def exchange() -> list[LogEntry]:
    def entry(seq: int, m: dict[str, Any], author: str) -> LogEntry:
        message, _ = stored(m)
        return LogEntry(seq, Message(message.role, message.parts, author=author), 10)

    return [
        entry(0, {"role": "user", "content": "Is it raining in Tokyo?"}, "Ren"),
        entry(1, {"role": "assistant", "content": None, "tool_calls": [CALL]}, "Mika"),
        entry(
            2,
            {
                "role": "tool",
                "tool_call_id": "call_9",
                "name": "get_weather",
                "content": "sunny, 25C",
            },
            "get_weather",
        ),  # fmt: skip
        entry(3, {"role": "assistant", "content": "No rain today!"}, "Mika"),
        entry(
            4,
            {"role": "user", "content": [{"type": "text", "text": "My new kitten!"}, IMAGE]},
            "Ren",
        ),
    ]


def test_the_transcript_shows_a_tool_exchange_as_an_action_and_its_result() -> None:
    t = render_transcript(exchange(), "en")
    assert '[tool use] Mika: get_weather {"city": "Tokyo"}' in t
    assert "[tool result] get_weather: sunny, 25C" in t
    assert "[image shared] Ren" in t and "My new kitten!" in t
    assert "[speech]" not in t and "data:image" not in t  # nobody said it; no image bytes
    ja = render_transcript(exchange(), "ja")
    assert "[ツール使用] Mika" in ja and "[ツール結果] get_weather" in ja and "[画像を共有]" in ja


@pytest.mark.parametrize("lang", ["en", "ja", "zh"])
def test_the_chapter_prompt_explains_tools_and_images(lang: str) -> None:
    task = SummaryTask(kind="chapter", target_tokens=200, entries=tuple(exchange()), lang=lang)
    request, version = build_request(task, max_tokens=600)
    system, user = request.messages[0].content, request.messages[1].content
    assert version.endswith("-v4")
    label = {"en": "[tool result]", "ja": "[ツール結果]", "zh": "[工具结果]"}[lang]
    assert label in system and label in user


def test_the_extractive_chapter_records_the_exchange_and_the_image() -> None:
    summary = ExtractiveSummarizer(COUNTER).summarize(
        SummaryTask(kind="chapter", target_tokens=40, entries=tuple(exchange()))
    )
    # a tiny budget still keeps the image, with its caption
    assert "[4] Ren (image): shared an image: My new kitten!" in summary.text
    summary = ExtractiveSummarizer(COUNTER).summarize(
        SummaryTask(kind="chapter", target_tokens=400, entries=tuple(exchange()))
    )
    assert '[1] Mika (tool use): get_weather {"city": "Tokyo"}' in summary.text
    assert "[2] get_weather (tool result): sunny, 25C" in summary.text
