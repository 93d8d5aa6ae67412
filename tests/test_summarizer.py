"""The extractive chronicler: readable chapters (no scrapbook), scenes, dates, synopses."""

from __future__ import annotations

from datetime import datetime, timedelta

from kioku.generations import item_from_summary
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry, Message
from kioku.salience import carries_nothing
from kioku.scenes import scenes
from kioku.summarizer import ExtractiveSummarizer, SummaryTask, parse_lines
from kioku.tokens import ScriptEstimator

COUNTER = ScriptEstimator()
DAY1 = datetime(2022, 8, 2, 9, 30)


def entry(seq: int, text: str, author: str, at: datetime | None, **meta: object) -> LogEntry:
    role = "assistant" if author == "CP" else "user"
    m = Message.of(role, text, author=author, at=at)  # type: ignore[arg-type]
    return LogEntry(seq, m, COUNTER.count(text), dict(meta))


def test_lines_that_carry_nothing_out_of_context_are_dropped() -> None:
    for line in [
        "はい、またー！",
        "…アレですよ、アレ！",
        "あなたは？",
        "そうなんですね。",
        "Haha, yeah!",
        "What about you?",
        "(12)",
        "Hey Melanie!",
        "Thanks, Caroline!",
        "Hi there~",
    ]:
        assert carries_nothing(line, "ja"), line
    for line in [
        "近くのプールが1回200円なんですよ。",
        "I went to a support group yesterday.",
        "Hey Mel, I went to a support group yesterday.",
        "Thanks, Caroline! The kids loved the pottery class.",
    ]:
        assert not carries_nothing(line, "ja"), line
    es = [
        entry(0, "おはようございます！よろしくお願いします。", "AC", DAY1),
        entry(1, "おはようございます！　こちらこそよろしくお願いします。", "CP", DAY1),
        entry(2, "どちらにお住まいですか？", "AC", DAY1),
        entry(3, "九州です。近くのプールが1回200円なので、週に3回泳いでいます。", "CP", DAY1),
        entry(4, "…アレですよ、アレ！", "AC", DAY1),
        entry(5, "はい、またー！", "AC", DAY1),
    ]
    s = ExtractiveSummarizer(COUNTER).summarize(SummaryTask("chapter", 400, tuple(es), lang="ja"))
    kept = {ln.seq for ln in parse_lines(s.text)}
    assert kept == {3}, s.text


def test_a_chapter_marks_scenes_with_their_date_and_who_talks() -> None:
    day2 = DAY1 + timedelta(days=1)
    es = [
        entry(0, "I adopted a puppy named Biscuit yesterday.", "Ren", DAY1, dialogue_id=1),
        entry(1, "My sister Hanako lives in Osaka.", "CP", DAY1, dialogue_id=1),
        # the next dialogue, back to back on the same day, with another partner
        entry(
            2,
            "I run a small bakery near the station.",
            "AC",
            DAY1.replace(minute=45),
            dialogue_id=2,
        ),
        entry(
            3,
            "I swim three times a week at the city pool.",
            "CP",
            DAY1.replace(minute=46),
            dialogue_id=2,
        ),
        entry(4, "The festival fireworks start at eight tonight.", "AC", day2, dialogue_id=3),
        entry(5, "I will watch the fireworks from the river bank.", "CP", day2, dialogue_id=3),
    ]
    assert [sc.first_seq for sc in scenes(es)] == [0, 2, 4]
    s = ExtractiveSummarizer(COUNTER).summarize(SummaryTask("chapter", 400, tuple(es)))
    lines = s.text.splitlines()
    assert lines[0].startswith(
        "— 2 August 2022 · Ren, CP — [0] Ren: I adopted a puppy named Biscuit yesterday (1 August 2022)."
    )
    assert lines[2].startswith("— 2 August 2022 09:45 · AC, CP — [2] AC:")
    assert lines[4].startswith("— 3 August 2022 — [4] AC:")  # same people: the date says it
    assert [ln.seq for ln in parse_lines(s.text)] == [0, 1, 2, 3, 4, 5]  # markers are not lines
    assert s.data["lines"][0]["date"] == "2022-08-02" and len(s.data["scenes"]) == 3


def test_facts_go_first_when_the_range_is_cut_under_pressure() -> None:
    filler = [
        entry(
            i,
            f"The harbour boats number {i} sailed past the lighthouse and the gulls followed them home.",
            "Ren",
            DAY1,
        )
        for i in range(30)
    ]
    planted = entry(30, "My sister is Hanako and I promise to visit her in March.", "Ren", DAY1)
    es = tuple(filler[:15] + [planted] + filler[15:])
    s = ExtractiveSummarizer(COUNTER).summarize(SummaryTask("cut", 60, es))
    assert "[30] Ren: My sister is Hanako" in s.text


def test_a_synopsis_keeps_a_share_for_the_oldest_part_and_its_dates() -> None:
    ex = ExtractiveSummarizer(COUNTER)
    items = []
    for k in range(4):
        day = DAY1 + timedelta(days=7 * k)
        es = tuple(
            entry(
                100 * k + i,
                f"Week {k} topic {i}: the {['tea', 'kite', 'boat', 'lamp'][k]} number {i} was {['red', 'blue', 'green', 'gold'][i % 4]}.",
                "Ren",
                day,
            )
            for i in range(100)
        )
        task = SummaryTask("chapter", 300, es)
        items.append(item_from_summary(task, ex.summarize(task), ready_at=0.0))
    old, *new = items
    syn = ex.summarize(SummaryTask("synopsis", 240, previous=old, chapters=tuple(new)))
    seqs = [ln.seq for ln in parse_lines(syn.text)]
    # the previous synopsis covers a quarter of the messages: it keeps about a quarter of the room
    assert any(q < 100 for q in seqs) and any(q >= 300 for q in seqs)
    assert "2 August 2022" in syn.text and "23 August 2022" in syn.text
    item = item_from_summary(
        SummaryTask("synopsis", 240, previous=old, chapters=tuple(new)), syn, ready_at=0.0
    )
    assert item.data["period"] == ["2022-08-02", "2022-08-23"]
    shown, _ = render_memory(Memory(synopsis=item), "en")
    assert "## ⟦Synopsis (#0–399, 2 August 2022 – 23 August 2022)⟧" in shown
