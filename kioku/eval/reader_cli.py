"""`kioku eval locomo --reader URL`: a real model answers each question from each arm's
prompt; the table (or JSON, or Markdown report) of what it got right."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from kioku.config import from_env
from kioku.errors import InputError
from kioku.eval.cli_shared import HEADLINE_DEFAULT, chat_model, conversations_of, emit, err, out


@dataclass(frozen=True)
class ReaderRun:
    url: str
    model_id: str | None
    questions: str
    time_on: bool
    judge_url: str | None
    judge_id: str | None
    categories: str | None = None  # --categories as typed; every category when None


def read(
    data: Path | None,
    budget: int,
    conversations: str,
    strategies: str,
    tokenizer: str,
    seed: int,
    chronicler_model: Any,
    reading: ReaderRun,
    as_json: bool,
    report: Path | None,
    plot: Path | None = None,
) -> None:
    """`kioku eval locomo --reader URL`: a real model answers from each arm's prompt."""
    from kioku.counters import counter_from_spec
    from kioku.eval import reader as rd
    from kioku.summarizer import ExtractiveSummarizer

    settings = from_env()
    if reading.questions.strip().lower() == "all":
        n = None
    else:
        try:
            n = int(reading.questions)
        except ValueError:
            raise InputError(
                f"--questions takes a number or all, not {reading.questions!r}"
            ) from None
    arms = (
        rd.READER_ARMS
        if strategies == HEADLINE_DEFAULT
        else tuple(s.strip() for s in strategies.split(",") if s.strip())
    )
    counter = counter_from_spec(tokenizer)
    summarizer: Any = ExtractiveSummarizer(counter)
    if chronicler_model is not None:
        from kioku.chronicler import LLMChronicler

        summarizer = LLMChronicler(chronicler_model, counter, fallback=summarizer)
    options = rd.ReaderOptions(
        budget=budget,
        conversations=conversations_of(conversations),
        arms=rd.check_arms(arms),
        tokenizer=tokenizer,
        questions=n,
        categories=(
            rd.categories_of(reading.categories) if reading.categories else tuple(rd.ALL_CATEGORIES)
        ),
        seed=seed,
        time_on=reading.time_on,
    )
    result = rd.run(
        data,
        options,
        reader=chat_model(reading.url, reading.model_id, settings),
        judge=chat_model(reading.judge_url, reading.judge_id, settings),
        summarizer=summarizer,
        counter=counter,
        log=lambda s: err.print(s, highlight=False),
    )
    if plot:
        from kioku.eval.plots import reader_by_age

        err.print(f"wrote {reader_by_age(result, plot)}", highlight=False)
    if report:
        from kioku.eval.report import markdown

        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(markdown(result), encoding="utf-8")
        err.print(f"wrote {report}", highlight=False)
    if as_json:
        emit(result)
        return
    table = Table("arm", "split", "F1 [95%]", "strict", "judge", *rd.THIRDS, "n")
    for arm, per in result["scores"].items():
        for split, d in per.items():
            table.add_row(
                arm,
                split,
                interval(d["f1"]),
                interval(d["strict"]),
                interval(d["judge"]) if "judge" in d else "–",
                *(interval(d["by_age"][t]["f1"]) if t in d["by_age"] else "–" for t in rd.THIRDS),
                str(d["f1"]["n"]),
            )
    out.print(table)


def interval(ci: Mapping[str, Any]) -> str:
    if ci.get("mean") is None:
        return "–"
    return f"{ci['mean']:.2f} [{ci['lo']:.2f}–{ci['hi']:.2f}]"
