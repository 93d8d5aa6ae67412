"""The model-free fact extractor: facts a reader would keep, attributed and dated."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from kioku.facts import Speech, addressees, facts_in, facts_in_speech, slot_for_object
from kioku.messages import LogEntry, Message

AT = datetime(2022, 8, 2, 9, 30)


def ja(text: str) -> set[tuple[str, str, str]]:
    return {
        (f.kind, f.subject, f.text) for f in facts_in_speech(Speech(text, "CP", "AC", AT), "ja")
    }


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        # the object is the whole noun phrase, and the preference is the child's (もつ鍋, not つ鍋)
        ("もつ鍋が子供が好きで、よく食べに行きます。", ("preference", "CPの子供", "もつ鍋が好き")),
        ("子供がもつ鍋が好きなんです", ("preference", "CPの子供", "もつ鍋が好き")),
        ("泳ぐのが好きです", ("preference", "CP", "泳ぐことが好き")),
        ("運動するのは好きですよ！", ("preference", "CP", "運動することが好き")),
        ("ミステリー小説がとても好きです", ("preference", "CP", "ミステリー小説が好き")),
        ("水族館のほうが好き", ("preference", "CP", "水族館が好き")),
        ("夫は釣りが好きです", ("preference", "CPの夫", "釣りが好き")),
        ("猫は好きじゃないです", ("preference", "CP", "猫が好きではない")),
        (
            "カレーはね、甘口より中辛あたりの味が好きですね。",
            ("preference", "CP", "カレーは中辛あたりの味が好き"),
        ),
        ("好きな食べ物はラーメンです", ("preference", "CP", "好きな食べ物はラーメン")),
        ("趣味は水泳です", ("preference", "CP", "趣味は水泳")),
        ("私は九州に住んでいます。", ("fact", "CP", "九州に住んでいる")),
        ("昔、京都に住んでました！", ("fact", "CP", "以前京都に住んでいた")),
        ("看護師として働いています", ("fact", "CP", "看護師として働いている")),
        ("子供が2人います", ("relation", "CP", "子供が2人いる")),
        ("妹の名前は花子です", ("relation", "CPの妹", "名前は花子")),
        ("毎朝コーヒーを飲みます", ("habit", "CP", "毎朝コーヒーを飲む")),
    ],
)
def test_japanese_facts(text: str, fact: tuple[str, str, str]) -> None:
    assert fact in ja(text)


@pytest.mark.parametrize(
    "text",
    [
        "なにが好きですか？",  # a question
        "のが好きです",  # a fragment
        "どんな鍋が好き？",
        "チョコのかかったやつが好き",  # "the one that…": its noun was elsewhere
        "混ぜたのが好き",
        "お好きなんですね",  # an echo of the other person
        "本が好きって知的な感じで素敵です！",  # quoted, not claimed
        "昔は野球が好きでした",  # the past
        "200円なら、毎日通えちゃう。",  # a condition
        "ジャングルに住んでみたくなるほどです。",  # a wish
        "地球に住んでても宇宙人の可能性はありますよね。",  # a supposition
        "寄宿舎にスパイで乗り込む話が好きです！",  # the noun's meaning is in the clause
        "好きな人はすごく好きです！",
        "時間も好きにできますし。",  # an adverb, not a preference
        "…アレですよ、アレ！",
    ],
)
def test_japanese_non_facts(text: str) -> None:
    assert ja(text) == set()


def en(text: str, at: datetime | None = None) -> set[tuple[str, str, str]]:
    return {
        (f.kind, f.subject, f.text)
        for f in facts_in_speech(Speech(text, "Caroline", "Melanie", at))
    }


def test_english_facts_keep_their_referents() -> None:
    got = en(
        "My sister is Hanako, her birthday is March 3rd, and I promise to bake her a cake. "
        "I promise to show you the studio."
    )
    assert ("relation", "Caroline", "sister is Hanako") in got
    assert ("anniversary", "Hanako", "birthday is March 3rd") in got
    assert ("promise", "Caroline", "promised: bake Hanako a cake") in got
    assert ("promise", "Caroline", "promised: show Melanie the studio") in got


@pytest.mark.parametrize(
    "text",
    [
        "I love that you chose pottery.",  # a reaction to the other person, not a preference
        "I like it when you smile.",
        "I love you!",
        "I promise to remember that.",
        "My girlfriend, Toby and I are going camping.",  # a list, not a name
        "What do you like?",
    ],
)
def test_english_non_facts(text: str) -> None:
    assert en(text) == set()


# a note is worded about its subject and read under someone else's voice: "my" in it would
# point at the wrong person, and a clause of the speaker's inside an object is not a thing liked
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("I love my job.", {("preference", "Caroline", "likes Caroline's job")}),
        (
            "I love camping trips with my fam, 'cause nature is great.",
            {("preference", "Caroline", "likes camping trips with Caroline's fam")},
        ),
        (
            "I usually use voice chat to talk to my team.",
            {("habit", "Caroline", "usually use voice chat to talk to Caroline's team")},
        ),
        (
            "I'm a big fan of my grandma's cooking.",
            {("preference", "Caroline", "likes Caroline's grandma's cooking")},
        ),
        (
            "That picture was from a trip for my daughter Sara's birthday.",
            {("relation", "Caroline", "daughter is Sara")},
        ),
        ("I love pottery, Melanie.", {("preference", "Caroline", "likes pottery")}),
        (
            "I promise to call my mom.",
            {("promise", "Caroline", "promised: call Caroline's mom")},
        ),
        ("I work at my dad's shop.", {("fact", "Caroline", "works at Caroline's dad's shop")}),
        ("I work as a nurse.", {("fact", "Caroline", "works as a nurse")}),
        ("My job is teaching art.", {("fact", "Caroline", "job: teaching art")}),
        (
            "My partner and I often play for bets!",
            {("habit", "Caroline", "usually play for bets")},
        ),
        (
            "I love expressing myself through writing.",
            {("preference", "Caroline", "likes expressing oneself through writing")},
        ),
        ("There's a beach nearby that I love - the sound of the waves.", set()),
        ("I'm grateful to have a job I enjoy every day.", set()),
        ("Connecting with the things I love makes writing even more fun.", set()),
        ("I love spending time with the friends I have.", set()),
        ("My favorite song is one I wrote myself.", set()),
        ("I love the thought, Melanie!", set()),
        ("Wow, I love the idea!", set()),
    ],
)
def test_an_english_note_names_whom_it_is_about(text: str, want: set[tuple[str, str, str]]) -> None:
    got = en(text)
    assert got == want
    assert not any(re.search(r"\b(?:I|my|me|mine|myself)\b", t) for _, _, t in got)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("私の仕事が大好きです。", {("preference", "CP", "仕事が大好き")}),
        ("僕の犬と散歩するのが好き。", set()),
    ],
)
def test_a_japanese_note_names_whom_it_is_about(text: str, want: set[tuple[str, str, str]]) -> None:
    got = ja(text)
    assert got == want
    assert not any(re.search("私|僕|俺|あたし", t) for _, _, t in got)


def test_a_dated_event_is_kept_with_the_date_it_happened() -> None:
    got = en(
        "Yeah, I went to a LGBTQ support group yesterday and it was so powerful.",
        datetime(2023, 5, 8),
    )
    assert got == {("fact", "Caroline", "went to a LGBTQ support group yesterday (7 May 2023)")}
    f = facts_in_speech(
        Speech("I went hiking last week with friends.", "Caroline", "", datetime(2023, 5, 8))
    )
    assert f and f[0].on is not None and f[0].on.isoformat() == "2023-05-08"


def test_weather_likes_share_one_slot() -> None:
    assert slot_for_object("the fog") == slot_for_object("the rain") == "pref:weather"
    assert slot_for_object("green tea") == "pref:green tea"


def test_facts_in_messages_are_attributed_to_their_speaker() -> None:
    es = [
        LogEntry(0, Message.user("I promise to call you tomorrow.", "Ren", datetime(2024, 3, 1))),
        LogEntry(
            1, Message.assistant("私はチョコミントが大好きです。", "Mika", datetime(2024, 3, 1))
        ),
    ]
    assert addressees(es) == ["Mika", "Ren"]
    got = {(f.said_by, f.subject, f.text, f.seq) for f in facts_in(es)}
    assert ("Ren", "Ren", "promised: call Mika tomorrow (2 March 2024)", 0) in got
    assert ("Mika", "Mika", "チョコミントが大好き", 1) in got
