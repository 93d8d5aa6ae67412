"""The labelled cases the rules are measured on, and how each is run (`tests/test_cases.py`).

`need.jsonl`: a message, what the prompt already holds, and whether the past is wanted: `cue`
(the words that point at it, "" for none), `about` (whom a question asks about, "" for no
one), `wants` (the message gives evidence the past is wanted), and `rule`, the rule expected
to decide it. `grounding.jsonl`: a line a model wrote, what it cites (each message as the
chronicler read it), the verdict (`ok` or a reason of `kioku.grounding.check.REASONS`) and
`rule`. Each case says its `lang` and `source` (`fixture:<log>` for a real small model's
reply, `locomo` or `realpersonachat` for a dataset's own question, `hand` for written here).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kioku.bench.judge import case_evidence, case_statement, load_cases
from kioku.grounding.check import Verdict
from kioku.recall import need
from kioku.salience import asks as asks_something

HERE = Path(__file__).parent


def cases(name: str) -> Iterator[dict[str, Any]]:
    """The cases of `name.jsonl` and of its built part (`name.<source>.jsonl`)."""
    return load_cases(sorted(HERE.glob(f"{name}*.jsonl")))


@dataclass(frozen=True)
class Outcome:
    rule: str  # the rule that decided it
    got: dict[str, Any]  # what the code said, for the fields the case labels
    want: dict[str, Any]

    @property
    def right(self) -> bool:
        return all(self.got.get(k) == v for k, v in self.want.items())


# --- recall by need -------------------------------------------------------------------------


def need_outcome(case: dict[str, Any]) -> Outcome:
    text, lang = case["message"], case["lang"]
    held = set(case.get("holds", []))
    asks = case.get("asks", asks_something(text))
    said = need.cue(text, lang)
    whom = need.about(text, lang) if asks else ""
    unheld = need.pointer(text, lang, lambda n: n in held) if not said else ""
    worded = said
    told = False
    if said and asks:
        asked = " ".join(need._asked(text))
        if need._by_tense_alone(text, said) and not whom:
            worded = ""
        elif not need.cue(asked, lang):
            worded, told = "", True
    got = {"cue": said, "about": whom, "wants": bool(worded or whom or unheld)}
    want = {k: case[k] for k in ("cue", "about", "wants") if k in case}
    return Outcome(_need_rule(text, lang, said, worded, told, whom, unheld), got, want)


def _need_rule(
    text: str, lang: str, said: str, worded: str, told: bool, whom: str, unheld: str
) -> str:
    if worded:  # the language whose words matched, tried as `need.cue` tries them
        for code in (lang, *(c for c in need._CUES if c != lang)):
            m = need._CUES[code].search(text.strip()) if code in need._CUES else None
            if m and m.group(0) == said:
                return f"cue:{code}"
    if whom:
        if need._HONORIFIC.fullmatch(whom):
            return "name:honorific"
        if any(p.fullmatch(whom) for p in need._HONORIFICS_BY_LANG.values()):
            return "name:title"
        return "name:capitalized"
    if said and told:
        return "cue:told, not asked"
    if said:
        return "cue:tense at hand"
    if unheld:
        return "name:not in the prompt"
    named = need.names(text)
    if named or need._NAME.search(text):
        spoken = set(need._VOCATIVE.findall(text))
        if spoken and all(n in spoken for n in named):
            return "name:spoken to"
        if not named:
            return "name:day or month"
        return "name:in the prompt"
    return "none"


# --- grounding ------------------------------------------------------------------------------


def verdict(case: dict[str, Any]) -> Verdict:
    return case_evidence(case).check(case_statement(case))


def grounding_outcome(case: dict[str, Any]) -> Outcome:
    v = verdict(case)
    got = v.reason or "ok"
    return Outcome(
        got if got != "ok" else "grounded", {"verdict": got}, {"verdict": case["verdict"]}
    )
