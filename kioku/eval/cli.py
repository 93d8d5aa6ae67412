"""`kioku eval …` and `kioku demo`: thin commands over `kioku.eval` and `kioku.demo`.

Each command reads its options, calls one library function, prints JSON (`--json`) or a short
table, and writes the PNG / Markdown it was asked for. Progress goes to stderr.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from kioku.cli_options import (
    DataOpt,
    DbOpt,
    LegacyIndexOpt,
    LocomoOpt,
    MessagesOpt,
    ReplayProfileOpt,
    ReplyTimeoutOpt,
    SpeakerOpt,
    TenantOpt,
    WindowOpt,
    either,
)
from kioku.config import from_env
from kioku.errors import InputError
from kioku.eval.cli_shared import HEADLINE_DEFAULT, chat_model, conversations_of, emit, err, out
from kioku.eval.reader_cli import ReaderRun, read

if TYPE_CHECKING:
    from kioku.eval.locomo import Models, Options

eval_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Measure forgetting: the forgetting curve, the LoCoMo proxy, the memory audit.",
)


FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", help="kioku, sillytavern, locomo, realpersonachat or story (built in)."
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="OpenAI-compatible base URL (env KIOKU_LLM_URL).")
]
ModelIdOpt = Annotated[
    str | None, typer.Option("--model-id", help="Model name to request (env KIOKU_LLM_MODEL).")
]
JudgeOpt = Annotated[
    str | None, typer.Option("--judge-model", help="Base URL of the judge (default: --model).")
]
JudgeIdOpt = Annotated[str | None, typer.Option("--judge-model-id", help="Judge model name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the full result as JSON.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a PNG here.")]
ReportOpt = Annotated[Path | None, typer.Option("--report", help="Write a Markdown report here.")]
StrategiesOpt = Annotated[
    str,
    typer.Option(
        "--strategies",
        help="Comma-separated: generational, generational-norecall, rolling, rolling+recall, "
        "rolling-long, truncation, retrieval, full.",
    ),
]
TokenizerOpt = Annotated[
    str, typer.Option("--tokenizer", help="Token counter: qwen2.5, estimate, server:URL, …")
]


def _strategies(spec: str) -> tuple[str, ...]:
    from kioku.eval.strategies import check_strategies

    return check_strategies(s.strip() for s in spec.split(",") if s.strip())


def _load(
    data: Path | None,
    fmt: str,
    *,
    speaker: str | None,
    conversation: int,
    lang: str,
    messages: int | None,
) -> Any:
    if fmt == "story":
        from kioku.story import DEFAULT_MESSAGES, story

        return story(lang, messages or DEFAULT_MESSAGES)
    from kioku.datasets import load

    t = load(data, fmt, speaker=speaker, conversation=conversation)
    if messages:
        from dataclasses import replace

        t = replace(t, messages=t.messages[:messages], meta=t.meta[:messages])
    return t


def _write(result: Mapping[str, Any], plot: Path | None, report: Path | None, kind: str) -> None:
    from kioku.eval import plots
    from kioku.eval.report import markdown

    if plot:
        p = (
            plots.forgetting_curve(result, plot)
            if kind == "forgetting"
            else plots.answer_by_age(result, plot)
        )
        err.print(f"wrote {p}", highlight=False)
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(markdown(result), encoding="utf-8")
        err.print(f"wrote {report}", highlight=False)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


@eval_app.command("forgetting")
def forgetting(
    data: DataOpt = None,
    fmt: FormatOpt = "kioku",
    model: ModelOpt = None,
    model_id: ModelIdOpt = None,
    judge_model: JudgeOpt = None,
    judge_model_id: JudgeIdOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Replay and answer N times.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the replay.")] = 0,
    questions: Annotated[int, typer.Option("--questions", help="Questions per segment.")] = 8,
    min_segment_tokens: Annotated[
        int, typer.Option("--min-segment-tokens", help="Shortest segment that gets questions.")
    ] = 1000,
    speaker: SpeakerOpt = None,
    conversation: LocomoOpt = 0,
    lang: Annotated[str, typer.Option("--lang", help="story: en or ja.")] = "en",
    messages: Annotated[
        int | None, typer.Option("--messages", help="Only the first N messages.")
    ] = None,
    profile: ReplayProfileOpt = "local-64k",
    window: WindowOpt = None,
    strategies: StrategiesOpt = "generational,rolling,rolling-long,truncation,full",
    tokenizer: TokenizerOpt = "qwen2.5",
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    report: ReportOpt = None,
) -> None:
    """The forgetting curve: an LLM writes questions per segment, each strategy answers from its
    final context, a judge grades.

    Example: kioku eval forgetting --data chat.jsonl --format kioku --model http://127.0.0.1:8080/v1 --repeats 3 --json --plot curve.png
    """
    from kioku.counters import counter_from_spec
    from kioku.eval.forgetting import run
    from kioku.eval.report import file_digest
    from kioku.profiles import get_profile

    settings = from_env()
    url = model or settings.llm_url
    if not url:
        raise InputError(
            "the forgetting curve needs a model: pass --model URL or set KIOKU_LLM_URL"
        )
    chat = chat_model(url, model_id, settings)
    judge = chat_model(judge_model, judge_model_id, settings) if judge_model else None
    t = _load(data, fmt, speaker=speaker, conversation=conversation, lang=lang, messages=messages)
    result = run(
        t,
        model=chat,
        judge_model=judge,
        counter=counter_from_spec(tokenizer),
        profile=get_profile(profile, window),
        strategies=_strategies(strategies),
        repeats=repeats,
        seed=seed,
        questions_per_segment=questions,
        min_segment_tokens=min_segment_tokens,
        log=lambda s: err.print(s, highlight=False),
        data={
            "path": str(data) if data else None,
            "format": fmt,
            "sha256": file_digest(data),
            "conversation": conversation,
            "speaker": speaker,
            "messages": len(t.messages),
            "tokenizer": tokenizer,
        },
    )
    _write(result, plot, report, "forgetting")
    if as_json:
        emit(result)
        return
    table = Table(
        "strategy",
        "mean recall",
        "spread",
        "memory tokens",
        "memory chars",
        "per segment (oldest first)",
    )
    for name, s in result["strategies"].items():
        sp = s["spread"]["mean_recall"]
        table.add_row(
            name,
            _pct(s["mean_recall"]),
            f"{_pct(sp['min'])}–{_pct(sp['max'])}",
            f"{s['memory_tokens'] or 0:.0f}",
            f"{s['memory_chars'] or 0:.0f}",
            " ".join("–" if v is None else f"{100 * v:.0f}" for v in s["recall_per_segment"]),
        )
    out.print(table)


@eval_app.command("locomo")
def locomo(
    data: DataOpt = None,
    budget: Annotated[int, typer.Option("--budget", help="Prompt window in tokens.")] = 4096,
    conversations: Annotated[
        str, typer.Option("--conversations", help="Indexes, e.g. 0-4,7.")
    ] = "0-9",
    strategies: StrategiesOpt = HEADLINE_DEFAULT,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Base URL: chronicler and answering model (LLM-free without it)."
        ),
    ] = None,
    model_id: ModelIdOpt = None,
    judge_model: Annotated[
        str | None,
        typer.Option(
            "--judge-model", "--judge", help="Base URL of a judge of the answers (judge-dependent)."
        ),
    ] = None,
    judge_model_id: JudgeIdOpt = None,
    reader: Annotated[
        str | None,
        typer.Option(
            "--reader",
            envvar="KIOKU_READER_URL",
            help="Base URL of the model that answers from each arm's prompt (env "
            "KIOKU_READER_URL); the chronicler stays --model's, extractive without it.",
        ),
    ] = None,
    reader_model: Annotated[
        str | None, typer.Option("--reader-model", help="Model name to request of --reader.")
    ] = None,
    questions: Annotated[
        str,
        typer.Option(
            "--questions",
            help="--reader: N questions in all, spread over the conversations, categories and "
            "evidence ages (seeded by --seed), or all.",
        ),
    ] = "all",
    categories: Annotated[
        str | None,
        typer.Option(
            "--categories",
            help="--reader: the categories asked, e.g. 5 or adversarial (the questions the "
            "conversation does not answer), 1-4; all five without it.",
        ),
    ] = None,
    time_on: Annotated[
        bool,
        typer.Option("--time-on", help="--reader: record each prompt's evaluation seconds."),
    ] = False,
    limit_questions: Annotated[
        int | None, typer.Option("--limit-questions", help="At most N questions per conversation.")
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", help="Questions shown with each arm's context (JSON).")
    ] = 20,
    tokenizer: TokenizerOpt = "qwen2.5",
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the replay.")] = 0,
    start_at: Annotated[
        int,
        typer.Option(
            "--start-at",
            min=0,
            help="Replay each conversation from its Nth message (every arm): the folds fall "
            "elsewhere, so the question meets another fold phase.",
        ),
    ] = 0,
    phases: Annotated[
        str | None,
        typer.Option(
            "--phases",
            help="Comma-separated --start-at values, e.g. 0,8,16,24,32,40: a whole run from "
            "each, and each margin's mean and worst over them (JSON: margins_mean, margins_min).",
        ),
    ] = None,
    reply_timeout: ReplyTimeoutOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    report: ReportOpt = None,
) -> None:
    """LLM-free forgetting proxy on LoCoMo: is the gold answer in the context each arm would send
    (strictly, as a phrase; F1 and bag of words beside it)? By evidence age, dev (0–4) and
    held-out (5–9) halves, with a diagnosis against plain retrieval.

    With --reader URL a real model answers each arm's prompt instead, scored by LoCoMo's F1
    (docs/eval-reader.md).

    Example: kioku eval locomo --data ../shared/datasets/locomo/locomo10.json --budget 4096 --json --plot locomo.png
    Example: kioku eval locomo --reader http://127.0.0.1:8080/v1 --conversations 5-9 --questions 60 --strategies generational,retrieval,truncation,none --time-on --json
    """
    from kioku.eval.locomo import Models, Options, run

    settings = from_env().with_(reply_timeout_s=reply_timeout)
    chat = chat_model(model, model_id, settings)
    if reader:
        if phases is not None or start_at:
            raise InputError("--reader asks at the end of each conversation: leave out --phases")
        if limit_questions is not None:
            raise InputError("--reader samples with --questions, not --limit-questions")
        reading = ReaderRun(
            reader, reader_model, questions, time_on, judge_model, judge_model_id, categories
        )
        read(
            data,
            budget,
            conversations,
            strategies,
            tokenizer,
            seed,
            chat,
            reading,
            as_json,
            report,
            plot=plot,
        )
        return
    if questions != "all" or time_on or categories is not None:
        raise InputError(
            "--questions, --categories and --time-on choose what --reader answers: pass --reader"
        )
    judge = chat_model(judge_model, judge_model_id, settings) if judge_model else None
    if judge is not None and chat is None:
        raise InputError("--judge-model grades answers: pass --model for the answers too")
    options = Options(
        budget=budget,
        conversations=conversations_of(conversations),
        strategies=_strategies(strategies),
        tokenizer=tokenizer,
        limit_questions=limit_questions,
        samples=samples,
        seed=seed,
        start_at=start_at,
    )
    models = Models(answer=chat, judge=judge)
    if phases is not None:
        _phases(data, options, phases, models, plot or report, as_json)
        return
    result = run(data, options, models=models, log=lambda s: err.print(s, highlight=False))
    _write(result, plot, report, "locomo")
    if as_json:
        emit(result)
        return
    table = Table("strategy", "split", "strict", "f1", "bag of words", "old (10+)", "ctx tokens")
    for name, s in result["strategies"].items():
        for split in ("dev", "heldout"):
            if split in s:
                d = s[split]
                table.add_row(
                    name,
                    split,
                    _pct(d["answer_in_context"]),
                    _pct(d["f1"]),
                    _pct(d["bag_of_words"]),
                    _pct(d["old"]),
                    f"{d['context_tokens']:.0f}",
                )
    out.print(table)


def _phases(
    data: Path | None,
    options: Options,
    spec: str,
    models: Models,
    written: Path | None,
    as_json: bool,
) -> None:
    """`kioku eval locomo --phases`: one run per start, read as each margin's mean and worst."""
    from kioku.eval.phases import over_phases

    if options.start_at:
        raise InputError("--phases sets where each run starts: leave out --start-at")
    if written:
        raise InputError("--phases reads margins only: --plot and --report take one run")
    try:
        starts = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--phases takes message indexes like 0,8,16, not {spec!r}") from None
    if any(n < 0 for n in starts):
        raise InputError(f"--phases takes message indexes of 0 or more, not {spec!r}")
    result = over_phases(
        data, options, starts, models=models, log=lambda s: err.print(s, highlight=False)
    )
    if as_json:
        emit(result)
        return
    table = Table("from message", "split", "margin", "value")
    for p in result["phases"]:
        for split, row in p["margins"].items():
            for key, v in row.items():
                table.add_row(str(p["start_at"]), split, key, _signed(v))
    for label, key in (("mean", "margins_mean"), ("worst", "margins_min")):
        for split, row in result[key].items():
            for k, v in row.items():
                table.add_row(label, split, k, _signed(v))
    out.print(table)


def _signed(v: float | None) -> str:
    return "–" if v is None else f"{v:+.4f}"


@eval_app.command("audit")
def audit(
    conversation: Annotated[str | None, typer.Argument(help="Conversation id in --db.")] = None,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    data: DataOpt = None,
    fmt: FormatOpt = "kioku",
    speaker: SpeakerOpt = None,
    locomo_conversation: LocomoOpt = 0,
    legacy_index: LegacyIndexOpt = None,
    lang: Annotated[str, typer.Option("--lang", help="story: en or ja.")] = "en",
    messages: MessagesOpt = None,
    profile: ReplayProfileOpt = "local-64k",
    window: WindowOpt = None,
    model: ModelOpt = None,
    model_id: ModelIdOpt = None,
    tokenizer: TokenizerOpt = "qwen2.5",
    as_json: JsonOpt = False,
    report: ReportOpt = None,
) -> None:
    """Audit memory against its source: claims written as facts, resolved threads left open,
    verbal tics and attribution phrases in memory (LLM-assisted with --model).

    Example: kioku eval audit mika --db kioku.db --json
    Example: kioku eval audit --data chat.jsonl --format sillytavern --window 8192
    """
    from kioku.eval.audit import audit_store
    from kioku.eval.report import markdown

    settings = from_env()
    chat = chat_model(model, model_id, settings)
    log = lambda s: err.print(s, highlight=False)  # noqa: E731
    if data is not None or fmt == "story":
        from kioku.counters import counter_from_spec
        from kioku.eval.strategies import CONVERSATION_ID, KiokuArm, fit_profile, replay
        from kioku.profiles import get_profile
        from kioku.summarizer import ExtractiveSummarizer

        index = either(legacy_index, None)
        index = locomo_conversation if index is None else index
        t = _load(data, fmt, speaker=speaker, conversation=index, lang=lang, messages=messages)
        counter = counter_from_spec(tokenizer)
        summarizer: Any = ExtractiveSummarizer(counter)
        if chat is not None:
            from kioku.chronicler import LLMChronicler

            summarizer = LLMChronicler(chat, counter, fallback=summarizer)
        prof, _ = fit_profile(get_profile(profile, window))
        arms = replay(
            t, profile=prof, counter=counter, summarizer=summarizer, strategies=["generational"]
        )
        arm = arms["generational"]
        assert isinstance(arm, KiokuArm)
        result = audit_store(arm.kk.store, CONVERSATION_ID, model=chat, log=log)
        result["conversation"] = str(data or f"story:{lang}")
    else:
        if not conversation:
            raise InputError("name a conversation (with --db) or pass --data")
        from kioku import terminal

        store = terminal.open_store(db or settings.db, write=False)
        tenant = terminal.pick_tenant(store, tenant)
        key = terminal.find_conversation(store, conversation, tenant).id
        result = audit_store(store, key, model=chat, tenant=tenant, log=log)
    if report:
        report.write_text(markdown(result), encoding="utf-8")
    if as_json:
        emit(result)
        return
    table = Table("check", "count")
    for k, v in result["totals"].items():
        table.add_row(k.replace("_", " "), str(v))
    out.print(table)


def demo(
    lang: Annotated[str, typer.Option("--lang", help="ja, en or both.")] = "both",
    messages: Annotated[
        int | None, typer.Option("--messages", help="Messages in total (default 3,200).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Where to write kioku-demo.png.")] = Path(
        "."
    ),
    quiet: Annotated[bool, typer.Option("--quiet", help="Only the summary tables.")] = False,
) -> None:
    """Replay a long built-in roleplay through kioku: folds, major GCs, the final memory, prefix
    reuse against a sliding window, and which planted facts each strategy still has (PNG).
    No model needed; with KIOKU_LLM_URL set, that model writes the chapters.

    Example: kioku demo --lang en --messages 1200 --out /tmp
    """
    from kioku.demo import run

    run(lang, messages, out_dir, quiet=quiet)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
    app.command("demo")(demo)
