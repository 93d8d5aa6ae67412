"""`kioku bench judge`: judges of content support measured on the labelled grounding cases.

A case (`tests/cases/grounding*.jsonl`) is a model's line, the messages it cites (each as the
chronicler read it), the verdict (`ok` or a reason of `kioku.grounding.check.REASONS`) and the
rule expected to decide it. Each judge (`kioku.grounding.check.Judge`) is put in the evidence's
place for content support and the whole check runs; the positive class is a line that must be
dropped (a verdict other than `ok`). Two subsets:

- `content`: the cases whose deciding rule is `grounded` or `unsupported`, the only ones where
  a judge is asked and its answer decides. The rules before it (`seq`, `prompt`, `name`,
  `author`, `empty`) decide the rest before any judge is asked, the same for every judge.
- `all`: every case, through the rules and then the judge: what the check as a whole gets.

Per judge and subset: cases, tp/fp/fn/tn, precision and recall of "dropped", accuracy, the same
per language, and the ids it gets wrong. `--model URL` adds the chronicler's own model asked
yes or no per line (`kioku.grounding.asked`), with how many answers were unclear.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import kioku
from kioku.errors import InputError
from kioku.grounding.check import WORD_READER, Evidence, Judge, Piece, Source, Statement
from kioku.grounding.ngrams import Ngrams
from kioku.grounding.terms import EMPTY_PROMPT, PromptText

CONTENT_RULES = ("grounded", "unsupported")
DEFAULT_CASES = Path(kioku.__file__).parent.parent / "tests" / "cases"


def default_paths() -> list[Path]:
    return sorted(DEFAULT_CASES.glob("grounding*.jsonl"))


def load_cases(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """The cases of each JSONL file, each with an `id` (`file:line`) unless it has one."""
    for path in paths:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                case = json.loads(line)
                case.setdefault("id", f"{path.name}:{i + 1}")
                yield case


def case_source(s: dict[str, Any]) -> Source:
    if "pieces" in s:
        pieces = tuple(Piece(*p) for p in s["pieces"])
    else:
        pieces = (Piece(s.get("kind", "text"), s.get("speaker", s["author"]), s["text"]),)
    day = date.fromisoformat(s["day"]) if s.get("day") else None
    return Source(s["seq"], s["author"], s.get("role", "user"), pieces, day)


def case_evidence(case: dict[str, Any], judge: Judge = WORD_READER) -> Evidence:
    sources = {s["seq"]: case_source(s) for s in case["sources"]}
    texts = [p.text for s in sources.values() for p in s.pieces]
    prompt = (
        PromptText.of(case["prompt"], texts + [case.get("memory", "")])
        if case.get("prompt")
        else EMPTY_PROMPT
    )
    return Evidence(
        sources,
        case["lang"],
        tuple(case.get("users", [])),
        tuple(case.get("characters", [])),
        case.get("memory", ""),
        prompt,
        judge=judge,
    )


def case_statement(case: dict[str, Any]) -> Statement:
    return Statement(
        case.get("kind", "line"),
        case["line"],
        tuple(case.get("seqs", [])),
        case.get("author"),
        case.get("subject"),
        case.get("verbatim", False),
        case.get("span_wide", False),
    )


def figures(rows: Sequence[tuple[str, bool, bool]]) -> dict[str, Any]:
    """Precision and recall of "dropped" over (lang, labelled dropped, judged dropped) rows."""
    tp = sum(want and got for _, want, got in rows)
    fp = sum(got and not want for _, want, got in rows)
    fn = sum(want and not got for _, want, got in rows)
    tn = len(rows) - tp - fp - fn
    return {
        "cases": len(rows),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": round(tp / (tp + fp), 3) if tp + fp else None,
        "recall": round(tp / (tp + fn), 3) if tp + fn else None,
        "accuracy": round((tp + tn) / len(rows), 3) if rows else None,
    }


def measure(judge: Judge, cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The judge's figures on both subsets: each case is checked once."""
    judged = [(c, not case_evidence(c, judge).check(case_statement(c)).ok) for c in cases]
    out: dict[str, Any] = {}
    for subset in ("content", "all"):
        picked = [(c, got) for c, got in judged if subset == "all" or c["rule"] in CONTENT_RULES]
        rows = [(c["lang"], c["verdict"] != "ok", got) for c, got in picked]
        langs = sorted({lang for lang, _, _ in rows})
        out[subset] = {
            **figures(rows),
            "by_lang": {x: figures([r for r in rows if r[0] == x]) for x in langs},
            "wrong": [
                f"{c['id']} ({c['lang']}): {c['line'][:60]}"
                for c, got in picked
                if got != (c["verdict"] != "ok")
            ],
        }
    return out


def run(
    paths: Sequence[Path] | None = None,
    judges: Sequence[Judge] | None = None,
) -> dict[str, Any]:
    picked = list(paths) if paths else default_paths()
    if not picked:
        raise InputError(f"no grounding cases under {DEFAULT_CASES}: give --cases FILE")
    cases = list(load_cases(picked))
    result: dict[str, Any] = {
        "corpus": [str(p) for p in picked],
        "cases": len(cases),
        "content_cases": sum(c["rule"] in CONTENT_RULES for c in cases),
        "positive": "dropped: a verdict other than ok",
        "judges": {},
    }
    for judge in judges or (WORD_READER, Ngrams()):
        result["judges"][judge.name] = measure(judge, cases)
        for counter in ("asked", "unclear", "version"):
            if hasattr(judge, counter):
                result["judges"][judge.name][counter] = getattr(judge, counter)
    return result


def with_threshold(judge: Ngrams, share: float) -> Ngrams:
    return replace(judge, min_share=share, name=f"ngrams@{share:g}")
