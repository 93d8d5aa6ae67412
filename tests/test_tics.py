from __future__ import annotations

import random
import unicodedata

import pytest

from kioku.tics import (
    TicAlert,
    anti_repetition_line,
    detect_tics,
    mentions_tic,
    strip_tics,
)
from tests.cases.corpus import cases

SUBJECTS = [
    "I",
    "We",
    "My sister",
    "The cat",
    "Your friend",
    "Grandma",
    "The teacher",
    "Our neighbour",
]
VERBS = [
    "bought",
    "painted",
    "found",
    "cooked",
    "lost",
    "borrowed",
    "fixed",
    "visited",
    "described",
]
OBJECTS = [
    "a red umbrella",
    "the old lighthouse",
    "some fresh bread",
    "a tiny garden",
    "the river path",
    "a strange letter",
    "the blue bicycle",
    "an antique clock",
    "the mountain cabin",
    "a jar of honey",
    "the noisy market",
    "a paper lantern",
    "the broken fence",
    "a silver ring",
    "the winter coat",
    "a box of crayons",
]
WHEN = [
    "yesterday",
    "last week",
    "this morning",
    "after lunch",
    "on Sunday",
    "before dinner",
    "in the rain",
]

JA = [
    "今日は駅前の店でケーキを買ったよ。",
    "明日は雨らしいから、傘を忘れないでね。",
    "映画の続きが気になるな。",
    "夏休みに海へ行きたい。",
    "猫が窓の外を見ている。",
    "新しい本を読み始めた。",
    "朝ごはんはパンにした。",
    "星がきれいな夜だった。",
    "春になったら花見をしよう。",
    "音楽を聴きながら散歩した。",
    "公園のベンチで少し休んだ。",
    "週末は部屋の片付けをする予定。",
]


def english_reply(rng: random.Random) -> str:
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}."
        for _ in range(rng.randint(2, 4))
    )


def japanese_reply(rng: random.Random) -> str:
    return "".join(rng.sample(JA, 2))


def planted(n_tic: int, tic: str, make, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    where = set(rng.sample(range(20), n_tic))
    return [make(rng) + (tic if i in where else "") for i in range(20)]


def test_a_tic_in_11_of_20_replies_is_caught():
    replies = planted(11, " Isn't that just purrfect, darling?", english_reply)
    alerts = detect_tics(replies)
    assert alerts[0] == TicAlert("Isn't that just purrfect, darling?", 11, 20, "ending")


def test_a_japanese_ending_in_11_of_20_replies_is_caught():
    replies = planted(11, "なのです、えへへ♪", japanese_reply)
    alerts = detect_tics(replies)
    assert [a.phrase for a in alerts] == ["なのです、えへへ♪"]
    assert alerts[0].count == 11


def test_three_of_20_is_no_tic():
    assert detect_tics(planted(3, " Isn't that just purrfect, darling?", english_reply)) == []
    assert detect_tics(planted(3, "なのです、えへへ♪", japanese_reply)) == []


def test_the_threshold_is_a_parameter():
    replies = planted(6, " Isn't that just purrfect, darling?", english_reply)
    assert detect_tics(replies) == []
    assert detect_tics(replies, threshold=6)[0].count == 6


def test_only_the_last_window_counts():
    old = planted(15, " Isn't that just purrfect, darling?", english_reply, seed=2)
    rng = random.Random(9)
    recent = [english_reply(rng) for _ in range(20)]
    assert detect_tics(old + recent) == []


def test_a_repeated_internal_phrase_is_caught_once_per_message():
    rng = random.Random(4)
    replies = []
    for i in range(20):
        text = english_reply(rng)
        if i % 2 == 0:  # twice in the same reply still counts once
            text = f"A shiver runs down my spine. {text} A shiver runs down my spine!"
        replies.append(text)
    alerts = detect_tics(replies)
    assert alerts[0].phrase.startswith("A shiver runs down my spine") and alerts[0].count == 10
    # maximal phrase only: not "shiver runs down", "runs down my spine", ...
    assert not any(a.phrase in alerts[0].phrase and a.count <= 10 for a in alerts[1:])


def test_openers_are_caught():
    replies = planted(9, "", english_reply)
    replies = [("Oh my stars, " + r) if i % 2 else r for i, r in enumerate(replies)]
    assert detect_tics(replies)[0].phrase.startswith("Oh my stars")


NOUNS = [
    "ケーキ",
    "傘",
    "映画",
    "海",
    "猫",
    "本",
    "パン",
    "星",
    "花見",
    "音楽",
    "公園",
    "部屋",
    "電車",
    "手紙",
]
VERBS_JA = [
    "買いました",
    "見ました",
    "探しています",
    "好きです",
    "忘れました",
    "片付けます",
    "待っています",
]


def test_punctuation_and_function_bits_are_not_tics():
    rng = random.Random(5)
    # polite endings (です。ます。) everywhere are ordinary Japanese, not a tic
    replies = [
        f"{rng.choice(NOUNS)}を{rng.choice(VERBS_JA)}。{rng.choice(NOUNS)}が{rng.choice(NOUNS)}です。"
        for _ in range(20)
    ]
    assert detect_tics(replies) == []
    dots = [english_reply(rng) + " ..." for _ in range(20)]
    assert detect_tics(dots) == []


def test_anti_repetition_line_names_the_phrase():
    alerts = [TicAlert("Isn't that just purrfect, darling?", 11, 20, "ending")]
    en = anti_repetition_line(alerts, "en")
    assert "Isn't that just purrfect, darling?" in en and "Do not use" in en
    ja = anti_repetition_line([TicAlert("なのです", 11, 20)], "ja")
    assert "「なのです」" in ja
    assert anti_repetition_line([], "en") == ""


MEMORY = (
    "Mika and Aki walked to the harbour and watched the boats.\n"
    "彼女はよく「えへへ」を使う。ユーザーは猫が好き。\n"
    "- Mika's catchphrase is cute.\n"
    "- Aki's birthday is 3 May.\n"
    'She often says "purrfect, darling" when she is happy. Aki promised to visit Kyoto.\n'
)


def test_strip_tics_removes_sentences_about_the_habit_and_keeps_facts():
    out = strip_tics(MEMORY, ["Isn't that just purrfect, darling?", "えへへ"])
    assert "えへへ" not in out and "purrfect" not in out and "catchphrase" not in out
    for fact in (
        "watched the boats",
        "ユーザーは猫が好き。",
        "birthday is 3 May",
        "promised to visit Kyoto",
    ):
        assert fact in out


def test_strip_tics_keeps_a_fact_that_merely_contains_the_phrase():
    text = "Aki said you know nothing about trains, and they argued.\n"
    assert strip_tics(text, ["you know"]) == text
    assert not mentions_tic(text, ["you know"])


@pytest.mark.parametrize(
    "summary",
    [
        "She often uses that expression.",
        "彼女はその表現をよく使う。",
        "ミカの口癖は「えへへ」。",
        'Mika likes to end with "nya~".',
    ],
)
def test_mentions_tic(summary):
    assert mentions_tic(summary, ["nya~", "えへへ"])
    assert strip_tics(summary, ["nya~", "えへへ"]).strip() == ""


def test_mentions_tic_is_false_on_plain_facts():
    assert not mentions_tic("Aki likes tea. ユーザーは猫が好き。", ["nya~", "えへへ"])


# --- declining is an answer, not a tic: labelled cases (tests/cases/declining.jsonl) --------


def test_a_reply_that_declines_is_never_a_tic_on_labelled_cases() -> None:
    """A character asked about what was never said answers "I don't remember", as often as the
    questions call for it; told to avoid the phrase, a model invents instead. The same phrase
    planted in 11 of 20 replies is alerted when it does not decline, in four languages."""
    run = list(cases("declining"))
    assert {c["lang"] for c in run} >= {"en", "ja", "zh", "ko"}
    wrong = []
    for c in run:
        make = english_reply if c["lang"] == "en" else japanese_reply
        alerts = detect_tics(planted(11, " " + c["text"], make))
        text = unicodedata.normalize("NFKC", c["text"])  # as the guard reads replies
        alerted = any(a.phrase in text or text in a.phrase for a in alerts)
        if alerted == c["declines"]:
            wrong.append(f"{c['lang']} {c['text']!r}: alerted {alerted}, declines {c['declines']}")
    assert not wrong, "\n".join(wrong)
