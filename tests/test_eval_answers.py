from __future__ import annotations

import pytest

from kioku.eval.answers import (
    ContextIndex,
    answer_in_context,
    answer_items,
    answer_tokens,
    bag_of_words,
    f1_score,
    locomo_f1,
    match,
    normalize,
)

CTX = "Caroline went to the LGBTQ support group on 7 May 2023."


def test_normalize_drops_case_punctuation_articles_and_possessives() -> None:
    assert normalize("The Adoption-Agency's, an OLD one!") == "adoption agency old one"
    assert answer_tokens("A cat") == ["cat"]
    assert answer_tokens("") == []


def test_every_date_format_reads_the_same() -> None:
    same = "8 may 2023"
    assert normalize("8 May, 2023") == same
    assert normalize("2023-05-08") == same
    assert normalize("May 8th, 2023") == same
    assert normalize("1:56 pm on 8 May, 2023") == "1 56 pm on 8 may 2023"
    assert normalize("2023-13-40") == "2023 13 40"  # not a date: left alone
    assert answer_in_context("8 May 2023", "(#3–5, 2023-05-08)")


def test_the_strict_match_wants_the_phrase_in_order() -> None:
    assert answer_in_context("LGBTQ support group", CTX)
    assert answer_in_context("7 May 2023", CTX)
    assert answer_in_context("May 2023", CTX)
    assert not answer_in_context("8 May 2023", CTX)
    assert not answer_in_context("support groups", CTX)  # whole words, no stemming
    assert not answer_in_context("group support", CTX)  # every word there, not the phrase
    assert not answer_in_context("", CTX)  # nothing to find is not a hit


def test_spurious_bag_of_words_hits_are_not_strict() -> None:
    """The review's hand-checked false hits: words scattered over unrelated lines."""
    ctx = "Happy for you! You two must have had tough times. Let's meet at two."
    assert bag_of_words("two times", ctx)
    assert not answer_in_context("two times", ctx)
    m = match("two times", ctx)
    assert m.bag_of_words and not m.strict and m.f1 == 0.5


def test_a_vocabulary_is_not_a_context() -> None:
    """A context made of nothing but a conversation's words passed the old match."""
    lines = [
        "I went to a pottery class yesterday and made a bowl.",
        "My dog Bailey loves the beach near the mountains.",
        "We roast marshmallows and tell stories on camping trips.",
    ]
    vocabulary = " ".join(sorted({w for ln in lines for w in normalize(ln).split()}))
    for answer in ("pottery class", "roast marshmallows", "Bailey", "beach"):
        assert answer_in_context(answer, " ".join(lines))
    phrases = ("pottery class", "roast marshmallows", "tell stories")
    assert all(bag_of_words(a, vocabulary) for a in phrases)
    assert not any(answer_in_context(a, vocabulary) for a in phrases)


def test_list_answers_need_every_item_and_open_domain_the_first_alternative() -> None:
    ctx = "Her cats Oliver and Luna sleep while Bailey barks."
    assert answer_items("Oliver, Luna, and Bailey", 1) == ["oliver", "luna", "bailey"]
    assert answer_in_context("Oliver, Luna, and Bailey", ctx, 1)
    assert not answer_in_context("Oliver, Luna, and Bailey", ctx, 4)  # not a list there
    assert not answer_in_context("Oliver, Max", ctx, 1)
    assert match("Oliver, Max", ctx, 1).f1 == 0.5
    assert answer_items("Mozart; also Bach", 3) == ["mozart"]


def test_a_verdict_is_never_found_in_a_context() -> None:
    ctx = "Yes, likely, no idea. Yes!"
    for gold in ("Yes", "Likely no", "yes; it's classical music"):
        assert not match(gold, ctx, 3).strict
        assert match(gold, ctx, 3).f1 == 0.0


def test_window_f1_is_the_share_of_the_answer_found_together() -> None:
    m = match("red wooden kite", "a blue wooden kite flew. Red.")
    assert not m.strict and m.f1 == pytest.approx(2 / 3, abs=1e-4)
    ix = ContextIndex("a blue wooden kite flew")
    assert m.where is not None and "wooden kite" in ix.token_span(m.where)
    assert match("kite", "").f1 == 0.0
    assert match("x b c d e f", "c d").f1 == pytest.approx(2 * 2 / (2 + 6), abs=1e-4)


def test_bag_of_words_may_take_tokens_from_several_contexts() -> None:
    assert bag_of_words("curry udon", "I love curry.", "Udon is fine too.")
    assert not bag_of_words("curry udon", "I love curry.")


def test_cjk_answers_match_inside_running_text() -> None:
    assert answer_in_context("函館", "私は函館の出身です。")
    assert answer_in_context("18", "「18歳です!」")
    assert not answer_in_context("18", "118歳です")
    assert answer_in_context("7月3日", "誕生日は7月3日です")
    assert not answer_in_context("3日7月", "誕生日は7月3日です")
    assert ContextIndex("猫のコテツ").missing("コテツ 犬") == ["犬"]
    assert match("コテツ犬", "猫のコテツと犬").f1 == pytest.approx(0.75)


def test_locomo_f1_follows_the_paper() -> None:
    assert f1_score("adoption agencies", "Adoption agency") == pytest.approx(1.0)
    assert f1_score("the beach", "beach") == 1.0
    assert f1_score("mountains", "beach") == 0.0
    # multi-hop: split on commas, each gold part takes its best predicted part
    assert locomo_f1("painting, hiking", "hiking, painting", 1) == 1.0
    assert locomo_f1("painting", "hiking, painting", 1) == 0.5
    # open-domain: the first alternative of the gold answer
    assert locomo_f1("yes", "yes; she likes it", 3) == 1.0
