"""`kioku bench …`: the benchmarks, each a `run(...) -> dict` of its own module, printed as an
outline for people or JSON with `--json`. `kioku.service.cli` adds `bench serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kioku import terminal
from kioku.cli_options import (
    FORMATS,
    DataOpt,
    JsonOpt,
    LegacyMaxMessagesOpt,
    LocomoOpt,
    MessagesOpt,
    ReplayProfileOpt,
    SpeakerOpt,
    SummaryTimeoutOpt,
    TemperatureOpt,
    WindowOpt,
    either,
)
from kioku.terminal import emit

bench_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Benchmarks: a summary for people, the full result with --json.",
)


@bench_app.command("prefix")
def bench_prefix(
    data: DataOpt = None,
    fmt: Annotated[str, typer.Option("--format", help=FORMATS + ".")] = "realpersonachat",
    speaker: SpeakerOpt = None,
    conversation: LocomoOpt = 0,
    profile: ReplayProfileOpt = "local-64k",
    window: WindowOpt = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", help="Only the first N turns.")
    ] = None,
    messages: MessagesOpt = None,
    legacy_max_messages: LegacyMaxMessagesOpt = None,
    via: Annotated[
        str,
        typer.Option(
            "--via",
            help="process: the engine in this process; serve: a real `kioku serve` over HTTP "
            "(stateless and stateful clients) beside it.",
        ),
    ] = "process",
    layers: Annotated[
        bool,
        typer.Option(
            "--layers/--no-layers",
            help="Recall, notes and the tic guard on (as shipped) or off (the ablation).",
        ),
    ] = True,
    time_on: Annotated[
        str | None,
        typer.Option(
            "--time-on",
            help="An OpenAI-compatible API root (a llama.cpp server's …/v1): after the replay, "
            "time kioku's prompts and the sliding window's on it (max_tokens 1, one arm after "
            "the other), as prefill_time.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Prefix-cache reuse and window use of kioku's prompts against sliding window,
    summary-in-system and immediate fold, replayed on a real tokenizer.

    Example: kioku bench prefix --format locomo --conversation 0 --profile local-8k --via serve
    """
    from kioku.bench.prefix import run

    _result(
        run(
            data,
            fmt,
            speaker=speaker,
            conversation=conversation,
            profile=profile,
            window=window,
            max_turns=max_turns,
            max_messages=either(messages, legacy_max_messages),
            via=via,
            layers=layers,
            time_on=time_on,
        ),
        as_json,
    )


@bench_app.command("turn")
def bench_turn(
    sizes: Annotated[
        str, typer.Option("--sizes", help="History lengths to time, comma-separated.")
    ] = "500,5000,50000",
    as_json: JsonOpt = False,
) -> None:
    """prepare() time against history length (and the naive load-all baseline).

    Example: kioku bench turn --sizes 500,5000,50000 --json
    """
    from kioku.bench.turn import run
    from kioku.errors import InputError

    try:
        picked = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--sizes takes numbers like 500,5000, not {sizes!r}") from None
    _result(run(picked), as_json)


@bench_app.command("tokens")
def bench_tokens(
    turns: Annotated[
        int, typer.Option("--calibration-turns", help="Turns the estimate calibrates on.")
    ] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Calibrated token estimator against a real tokenizer, per language.

    Example: kioku bench tokens --json
    """
    from kioku.bench.tokens import run

    _result(run(calibration_turns=turns), as_json)


@bench_app.command("recall")
def bench_recall(
    data: DataOpt = None,
    scale: Annotated[
        int | None, typer.Option("--scale", help="Time search at N archived messages instead.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Archive recall on LoCoMo (evidence recall@k), or speed at --scale N messages.

    Example: kioku bench recall --data ../shared/datasets/locomo/locomo10.json --json
    """
    from kioku.bench.recall import run

    if data is not None:
        from kioku.datasets import check_file

        check_file(data)
    _result(run(data, scale), as_json)


@bench_app.command("chronicle")
def bench_chronicle(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="OpenAI-compatible base URL of the chronicler (env KIOKU_SUMMARIZER_URL, then "
            "KIOKU_LLM_URL); without one, only the extractive chronicler runs.",
        ),
    ] = None,
    model_id: Annotated[
        str | None, typer.Option("--model-id", help="Model name to request.")
    ] = None,
    span: Annotated[
        list[str] | None,
        typer.Option(
            "--span",
            help="locomo:<conversation>:<messages> or realpersonachat:<speaker>:<messages> "
            "(repeatable; default locomo:0:141 and realpersonachat:CP:297).",
        ),
    ] = None,
    profile: ReplayProfileOpt = "local-8k",
    window: WindowOpt = None,
    summary_timeout: SummaryTimeoutOpt = None,
    temperature: TemperatureOpt = None,
    n_samples: Annotated[
        int, typer.Option("--samples", help="Stored lines shown next to their sources.")
    ] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Which lines are sampled.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON here.")] = None,
    replies: Annotated[
        Path | None,
        typer.Option("--replies", help="Append every request and reply here (JSONL)."),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            help="Answer each request with the reply a --replies file kept for it, in the "
            "place of a model (a request it lacks gets an empty reply: counted in `replayed`).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The LLM chronicler on fixed spans: grounded share, lines dropped by reason, fallbacks,
    seconds and tokens per chapter, and strict answer-in-context for the LoCoMo questions whose
    evidence is in the span (LLM chapters vs extractive vs the span itself).

    Example: kioku bench chronicle --model http://127.0.0.1:8080/v1 --json --out chronicle.json
    """
    import json

    from kioku.bench.chronicle import DEFAULT_SPANS, Span, run
    from kioku.errors import InputError
    from kioku.reply_log import Replayed
    from kioku.summarize_cli import chronicler, chronicler_settings, err_console, token_counter

    if replay is not None and model is not None:
        raise InputError("--replay answers in the model's place: give --replay or --model")
    replayed = Replayed(replay) if replay is not None else None
    s = chronicler_settings(profile, window, model, model_id, summary_timeout, temperature)
    spans = [Span.parse(x) for x in span] if span else list(DEFAULT_SPANS)
    result = run(
        chronicler(s, replies, replayed),
        token_counter(s),
        s.profile_obj,
        spans=spans,
        model=f"replay of {replay}" if replay is not None else s.chronicler_url or "",
        n_samples=n_samples,
        seed=seed,
        console=err_console(),
    )
    if replayed is not None:
        result["replayed"] = replayed.to_json()
    if out is not None:
        out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    _result(result, as_json)


@bench_app.command("stuck")
def bench_stuck(
    data: DataOpt = None,
    fmt: Annotated[str, typer.Option("--format", help=FORMATS + ".")] = "locomo",
    speaker: SpeakerOpt = None,
    conversation: LocomoOpt = 0,
    profile: ReplayProfileOpt = "local-8k",
    window: WindowOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A conversation replayed while no summary ever comes (a chapter job held by a worker that
    never finishes, no worker running): failed turns and memory at its largest.

    Example: kioku bench stuck --format locomo --conversation 7 --window 3072 --json
    """
    from kioku.bench.stuck import run

    _result(
        run(
            data,
            fmt,
            speaker=speaker,
            conversation=conversation,
            profile=profile,
            window=window,
        ),
        as_json,
    )


@bench_app.command("judge")
def bench_judge(
    cases: Annotated[
        list[Path] | None,
        typer.Option("--cases", help="Grounding cases (JSONL; default tests/cases/grounding*)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="OpenAI-compatible base URL of a model to ask yes or no per line, measured "
            "beside the word reader and the n-grams.",
        ),
    ] = None,
    model_id: Annotated[
        str | None, typer.Option("--model-id", help="Model name to request.")
    ] = None,
    shares: Annotated[
        str, typer.Option("--ngram-shares", help="N-gram judges to measure, by their share.")
    ] = "0.6,0.7",
    as_json: JsonOpt = False,
) -> None:
    """Judges of content support on the labelled grounding cases: precision and recall of
    "dropped", accuracy, per language, on the content cases and on all.

    Example: kioku bench judge --model http://127.0.0.1:8080/v1 --json
    """
    from kioku.bench.judge import run, with_threshold
    from kioku.errors import InputError
    from kioku.grounding.check import WORD_READER, Judge
    from kioku.grounding.ngrams import Ngrams

    try:
        picked = [float(x) for x in shares.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--ngram-shares takes shares like 0.6,0.7, not {shares!r}") from None
    judges: list[Judge] = [WORD_READER, *(with_threshold(Ngrams(), x) for x in picked)]
    if model is not None:
        from kioku.client import OpenAIChatModel
        from kioku.grounding.asked import Asked

        judges.append(Asked(OpenAIChatModel(model, model=model_id)))
    _result(run(cases, judges), as_json)


def _result(data: Any, as_json: bool) -> None:
    """A benchmark's result: JSON for scripts, an indented outline for people."""
    if as_json:
        emit(data)
    else:
        terminal.text("\n".join(terminal.outline(data)))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
