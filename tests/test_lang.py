"""Language knowledge is data (`kioku.lang`): the checks read each language's words from one
value per language, so Chinese names and cues and Korean words come from data alone."""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime

import pytest

from kioku.dates import date_line
from kioku.grounding.terms import ko_word, read
from kioku.lang import LANGS, WORDS, Language, detect_lang, words
from kioku.prompts import template
from kioku.recall.need import about, cue
from kioku.scenes import Scene, marker
from kioku.transcript import labels_for
from tests.cases.corpus import cases
from tests.helpers import layered


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


# --- which language a conversation is in: labelled cases (tests/cases/lang.jsonl) -----------


def test_every_language_is_told_by_its_letters_on_labelled_cases() -> None:
    """Korean, Japanese, Chinese, English and mixed messages: a text is in the language whose
    letters weigh most (Japanese with the Han characters it borrows), English when none."""
    run = [(c, detect_lang(c["text"])) for c in cases("lang")]
    by_kind = Counter(c["lang"] for c, _ in run)
    print("\n" + " ".join(f"{k}:{n}" for k, n in sorted(by_kind.items())))
    assert all(by_kind[k] >= 8 for k in ("ko", "ja", "zh", "en", "mixed")), by_kind
    wrong = [
        f"{c['text']!r}: got {got}, labelled {c['want']}" for c, got in run if got != c["want"]
    ]
    assert not wrong, "\n".join(wrong)


def test_a_language_is_detected_from_its_value_alone() -> None:
    """Adding a language's letters to its value is what makes it detectable."""
    assert all(WORDS[x].letters for x in ("en", "ja", "zh", "ko"))
    assert detect_lang(["민수 씨, 안녕하세요", "Hi"]) == "ko"  # a conversation of several texts
    assert detect_lang([]) == "en"


def test_a_korean_conversation_is_written_about_with_the_english_templates() -> None:
    assert template("chapter", "ko").lang == "en" and template("notes", "ko").lang == "en"
    assert labels_for("ko") == labels_for("en")
    d = date(2024, 5, 7)
    assert date_line(d, "ko") == date_line(d, "en")
    scene = Scene(first_seq=1, at=datetime(2024, 5, 7, 9, 0), who=("민수", "지영"))
    assert marker(scene, None, "ko") == marker(scene, None, "en")  # one script throughout


def test_recall_finds_a_korean_memory() -> None:
    """A Korean conversation end to end: detected as Korean, folded, and a question that points
    at the past in Korean is shown what memory holds, once."""
    kk, clock = layered()
    conv = kk.conversation("ko", system_prompt="당신은 미카입니다.")
    conv.prepare("내 생일은 삼월 십사일이고, 매년 딸기 케이크를 먹어.")
    conv.record("멋지네요. 기억해 둘게요.")
    for i in range(150):
        clock.advance(20)
        conv.prepare(f"오늘은 역 앞 카페에서 책을 읽고 돌아오는 길에 산책했어. {i}번째 이야기야.")
        conv.record(f"좋은 하루였네요. 저는 등대를 청소했어요. {i}")
        kk.worker.run_until_idle()
    assert kk.conversation("ko").lang == "ko"
    assert conv.info().raw_start > 2
    p = conv.prepare("내 생일이 언제였는지 기억나?")
    assert sum("삼월 십사일" in m.content for m in p.messages) == 1
    assert p.recall is not None and p.recall["cue"] == "기억나"
