"""Every rule earns its keep on labelled cases (`tests/cases/`): the whole corpus runs, and a
table says, per rule, how many cases it decides and how many it gets wrong.

A case is wrong when what the code says (the verdict, the cue, whom a message asks about,
whether it wants the past, and the rule that decided) differs from its label. A case marked
`known` is one the rules get wrong today, said so in the corpus with why: it is counted, not
failed, and it fails once the rules get it right (then its label moves). Any other wrong case
fails the test. Floors (issue 44): 300 cases, 60 not English, 40 in each language kioku
claims, and at least three for every rule.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest

from kioku.grounding.check import REASONS
from kioku.lang import LANGS
from tests.cases.corpus import Outcome, cases, grounding_outcome, need_outcome

NEED_RULES = (
    *(f"cue:{x}" for x in ("en", "ja", "zh", "ko")),
    "cue:tense at hand",
    "cue:told, not asked",
    "name:capitalized",
    "name:honorific",
    "name:title",
    "name:spoken to",
    "name:day or month",
    "name:in the prompt",
    "name:not in the prompt",
    "none",
)
GROUNDING_RULES = (*REASONS, "grounded")


def _run() -> list[tuple[str, dict[str, Any], Outcome]]:
    out = [("need", c, need_outcome(c)) for c in cases("need")]
    out += [("grounding", c, grounding_outcome(c)) for c in cases("grounding")]
    return out


@pytest.fixture(scope="module")
def run() -> list[tuple[str, dict[str, Any], Outcome]]:
    return _run()


def _right(case: dict[str, Any], o: Outcome) -> bool:
    return o.right and o.rule == case["rule"]


def test_every_case_is_decided_as_labelled_and_the_table_says_per_rule(
    run: list[tuple[str, dict[str, Any], Outcome]],
) -> None:
    decided: Counter[str] = Counter()
    wrong: Counter[str] = Counter()
    known: Counter[str] = Counter()
    langs: dict[str, Counter[str]] = defaultdict(Counter)
    failures = []
    for corpus, case, o in run:
        rule = f"{corpus} {case['rule']}"
        decided[rule] += 1
        langs[rule][case["lang"]] += 1
        if _right(case, o):
            if case.get("known"):
                failures.append(f"{case['id']}: now right, drop its `known` ({case['known']})")
            continue
        wrong[rule] += 1
        if case.get("known"):
            known[rule] += 1
        else:
            failures.append(
                f"{case['id']}: {case.get('message') or case.get('line')!r} "
                f"got {o.got} by {o.rule!r}, labelled {o.want} by {case['rule']!r}"
            )
    print(f"\n{'rule':32} {'cases':>5} {'wrong':>5} {'known':>5}  languages")
    for rule in sorted(decided):
        ls = " ".join(f"{k}:{v}" for k, v in sorted(langs[rule].items()))
        print(f"{rule:32} {decided[rule]:5} {wrong[rule]:5} {known[rule]:5}  {ls}")
    print(f"{'all':32} {sum(decided.values()):5} {sum(wrong.values()):5} {sum(known.values()):5}")
    assert not failures, "\n".join(failures)


def test_the_corpus_meets_its_floors(run: list[tuple[str, dict[str, Any], Outcome]]) -> None:
    by_lang = Counter(case["lang"] for _, case, _ in run)
    assert len(run) >= 300
    assert sum(n for lang, n in by_lang.items() if lang != "en") >= 60
    assert all(by_lang[lang] >= 40 for lang in LANGS), by_lang
    rules = Counter(f"{corpus} {case['rule']}" for corpus, case, _ in run)
    assert set(rules) <= {f"need {r}" for r in NEED_RULES} | {
        f"grounding {r}" for r in GROUNDING_RULES
    }
    thin = [
        r
        for r in (*(f"need {x}" for x in NEED_RULES), *(f"grounding {x}" for x in GROUNDING_RULES))
        if rules[r] < 3
    ]
    assert not thin, f"rules with fewer than three cases: {thin}"
