"""Dates: the raw window's date lines, client dates, and relative dates resolved."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from kioku.context import build, entry_message
from kioku.dates import date_line, dated_texts, parse_client_date, window
from kioku.memory import Memory
from kioku.messages import LogEntry, Message
from kioku.profiles import LOCAL_8K
from kioku.relative_dates import resolve, unresolve
from kioku.tokens import ScriptEstimator

MAY7 = datetime(2023, 5, 7, 21, 0)
MAY8 = datetime(2023, 5, 8, 13, 56)


def test_a_date_line_marks_each_new_day_and_a_window_that_continues() -> None:
    ms = [
        Message.user("Good night!", "Ren", MAY7),
        Message.assistant("Sleep well.", "Mika", MAY7.replace(minute=5)),
        Message.user("Morning!", "Ren", MAY8),
        Message.assistant("Hi.", "Mika"),  # undated
        Message.user("Back again.", "Ren", MAY8),  # after an undated message: a line again
    ]
    texts = dated_texts(ms, "en")
    assert texts[0] == "Good night!"  # the conversation's start: nothing came before
    assert dated_texts(ms, "en", continued=True)[0] == "⟦Sunday, 7 May 2023⟧\nGood night!"
    assert texts[1] == "Sleep well."
    assert texts[2] == "⟦Monday, 8 May 2023⟧\nMorning!"
    assert texts[3] == "Hi."
    assert texts[4].startswith("⟦Monday, 8 May 2023⟧\n")
    assert date_line(date(2023, 5, 8), "ja") == "⟦2023年5月8日(月)⟧"
    assert date_line(date(2023, 5, 8), "zh") == "⟦2023年5月8日 星期一⟧"


def test_the_prompt_counts_date_lines_with_their_message_and_stays_stable() -> None:
    counter = ScriptEstimator()
    raw = [
        LogEntry(i, m, counter.count(m.text))
        for i, m in enumerate(  # from seq 20: memory or dropped messages came before
            [
                Message.user("Good night!", "Ren", MAY7),
                Message.assistant("Sleep well.", "Mika", MAY7),
                Message.user("Morning!", "Ren", MAY8),
                Message.assistant("Hi, Ren.", "Mika", MAY8),
            ],
            20,
        )
    ]
    new = LogEntry(24, Message.user("What did we do yesterday?", "Ren", MAY8), 0)
    p = build(
        system_prompt="You are Mika.",
        memory=Memory(),
        raw=raw,
        new=new,
        profile=LOCAL_8K,
        counter=counter,
    )
    contents = [m.content for m in p.messages]
    assert contents[1].startswith("⟦Sunday, 7 May 2023⟧\n")
    assert contents[3].startswith("⟦Monday, 8 May 2023⟧\n")
    assert contents[-1] == "What did we do yesterday?"  # same day as the message before it
    assert p.account.raw == sum(counter.count(c) for c in contents[1:-1])  # exact, lines included
    # the next turn renders the same messages the same way: the prompt cache holds
    again = window(raw, counter, "en", entry_message)
    assert [m.content for m, _ in again] == contents[1:-1]
    # a new day's message carries its own date line, counted in its tokens
    late = LogEntry(24, Message.user("Hello again.", "Ren", datetime(2023, 5, 9, 8)), 0)
    q = build(
        system_prompt="", memory=Memory(), raw=raw, new=late, profile=LOCAL_8K, counter=counter
    )
    assert q.messages[-1].content == "⟦Tuesday, 9 May 2023⟧\nHello again."
    assert q.account.new == counter.count(q.messages[-1].content)
    # a conversation that still fits from its first message passes through as sent
    fresh = [LogEntry(i, e.message, e.tokens) for i, e in enumerate(raw[:2])]
    f = build(
        system_prompt="",
        memory=Memory(),
        raw=fresh,
        new=LogEntry(2, Message.user("Still up?", "Ren", MAY7), 0),
        profile=LOCAL_8K,
        counter=counter,
    )
    assert [m.content for m in f.messages] == ["Good night!", "Sleep well.", "Still up?"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("May 8, 2023 1:56pm", datetime(2023, 5, 8, 13, 56)),  # SillyTavern's send_date
        ("May 8, 2023 at 1:56 PM", datetime(2023, 5, 8, 13, 56)),
        ("2023-05-08T13:56:00", datetime(2023, 5, 8, 13, 56)),
        ("garbage", None),
        ("", None),
        (True, None),
    ],
)
def test_client_dates(value: object, expected: datetime | None) -> None:
    assert parse_client_date(value) == expected


def test_client_dates_as_epoch_and_iso_with_zone() -> None:
    ms = parse_client_date(1683554160000)
    s = parse_client_date(1683554160)
    assert ms == s and ms is not None and ms.year == 2023
    z = parse_client_date("2023-05-08T13:56:00Z")
    assert z is not None and z.utcoffset() is not None


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        (
            "I went to a support group yesterday and it was powerful.",
            "en",
            "I went to a support group yesterday (7 May 2023) and it was powerful.",
        ),
        ("Last week I ran a race.", "en", "Last week (the week of 1 May 2023) I ran a race."),
        ("The last week of June was hot.", "en", "The last week of June was hot."),
        (
            "I adopted her two weeks ago.",
            "en",
            "I adopted her two weeks ago (around 24 April 2023).",
        ),
        ("See you tomorrow!", "en", "See you tomorrow (9 May 2023)!"),
        ("We met last Friday.", "en", "We met last Friday (5 May 2023)."),
        ("I moved here 4 years ago.", "en", "I moved here 4 years ago (2019)."),
        ("a few days ago, on Friday", "en", "a few days ago, on Friday"),  # vague: left alone
        # a span that runs up to now names when it began; one that ended does not
        (
            "I've had them for 3 years now and love them.",
            "en",
            "I've had them for 3 years now (since 2020) and love them.",
        ),
        (
            "Been playing for a month now, it's tough.",
            "en",
            "Been playing for a month now (since April 2023), it's tough.",
        ),
        (
            "We've been together for three years.",
            "en",
            "We've been together for three years (since 2020).",
        ),
        ("I lived there for two years.", "en", "I lived there for two years."),
        ("I'll stay for a week.", "en", "I'll stay for a week."),
        (
            "I've been doing it for a few years now.",
            "en",
            "I've been doing it for a few years now.",
        ),
        ("3年前から猫を飼っている。", "ja", "3年前(2020年)から猫を飼っている。"),
        ("我三年前开始学吉他。", "zh", "我三年前(2020年)开始学吉他。"),
        ("昨日は雨でした。", "ja", "昨日(2023年5月7日)は雨でした。"),
        ("先週の金曜日に映画を見た。", "ja", "先週の金曜日(2023年5月5日)に映画を見た。"),
        ("3日前と去年と来月", "ja", "3日前(2023年5月5日)と去年(2022年)と来月(2023年6月)"),
        ("明日香さんに会った", "ja", "明日香さんに会った"),  # a name, not "tomorrow"
        (
            "我昨天去了公园，上周五也去了。",
            "zh",
            "我昨天(2023年5月7日)去了公园，上周五(2023年5月5日)也去了。",
        ),
    ],
)
def test_relative_dates_are_resolved(text: str, lang: str, expected: str) -> None:
    got = resolve(text, MAY8, lang)
    assert got == expected
    assert resolve(got, MAY8, lang) == got  # twice changes nothing more
    assert unresolve(got) == text


def test_nothing_is_resolved_without_a_date() -> None:
    assert resolve("yesterday", None) == "yesterday"
