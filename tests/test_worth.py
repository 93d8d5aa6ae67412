"""What a line tells that the rest of the conversation does not (`kioku.worth`): labelled cases
in several languages for the one measure the extractive chronicler keeps lines by."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import pytest

from kioku.memory import Memory, MemoryItem, render_memory
from kioku.messages import LogEntry, Message
from kioku.summarizer import ExtractiveSummarizer, Line, SummaryTask, select_lines
from kioku.tokens import ScriptEstimator
from kioku.worth import HABIT_TIMES, SaidCounts, said_key, usage_of

COUNTER = ScriptEstimator()
AT = datetime(2024, 3, 1, 20, 0)

# per language: a habit (said word for word again and again), a line said twice that tells
# something, lines said once, and a filler line said six times (a habit too)
CASES = {
    "en": {
        "habit": "I like the fog.",
        "twice": "The ferry to Otaru leaves at nine on Sunday.",
        "rare": "Grandpa rebuilt the lighthouse lantern.",
        "common": "Grandpa poured the coffee again.",
        "filler": "Grandpa drank the coffee slowly.",
    },
    "ja": {
        "habit": "霧が好きなんだ。",
        "twice": "日曜の九時に小樽行きのフェリーが出る。",
        "rare": "祖父が灯台のランプを修理した。",
        "common": "祖父がまたコーヒーを淹れた。",
        "filler": "祖父がコーヒーを飲んだ。",
    },
    "zh": {
        "habit": "我喜欢雾天气。",
        "twice": "星期天九点去小樽的渡轮出发。",
        "rare": "爷爷修好了灯塔的灯笼。",
        "common": "爷爷又倒了咖啡。",
        "filler": "爷爷慢慢喝咖啡。",
    },
    "ko": {
        "habit": "안개가 좋아요.",
        "twice": "일요일 아홉시에 오타루행 페리가 출발해요.",
        "rare": "할아버지가 등대 램프를 고쳤어요.",
        "common": "할아버지가 커피를 또 부었어요.",
        "filler": "할아버지가 커피를 마셨어요.",
    },
}
LANGS = sorted(CASES)


def _entries(texts: list[str]) -> list[LogEntry]:
    return [
        LogEntry(i, Message.of("user", t, author="Ren", at=AT), COUNTER.count(t))
        for i, t in enumerate(texts)
    ]


def _log(lang: str) -> list[LogEntry]:
    c = CASES[lang]
    said = [c["habit"]] * HABIT_TIMES + [c["twice"]] * 2 + [c["filler"]] * 6
    return _entries([*said, c["rare"], c["common"]])


def _lines(*texts: str) -> list[Line]:
    return [Line(i, "Ren", t) for i, t in enumerate(texts)]


@pytest.mark.parametrize("lang", LANGS)
def test_a_habit_is_never_kept_and_a_line_said_twice_is(lang: str) -> None:
    c = CASES[lang]
    usage = usage_of(_log(lang))
    assert usage.times(c["habit"]) == HABIT_TIMES and usage.worthless(c["habit"])
    picked = select_lines(_lines(c["habit"], c["twice"]), 500, COUNTER, lang=lang, usage=usage)
    assert [ln.text for ln in picked] == [c["twice"]]


@pytest.mark.parametrize("lang", LANGS)
def test_a_line_said_twice_tells_half_as_much_as_one_said_once(lang: str) -> None:
    c = CASES[lang]
    usage = usage_of(_log(lang))
    words = {"a", "b", "c", "d"}
    assert usage.worth(c["twice"], words) == usage.worth(c["rare"], words) / 2
    assert usage.worth(c["habit"], words) < usage.worth(c["twice"], words)
    assert not usage.worthless(c["twice"]) and not usage.worthless(c["rare"])


@pytest.mark.parametrize("lang", LANGS)
def test_a_line_memory_already_holds_is_not_kept_again(lang: str) -> None:
    c = CASES[lang]
    usage = usage_of(_log(lang)).keeping([c["rare"].upper() + "  "])  # folded alike
    picked = select_lines(_lines(c["rare"], c["twice"]), 500, COUNTER, lang=lang, usage=usage)
    assert [ln.text for ln in picked] == [c["twice"]]


@pytest.mark.parametrize("lang", LANGS)
def test_a_line_said_twice_in_one_range_is_kept_once(lang: str) -> None:
    c = CASES[lang]
    picked = select_lines(_lines(c["twice"], c["rare"], c["twice"]), 500, COUNTER, lang=lang)
    assert sorted(ln.text for ln in picked) == sorted([c["twice"], c["rare"]])


def test_a_line_is_the_same_line_whatever_its_case_spacing_or_punctuation() -> None:
    assert said_key("I like the fog.") == said_key("i like  the FOG!") == "i like the fog"
    assert said_key("霧が好きなんだ。") == said_key("霧が好きなんだ！")


def _item(first: int, last: int, text: str, lines: list[Line]) -> MemoryItem:
    return MemoryItem(
        "chapter",
        first,
        last,
        text,
        COUNTER.count(text),
        "extractive",
        data={"lines": [ln.to_json() for ln in lines]},
    )


def test_a_chapter_of_habits_and_held_lines_keeps_nothing_and_shows_no_heading() -> None:
    c = CASES["en"]
    log = _log("en")
    held = [Line(0, "Ren", c["rare"])]
    earlier = _item(0, 0, held[0].render(), held)
    chunk = _entries([c["habit"], c["rare"], "Ok!"])
    task = SummaryTask(
        "chapter",
        200,
        entries=tuple(LogEntry(len(log) + e.seq, e.message, e.tokens) for e in chunk),
        chapters=(earlier,),
        usage=usage_of([*log, *chunk]),
    )
    summary = ExtractiveSummarizer(COUNTER).summarize(task)
    assert summary.text == "" and summary.data["lines"] == []
    empty = _item(len(log), len(log) + 2, summary.text, [])
    shown = render_memory(Memory(chapters=(earlier, empty)))[0]
    assert shown.count("## ") == 1  # chapter 1's: the empty chapter has no heading
    assert c["rare"] in shown


@pytest.mark.parametrize("lang", LANGS)
def test_a_synopsis_written_before_its_line_became_a_habit_is_tidied_too(lang: str) -> None:
    from kioku.tidy import tidied

    c = CASES[lang]
    lines = [Line(0, "Ren", c["habit"]), Line(1, "Ren", c["rare"])]
    item = _item(0, 1, "\n".join(ln.render() for ln in lines), lines)
    synopsis = replace(item, kind="synopsis", id=3)
    t = tidied(synopsis, usage_of(_log(lang)), lang)
    assert t is not None and t.kind == "synopsis" and t.replaces == (3,)
    assert [ln["text"] for ln in t.data["lines"]] == [c["rare"]]


@pytest.mark.parametrize("lang", LANGS)
def test_a_chapter_written_before_its_line_became_a_habit_is_tidied_of_it(lang: str) -> None:
    from kioku.tidy import tidied, tidy_revisions

    c = CASES[lang]
    lines = [Line(0, "Ren", c["habit"]), Line(1, "Ren", c["rare"])]
    chapter = replace(_item(0, 1, "\n".join(ln.render() for ln in lines), lines), id=7)
    before = usage_of(_entries([c["habit"], c["rare"]]))
    assert tidied(chapter, before, lang) is None  # said once: no habit yet
    after = usage_of(_log(lang))
    t = tidied(chapter, after, lang)
    assert t is not None and t.replaces == (7,) and t.status == "ready"
    assert [ln["text"] for ln in t.data["lines"]] == [c["rare"]]
    assert c["habit"] not in t.text and c["rare"] in t.text and t.tokens <= chapter.tokens
    # one revision at a time: a chapter whose tidied copy waits for its fold is left alone
    assert tidy_revisions([chapter], [replace(t, id=8)], after, 0.0, lang) == []


def test_the_counts_kept_between_jobs_read_only_new_messages_until_an_edit() -> None:
    c = CASES["en"]
    log = _log("en")
    asked: list[int] = []

    def read(upto: int) -> Callable[[int], list[LogEntry]]:
        def entries(first: int) -> list[LogEntry]:
            asked.append(first)
            return [e for e in log[:upto] if e.seq >= first]

        return entries

    counts = SaidCounts()
    assert counts.usage("c", 0, read(2)).times(c["habit"]) == 2
    whole = counts.usage("c", 0, read(len(log)))
    assert asked == [0, 2]  # the second job read from where the first stopped
    assert whole.said == usage_of(log).said
    log[0] = LogEntry(0, Message.of("user", c["rare"], author="Ren", at=AT), 5)  # edited
    again = counts.usage("c", 1, read(len(log)))
    assert asked[-1] == 0 and again.said == usage_of(log).said
    assert again.times(c["habit"]) == HABIT_TIMES - 1


def test_a_conversation_begun_again_under_its_id_is_counted_afresh() -> None:
    c = CASES["en"]
    old, new = _log("en"), _entries([c["rare"]])
    counts = SaidCounts()
    assert counts.usage("c", (0, 1.0), lambda first: old[first:]).times(c["habit"]) == HABIT_TIMES
    # deleted and begun again: its revision starts over, its birth is another
    again = counts.usage("c", (0, 2.0), lambda first: new[first:])
    assert again.said == usage_of(new).said and again.times(c["habit"]) == 0
