"""`kioku summarize`: a whole conversation through the chronicler, every chapter shown.

What a person runs before going live: which chapters and synopsis the chronicler writes for a
transcript (`kioku.backlog.summarize_transcript`), with where each came from, how many requests
it took and how much of what the model wrote its messages bear out. The chronicler is the one
every command builds from the same settings (`kioku.config.chronicler_model`): --model, else
KIOKU_SUMMARIZER_URL, else KIOKU_LLM_URL; with none, the extractive chronicler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kioku import terminal
from kioku.cli_options import (
    FORMATS,
    DataOpt,
    JsonOpt,
    LegacyLimitOpt,
    LocomoOpt,
    MessagesOpt,
    ProfileOpt,
    ReplyTimeoutOpt,
    SpeakerOpt,
    SummaryTimeoutOpt,
    TemperatureOpt,
    WindowOpt,
    either,
    settings,
)
from kioku.reply_log import Replayed, ReplyLog
from kioku.terminal import emit, plural

if TYPE_CHECKING:
    from kioku.config import Settings


def summarize(
    data: DataOpt = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help=FORMATS + " (default: told from the file).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="OpenAI-compatible base URL of the chronicler (env KIOKU_SUMMARIZER_URL, then "
            "KIOKU_LLM_URL); without one, the extractive chronicler writes the memory.",
        ),
    ] = None,
    model_id: Annotated[
        str | None,
        typer.Option(
            "--model-id",
            help="Model name to request (env KIOKU_SUMMARIZER_MODEL, then KIOKU_LLM_MODEL).",
        ),
    ] = None,
    speaker: SpeakerOpt = None,
    conversation: LocomoOpt = 0,
    messages: MessagesOpt = None,
    limit: LegacyLimitOpt = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
    summary_timeout: SummaryTimeoutOpt = None,
    reply_timeout: ReplyTimeoutOpt = None,
    temperature: TemperatureOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also write the JSON (every chapter and synopsis) here."),
    ] = None,
) -> None:
    """Summarize a whole conversation as the chronicler would, and print every chapter and
    synopsis it wrote (with where it came from and how much of it is grounded) and the memory.

    Example: kioku summarize --data ../shared/datasets/locomo/locomo10.json --model http://127.0.0.1:8080/v1 --profile local-8k --json
    """
    from kioku.backlog import summarize_transcript

    s = chronicler_settings(
        profile, window, model, model_id, summary_timeout, temperature, reply_timeout
    )
    t = _transcript(data, fmt, speaker, conversation, either(messages, limit))
    result = summarize_transcript(
        t, chronicler(s), token_counter(s), s.profile_obj, console=err_console()
    )
    report = {
        "kind": "kioku.summarize/1",
        "data": str(data) if data else fmt or "locomo",
        "profile": s.profile_obj.name,
        "window": s.profile_obj.window,
        "model": s.chronicler_url or "extractive",
        **result.to_json(),
    }
    if out is not None:
        out.write_text(json.dumps(report, ensure_ascii=False, indent=1, default=str) + "\n")
    if as_json:
        emit(report)
        return
    for row in report["summaries"]:
        g = row["grounding"] or {}
        share = f", grounded {g['grounded']}/{g['lines']}" if g and not g.get("extractive") else ""
        terminal.text(
            f"## {row['kind']} #{row['first_seq']}–#{row['last_seq']} ({row['source']}"
            f"{share}, {row['attempts']} request(s))\n{row['text']}\n"
        )
    terminal.text(result.text)
    terminal.note(
        f"{plural(len(result.summaries), 'summary', 'summaries')} in {result.duration_s:.0f} s; "
        f"events: {result.events or 'none'}" + (f"; wrote {out}" if out else "")
    )


def chronicler_settings(
    profile: str | None,
    window: int | None,
    model: str | None,
    model_id: str | None,
    summary_timeout: float | None,
    temperature: float | None,
    reply_timeout: float | None = None,
) -> Settings:
    """The settings (the environment, then these options) a command that summarizes runs on."""
    return settings(
        None,
        profile,
        window,
        summarizer_url=model,
        summarizer_model=model_id,
        summary_timeout_s=summary_timeout,
        reply_timeout_s=reply_timeout,
        summary_temperature=temperature,
    )


def _transcript(
    data: Path | None, fmt: str | None, speaker: str | None, conversation: int, n: int | None
) -> Any:
    from dataclasses import replace

    from kioku.datasets import load

    t = load(data, fmt if (fmt or data) else "locomo", speaker=speaker, conversation=conversation)
    return replace(t, messages=t.messages[:n], meta=t.meta[:n]) if n else t


def token_counter(s: Settings) -> Any:
    from kioku.counters import counter_from_spec

    return counter_from_spec(s.tokenizer)


def chronicler(s: Settings, replies: Path | None = None, replayed: Replayed | None = None) -> Any:
    """The LLM chronicler the settings name, else the extractive one (said on stderr);
    `replies`: a JSONL file every request and reply is appended to; `replayed`: a model that
    answers from such a file (`kioku.reply_log.Replayed`), in the place of the settings'."""
    from kioku.config import chronicler_config, chronicler_model
    from kioku.summarizer import ExtractiveSummarizer

    counter = token_counter(s)
    chat: Any = replayed if replayed is not None else chronicler_model(s)
    if chat is None:
        terminal.note("no chronicler model (--model or KIOKU_SUMMARIZER_URL): extractive memory")
        return ExtractiveSummarizer(counter)
    from kioku.chronicler import LLMChronicler

    if replies is not None:
        chat = ReplyLog(chat, replies)
    return LLMChronicler(chat, counter, ExtractiveSummarizer(counter), chronicler_config(s))


def err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def register(app: typer.Typer) -> None:
    app.command("summarize")(summarize)
