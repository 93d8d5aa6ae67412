"""Language knowledge is data (`kioku.lang`): the checks read each language's words from one
value per language, so Chinese names and cues and Korean words come from data alone."""

from __future__ import annotations

import pytest

from kioku.grounding.terms import ko_word, read
from kioku.lang import LANGS, WORDS, Language, detect_lang, words
from kioku.recall.need import about, cue


def test_every_language_is_one_value_and_prompt_languages_come_first() -> None:
    assert list(WORDS)[: len(LANGS)] == list(LANGS)
    assert all(isinstance(x, Language) and x.code == code for code, x in WORDS.items())
    assert all(x.past_cues for x in WORDS.values())  # every language can point at the past
    assert words("xx") is WORDS["en"]
    assert detect_lang("王老师最近怎么样？") == "zh"


@pytest.mark.parametrize(
    ("text", "lang", "said"),
    [
        ("你还记得上次我们去的那家餐厅吗？", "zh", "还记得"),
        ("我们之前聊过这个吧", "zh", "之前"),
        ("지난주에 간 식당 기억나?", "ko", "지난주"),
        ("예전에 말했던 책 읽었어?", "ko", "예전에"),
        ("覚えてる？あの店", "ja", "覚えて"),
        ("Do you remember the lake?", "en", "remember"),
    ],
)
def test_each_language_points_at_the_past_in_its_own_words(text: str, lang: str, said: str) -> None:
    assert cue(text, lang) == said


@pytest.mark.parametrize("text", ["你喜欢什么电影？", "요즘 뭐 먹고 싶어?", "好きな映画は？"])
def test_a_message_without_such_words_points_nowhere(text: str) -> None:
    assert cue(text, detect_lang(text)) == ""


@pytest.mark.parametrize(
    ("text", "lang", "whom"),
    [
        ("王老师最近怎么样？", "zh", "王老师"),
        ("小李后来找到工作了吗？", "zh", "小李"),
        ("你见过张先生吗？", "zh", "张先生"),
        ("민수 씨는 요즘 어때요?", "ko", "민수 씨"),
        ("지영님은 잘 지내요?", "ko", "지영님"),
        ("ハナコさんは元気？", "ja", "ハナコさん"),
    ],
)
def test_a_question_names_whom_it_asks_about_in_chinese_and_korean_too(
    text: str, lang: str, whom: str
) -> None:
    assert about(text, lang) == whom


def test_chinese_titles_find_no_name_in_a_japanese_conversation() -> None:
    """田中先生 is Japanese too: Chinese titles are looked for only in a Chinese conversation."""
    assert about("田中先生は元気？", "ja") == ""
    assert about("小时候你喜欢什么？", "zh") == ""  # 小时 is "hour", no one


def test_korean_is_read_by_words_without_their_particles() -> None:
    assert ko_word("친구를") == "친구"
    assert ko_word("아이") == "아이"  # 이 is the word here, not a particle
    line = read("친구가 부산에 갔다", "ko")
    said = read("어제 친구는 부산으로 갔다", "ko")
    assert {"친구", "부산"} <= line.terms & said.terms
    assert not line.negated and read("친구는 부산에 안 갔다", "ko").negated
