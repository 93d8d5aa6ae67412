"""Roles alternate in every list kioku sends upstream, and the result stays prefix-stable."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kioku.alternation import OPENING, alternate, alternate_chat
from kioku.models import ChatMessage, ContentPart, ToolCall
from kioku.normal_form import normal_form


def msg(role: str, content: Any, **kw: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **kw}


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def alternates(messages: list[dict[str, Any]]) -> bool:
    """What Gemma's template checks: after one optional system message, user first, then
    user and assistant by turns."""
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    return all(m["role"] == ("user" if k % 2 == 0 else "assistant") for k, m in enumerate(body))


def test_the_memory_acknowledgement_and_a_greeting_merge() -> None:
    sent = alternate(
        [
            msg("system", "card"),
            msg("user", "the story so far"),
            msg("assistant", "Understood."),
            msg("assistant", "*Seraphina smiles.*"),
            msg("user", "hello"),
        ]
    )
    assert roles(sent) == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == "Understood.\n\n*Seraphina smiles.*"


def test_two_user_turns_after_a_failed_turn_merge() -> None:
    sent = alternate(
        [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"), msg("user", "u3")]
    )
    assert sent[-1] == msg("user", "u2\n\nu3") and alternates(sent)


def test_a_chat_that_opens_with_the_greeting_gets_an_opening_line() -> None:
    sent = alternate([msg("system", "card"), msg("assistant", "Welcome!"), msg("user", "hi")])
    assert sent == [
        msg("system", "card"),
        msg("user", OPENING),
        msg("assistant", "Welcome!"),
        msg("user", "hi"),
    ]


def test_system_messages_lead_once_and_later_ones_are_the_users() -> None:
    sent = alternate(
        [
            msg("system", "main"),
            msg("system", "examples", name="example"),
            msg("user", "hi"),
            msg("assistant", "hello"),
            msg("system", "[author's note]"),
            msg("user", "how are you?"),
            msg("system", "[continue]"),
        ]
    )
    assert sent[0] == msg("system", "main\n\nexamples")
    assert sent[1:] == [
        msg("user", "hi"),
        msg("assistant", "hello"),
        msg("user", "[author's note]\n\nhow are you?\n\n[continue]"),
    ]


def test_content_parts_merge_as_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    sent = alternate([msg("user", "look"), msg("user", [image, {"type": "text", "text": "this"}])])
    assert sent == [
        msg(
            "user",
            [
                {"type": "text", "text": "look"},
                {"type": "text", "text": "\n\n"},
                image,
                {"type": "text", "text": "this"},
            ],
        )  # fmt: skip
    ]


def test_tool_calls_and_results_are_left_alone() -> None:
    call = msg("assistant", None, tool_calls=[{"id": "1", "type": "function"}])
    listed = [
        msg("user", "weather?"),
        call,
        msg("tool", "sunny", tool_call_id="1"),
        msg("assistant", "It is sunny."),
    ]
    assert alternate(listed) == listed


def test_the_input_is_not_changed() -> None:
    listed = [msg("assistant", "a"), msg("assistant", "b")]
    alternate(listed)
    assert listed == [msg("assistant", "a"), msg("assistant", "b")]


def test_the_library_path_alternates_chat_messages() -> None:
    out = alternate_chat((ChatMessage("system", "card"), ChatMessage("assistant", "hi")))
    assert out == (
        ChatMessage("system", "card"),
        ChatMessage("user", OPENING),
        ChatMessage("assistant", "hi"),
    )


def test_the_library_path_keeps_tool_calls_images_and_results() -> None:
    """The same rules on `ChatMessage`s, with nothing of the protocol lost (they used to be
    rebuilt from role and text)."""
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("1", "get_weather", "{}"),),
                       no_content=True)  # fmt: skip
    result = ChatMessage("tool", "sunny", tool_call_id="1", name="get_weather")
    picture = ChatMessage("user", "this", parts=(ContentPart(ref="abc"), ContentPart("this")))
    out = alternate_chat(
        (
            ChatMessage("system", "card"),
            ChatMessage("user", "weather?"),
            call,
            result,
            ChatMessage("assistant", "It is sunny."),
            ChatMessage("user", "look"),
            picture,
        )
    )
    assert out[:5] == (
        ChatMessage("system", "card"),
        ChatMessage("user", "weather?"),
        call,
        result,
        ChatMessage("assistant", "It is sunny."),
    )
    assert out[5] == ChatMessage(
        "user",
        "look\n\nthis",
        parts=(
            ContentPart("look"),
            ContentPart("\n\n"),
            ContentPart(ref="abc"),
            ContentPart("this"),
        ),
    )
    assert len(out) == 6


role = st.sampled_from(["system", "user", "assistant"])
message = st.builds(lambda r, t: msg(r, t), role, st.sampled_from(["a", "b", "c d", "e"]))


@given(st.lists(message, max_size=12), st.lists(message, min_size=1, max_size=4))
def test_any_list_alternates_and_growing_it_keeps_the_prefix(
    head: list[Any], more: list[Any]
) -> None:
    """Whatever kioku assembles alternates, and appending messages (the next turn) changes
    only the last message of what was sent before, by appending to it."""
    before = alternate(head)
    after = alternate(head + more)
    assert alternates(before) and alternates(after)
    if before:
        assert after[: len(before) - 1] == before[:-1]
        last, same = before[-1], after[len(before) - 1]
        assert same["role"] == last["role"] and same["content"].startswith(last["content"])


# normal form ------------------------------------------------------------------------------------


def test_normal_form_drops_speaker_labels_and_whitespace() -> None:
    assert normal_form("Seraphina: *smiles*\r\nSeraphina:  Welcome!  ") == "*smiles* Welcome!"
    assert normal_form("Dr. Hale: Sit down.") == "Sit down."
    assert normal_form("セラフィナ:「ようこそ」") == normal_form("「ようこそ」")
    # not labels: lowercase words, more than three words, a colon mid-line
    assert normal_form("note: this stays") == "note: this stays"
    assert normal_form("The Old Grey Wizard: x") == "The Old Grey Wizard: x"
    assert normal_form("She said: go") == "She said: go"
    assert normal_form("at 10:30 we met") == "at 10:30 we met"
