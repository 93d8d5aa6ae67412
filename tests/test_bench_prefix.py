"""`kioku bench prefix`'s per-turn arithmetic (`Tally`): what a turn prefills beyond its own new
message and the previous reply, which turns carried recollections, and the cache breaks the
recollections made, on token lists small enough to follow by hand."""

from __future__ import annotations

from kioku.bench.prefix import Tally


def test_a_turn_prefills_its_message_and_nothing_more_until_recall_or_a_fold() -> None:
    t = Tally(budget=100)
    head = list(range(40))
    t.add(head + [1, 2], [7, 7], 10, memory_version=1, own=2, reply=2)  # cold: all of it
    # the next turn: the cached prompt and reply, then its own message (2 tokens)
    second = head + [1, 2, 7, 7, 3, 3]
    t.add(second, [], 10, memory_version=1, own=2, reply=0)
    # a turn shown 5 tokens of recollections after its message: 5 beyond its own
    third = second + [4, 4, 9, 9, 9, 9, 9]
    t.add(third, [6], 10, memory_version=1, own=2, reply=1, recalled=True)
    assert t.overhead == [40, 0, 5]
    s = t.summary()
    assert s["prefill_overhead"] == {"p50": 5, "p95": 40, "mean": 15.0}
    assert s["recall_turns"] == round(1 / 3, 4) and t.recall_breaks == 0


def test_recollections_that_break_the_prefix_without_a_fold_are_recall_breaks() -> None:
    t = Tally(budget=1000)
    t.add(list(range(20)), [], 10, memory_version=2, own=20)  # cold: a break of its own
    # most of the prompt is new, memory unchanged: the recollections broke the cache
    t.add(list(range(20)) + list(range(100, 160)), [], 10, memory_version=2, recalled=True)
    assert t.breaks == 2 and t.recall_breaks == 1
    # a fold (memory version moves) breaks it too, but that is the fold's
    t.add(list(range(500, 600)), [], 10, memory_version=3, recalled=True)
    assert t.breaks == 3 and t.recall_breaks == 1


def test_fresh_tokens_are_what_a_one_slot_engine_evaluates_without_the_reply() -> None:
    """`--time-on` asks for one token, so the engine holds the previous prompt, not its reply:
    the reply counts as fresh on the next turn; a fold's turn is counted apart, and `full`
    starts at the first cache break after the cold start."""
    t = Tally(budget=1000)
    head = list(range(100))
    t.add(head, [7, 7], 10, memory_version=0)  # cold: 100 fresh
    second = head + [7, 7, 1, 1]  # the reply (2) and the new message (2)
    t.add(second, [8], 10, memory_version=0)
    folded = list(range(10)) + list(range(500, 560))  # memory changed after 10 tokens
    t.add(folded, [], 10, memory_version=1)
    t.add(folded + [8, 3], [], 10, memory_version=1)
    assert t.fresh == [100, 4, 60, 2]
    s = t.summary()
    assert s["fresh_tokens_total"] == 166
    assert s["fold_turns"] == 1 and s["fresh_tokens_per_fold"] == 60.0
    # from the fold on: 60 and 2
    assert s["fresh_tokens_p50_full"] == 2 and s["fresh_tokens_p90_full"] == 60
    assert s["fresh_tokens_p90"] == 100


def test_a_joined_turn_is_dated_by_its_last_part() -> None:
    """The same speaker closes one session and opens the next a week later: the two messages
    are one turn, sent when the second was written, so the news it opens with ("yesterday") is
    counted from that day, not from the farewell's."""
    from datetime import datetime

    from kioku.bench.prefix import turns_of
    from kioku.datasets import Transcript
    from kioku.messages import Message
    from kioku.recall.recollection import RecalledLine, Recollection

    may1, may8 = datetime(2023, 5, 1, 18), datetime(2023, 5, 8, 9)
    t = Transcript(
        messages=(
            Message.of("user", "How was the fair?", author="Ann", at=may1),
            Message.of("assistant", "Lovely. Talk soon!", author="Bo", at=may1),
            Message.of("assistant", "Hi Ann! Yesterday I flew my new kite.", author="Bo", at=may8),
            Message.of("user", "Wow, where?", author="Ann", at=may8),
        ),
        meta=({},) * 4,
    )
    (_, (closing,)), ((opening,), _) = turns_of(t)
    assert closing.text == "Lovely. Talk soon!\nHi Ann! Yesterday I flew my new kite."
    assert closing.at == may8 and opening.at == may8
    line = RecalledLine(1, closing.author, closing.text, closing.at)
    assert "Yesterday (7 May 2023) I flew" in Recollection(1, 1, 1.0, (line,)).text
