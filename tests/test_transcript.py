"""The transcript the chronicler reads: seq, time, side, and each part marked by kind."""

from __future__ import annotations

from datetime import datetime

import pytest

from kioku.messages import LogEntry, Message, Part
from kioku.transcript import render_transcript

D1 = datetime(2024, 3, 1, 21, 0)
D1_LATER = datetime(2024, 3, 1, 21, 5)
D2 = datetime(2024, 3, 2, 8, 30)


def entries() -> list[LogEntry]:
    return [
        LogEntry(0, Message.user("How old are you?", author="Ren", at=D1)),
        LogEntry(
            1,
            Message(
                "assistant",
                (
                    Part("narration", "Mika hid her tail."),
                    Part("speech", "Twenty.", speaker="Mika"),
                    Part("thought", "Three hundred, really.", speaker="Mika"),
                    Part("speech", "She is lying!", speaker="Old Crow"),
                ),
                author="Mika",
                at=D1_LATER,
            ),
        ),
        LogEntry(2, Message.user("Good morning.\nSlept well?", author="Ren", at=D2)),
        LogEntry(3, Message("system", (Part("text", "The scene changes."),))),
        LogEntry(4, Message.assistant("   ", author="Mika")),
    ]


def test_english_transcript_marks_every_part() -> None:
    text = render_transcript(entries(), "en")
    assert text == (
        "#0 · 2024-03-01 (Fri) 21:00 · Ren (user)\n"
        "  How old are you?\n"
        "\n"
        "#1 · 21:05 · Mika (character)\n"
        "  [narration] Mika hid her tail.\n"
        '  [speech] Mika: "Twenty."\n'
        "  [thought, unspoken] Mika: Three hundred, really.\n"
        '  [speech] Old Crow: "She is lying!"\n'
        "\n"
        "#2 · 2024-03-02 (Sat) 08:30 · Ren (user)\n"
        "  Good morning.\n"
        "    Slept well?\n"
        "\n"
        "#3 · system\n"
        "  The scene changes."
    )


@pytest.mark.parametrize(
    ("lang", "wanted"),
    [
        (
            "ja",
            [
                "Mika (キャラクター)",
                "[地の文] Mika hid her tail.",
                "[台詞] Mika: 「Twenty.」",
                "[本音・口に出していない] Mika: Three hundred",
                "Ren (ユーザー)",
            ],
        ),
        (
            "zh",
            [
                "Mika (角色)",
                "[旁白] Mika hid",
                "[台词] Mika: “Twenty.”",
                "[内心·未说出口] Mika:",
                "Ren (用户)",
            ],
        ),
        ("ja-JP", ["[地の文]"]),
        ("ko", ["[narration]"]),
    ],
)
def test_labels_follow_the_language(lang: str, wanted: list[str]) -> None:
    text = render_transcript(entries(), lang)
    for w in wanted:
        assert w in text


def test_speech_without_speaker_is_the_authors_and_empty_messages_are_skipped() -> None:
    e = LogEntry(7, Message("assistant", (Part("speech", "Hi"),), author="Mika"))
    assert render_transcript([e]) == '#7 · Mika (character)\n  [speech] Mika: "Hi"'
    assert "#4" not in render_transcript(entries())
