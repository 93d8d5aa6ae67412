from __future__ import annotations

import pytest

from kioku.eval.answers import (
    ContextIndex,
    answer_in_context,
    answer_tokens,
    f1_score,
    locomo_f1,
    normalize,
)


def test_normalize_drops_case_punctuation_articles_and_possessives() -> None:
    assert normalize("The Adoption-Agency's, an OLD one!") == "adoption agency old one"
    assert answer_tokens("A cat") == ["cat"]
    assert answer_tokens("") == []


def test_every_token_must_be_in_the_context() -> None:
    ctx = "Caroline went to the LGBTQ support group on 7 May 2023."
    assert answer_in_context("LGBTQ support group", ctx)
    assert answer_in_context("7 May 2023", ctx)
    assert not answer_in_context("8 May 2023", ctx)
    assert not answer_in_context("support groups", ctx)  # whole words, no stemming
    assert not answer_in_context("", ctx)  # nothing to find is not a hit


def test_tokens_may_come_from_several_parts_of_the_context() -> None:
    assert answer_in_context("curry udon", "I love curry.", "Udon is fine too.")
    assert not answer_in_context("curry udon", "I love curry.")


def test_cjk_answers_match_inside_running_text() -> None:
    assert answer_in_context("函館", "私は函館の出身です。")
    assert answer_in_context("18", "「18歳です!」")
    assert not answer_in_context("18", "118歳です")
    assert answer_in_context("7月3日", "誕生日は7月3日です")
    assert ContextIndex("猫のコテツ").missing("コテツ 犬") == ["犬"]


def test_locomo_f1_follows_the_paper() -> None:
    assert f1_score("adoption agencies", "Adoption agency") == pytest.approx(1.0)
    assert f1_score("the beach", "beach") == 1.0
    assert f1_score("mountains", "beach") == 0.0
    # multi-hop: split on commas, each gold part takes its best predicted part
    assert locomo_f1("painting, hiking", "hiking, painting", 1) == 1.0
    assert locomo_f1("painting", "hiking, painting", 1) == 0.5
    # open-domain: the first alternative of the gold answer
    assert locomo_f1("yes", "yes; she likes it", 3) == 1.0
