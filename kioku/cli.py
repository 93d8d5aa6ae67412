"""The `kioku` command: a thin shell, one library call per command.

Commands of the service (`serve`, `worker`, `keys`) and of the evaluation (`eval …`, `demo`) live
beside the code they run and register themselves here through `register(app)`.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kioku.config import Settings, build_kioku, from_env
from kioku.errors import KiokuError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="kioku: long-term memory for one very long LLM conversation.",
)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each prints JSON on stdout.")
app.add_typer(bench_app, name="bench")

# Optional dependencies, by the extra that installs them.
EXTRAS = {"fastapi": "server", "uvicorn": "server", "psycopg": "server", "starlette": "server"}

# Modules that add their own commands: (module, what it brings).
EXTENSIONS = ("kioku.service.cli", "kioku.eval.cli")

out = Console()
err = Console(stderr=True)

DbOpt = Annotated[
    str | None, typer.Option("--db", help="Database URL or SQLite path (env KIOKU_DB).")
]
ProfileOpt = Annotated[
    str | None, typer.Option("--profile", help="local-64k, cloud-1m or local-8k.")
]
WindowOpt = Annotated[
    int | None, typer.Option("--window", help="Scale the profile to this window (tokens).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def settings(
    db: str | None = None, profile: str | None = None, window: int | None = None, **kw: Any
) -> Settings:
    return from_env().with_(db=db, profile=profile, window=window, **kw)


def emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=1, default=str) + "\n")


@app.command("import")
def import_(
    data: Annotated[Path, typer.Option("--data", help="The file to read.")],
    fmt: Annotated[
        str, typer.Option("--format", help="kioku, sillytavern, locomo or realpersonachat.")
    ] = "kioku",
    conversation: Annotated[
        str | None, typer.Option("--conversation", help="Conversation id (default: file name).")
    ] = None,
    speaker: Annotated[str | None, typer.Option(help="realpersonachat: whose timeline.")] = None,
    index: Annotated[int, typer.Option(help="locomo: which conversation (0-9).")] = 0,
    db: DbOpt = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="The tenant (of your `kioku serve` key) it belongs to."),
    ] = None,
    append: Annotated[
        bool,
        typer.Option(
            "--append", help="Add to a conversation that has messages (only what it lacks)."
        ),
    ] = False,
) -> None:
    """Import a conversation into the log and compact it as it would have been live. Into an
    existing conversation only with --append; importing the same file again changes nothing.

    Example: kioku import --data "Seraphina - 2024-11-12@10h11m12s.jsonl" --format sillytavern
    --tenant acme --db kioku.db
    """
    from kioku.importer import import_transcript

    kk = build_kioku(settings(db, profile, window, tenant=tenant))
    result = import_transcript(
        kk, data, fmt, conversation_id=conversation, speaker=speaker, index=index, append=append
    )
    emit(result)


@app.command()
def memory(
    conversation: Annotated[str | None, typer.Argument(help="Conversation id.")] = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a conversation's memory (synopsis, chapters, notes), or list conversations.

    Example: kioku memory mika --db kioku.db
    """
    kk = build_kioku(settings(db))
    if conversation is None:
        rows = [
            {
                "id": c.id,
                "messages": c.next_seq,
                "raw_start": c.raw_start,
                "memory_version": c.memory_version,
            }
            for c in kk.conversations()
        ]
        if as_json:
            emit(rows)
            return
        t = Table("conversation", "messages", "raw window from", "memory version")
        for r in rows:
            t.add_row(
                str(r["id"]), str(r["messages"]), str(r["raw_start"]), str(r["memory_version"])
            )
        out.print(t)
        return
    conv = kk.conversation(conversation)
    mem = conv.memory()
    if as_json:
        emit(
            {
                "synopsis": mem.synopsis.__dict__ if mem.synopsis else None,
                "chapters": [c.__dict__ for c in mem.chapters],
                "notes": mem.notes,
            }
        )
        return
    from kioku.memory import render_memory

    out.print(render_memory(mem, conv.lang)[0], markup=False, highlight=False)


@app.command()
def chat(
    conversation: Annotated[str, typer.Argument(help="Conversation id.")],
    model: Annotated[
        str | None, typer.Option("--model", help="OpenAI-compatible base URL (env KIOKU_LLM_URL).")
    ] = None,
    summarizer_model: Annotated[
        str | None, typer.Option("--summarizer-model", help="Base URL of the chronicler's model.")
    ] = None,
    system: Annotated[
        str | None, typer.Option("--system", help="Character card (system prompt).")
    ] = None,
    character: Annotated[
        str, typer.Option("--character", help="The character's name, shown and stored.")
    ] = "",
    db: DbOpt = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
) -> None:
    """Chat in the terminal with memory. Empty line or Ctrl-D ends.

    Example: kioku chat mika --model http://127.0.0.1:8080/v1
    """
    s = settings(db, profile, window, llm_url=model, summarizer_url=summarizer_model)
    if not s.llm_url:
        raise KiokuError("no model: pass --model URL or set KIOKU_LLM_URL")
    kk = build_kioku(s, background=True)
    try:
        conv = kk.conversation(conversation, system_prompt=system, character=character)
        name = conv.info().character or "them"
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            if not line.strip():
                break
            reply = conv.chat(line, strict=False)
            out.print(f"[bold]{escape(name)}>[/bold] {escape(reply.text)}", highlight=False)
            if reply.truncated:
                err.print("[yellow]the reply was cut at max_tokens (finish_reason=length)[/yellow]")
    finally:
        kk.close()


@app.command()
def summarize(
    data: Annotated[
        Path | None, typer.Option("--data", help="Conversation file (default: shared dataset).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format")] = "locomo",
    model: Annotated[
        str | None, typer.Option("--model", help="OpenAI-compatible base URL of the chronicler.")
    ] = None,
    speaker: Annotated[str | None, typer.Option()] = None,
    index: Annotated[int, typer.Option("--conversation", help="locomo: which conversation.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Only the first N messages.")] = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
) -> None:
    """Summarize a whole conversation with a real model and print the memory.

    Example: kioku summarize --data ../shared/datasets/locomo/locomo10.json --format locomo --model http://127.0.0.1:8080/v1
    """
    from kioku.backlog import summarize_transcript
    from kioku.chronicler import ChroniclerConfig
    from kioku.client import OpenAIChatModel
    from kioku.counters import counter_from_spec
    from kioku.datasets import load

    s = settings(None, profile, window, summarizer_url=model)
    url = s.summarizer_url or s.llm_url
    if not url:
        raise KiokuError("no model: pass --model URL or set KIOKU_LLM_URL")
    t = load(data, fmt, speaker=speaker, conversation=index)
    if limit:
        from dataclasses import replace

        t = replace(t, messages=t.messages[:limit], meta=t.meta[:limit])
    counter = counter_from_spec(s.tokenizer)
    model_ = OpenAIChatModel(url, profile=s.profile_obj)
    config = ChroniclerConfig(system_role=s.system_role)
    result = summarize_transcript(t, model_, counter, s.profile_obj, config=config, console=err)
    out.print(result.text, markup=False, highlight=False)
    err.print(
        f"{len(result.summaries)} summaries in {result.duration_s:.0f} s; "
        f"events: {result.events or 'none'}"
    )


@app.command()
def stats(
    conversation: Annotated[str | None, typer.Argument()] = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compaction statistics: chapters, major GCs, cuts, refusals, retries, forced cuts.

    Example: kioku stats --db kioku.db
    """
    from kioku.stats import compaction_stats, stats_table

    kk = build_kioku(settings(db))
    st = compaction_stats(kk.store, conversation)
    if as_json:
        emit(st)
    else:
        out.print(stats_table(st))


@app.command()
def notes(
    conversation: Annotated[str, typer.Argument()],
    edit: Annotated[
        bool, typer.Option("--edit", help="Edit in $EDITOR; your edit wins over extracted notes.")
    ] = False,
    db: DbOpt = None,
) -> None:
    """Print a conversation's notes, or edit them.

    Example: kioku notes mika --edit
    """
    from kioku import notes as notes_layer

    kk = build_kioku(settings(db))
    conv = kk.conversation(conversation)
    base = notes_layer.render_editable(notes_layer.notes(kk.store, conv.id))
    if not edit:
        out.print(base or "(no notes yet)", markup=False, highlight=False)
        return
    edited = click.edit(base, extension=".txt")
    if edited is None:
        err.print("no change")
        return
    result = kk.layers.edit_notes(conv, edited, base=base)
    emit(result.__dict__)


@app.command()
def search(
    conversation: Annotated[str, typer.Argument()],
    query: Annotated[str, typer.Argument()],
    k: Annotated[int, typer.Option("-k", help="How many hits.")] = 5,
    db: DbOpt = None,
) -> None:
    """Search the whole archive of a conversation.

    Example: kioku search mika "birthday present"
    """
    kk = build_kioku(settings(db))
    conv = kk.conversation(conversation)
    idx = kk.layers.recall.sync(conv.id)
    hits = idx.search(query, k=k)
    rows = []
    for h in hits:
        (e,) = kk.store.entries(conv.id, h.seq, h.seq)
        rows.append(
            {"seq": h.seq, "score": round(h.score, 3), "author": e.message.author, "text": e.text}
        )
    emit(rows)


@app.command()
def tics(conversation: Annotated[str, typer.Argument()], db: DbOpt = None) -> None:
    """Verbal tics across the last 20 replies.

    Example: kioku tics mika
    """
    kk = build_kioku(settings(db))
    conv = kk.conversation(conversation)
    emit([a.__dict__ for a in kk.layers.tic_alerts(conv.id)])


@app.command()
def cut(conversation: Annotated[str, typer.Argument()], db: DbOpt = None) -> None:
    """区切り: fold everything not yet summarized and start the raw window now.

    Example: kioku cut mika
    """
    kk = build_kioku(settings(db))
    report = kk.conversation(conversation).cut()
    emit({"reasons": report.reasons, "raw_start": kk.store.conversation(conversation).raw_start})


@bench_app.command("prefix")
def bench_prefix(
    data: Annotated[Path | None, typer.Option("--data")] = None,
    fmt: Annotated[str, typer.Option("--format")] = "realpersonachat",
    speaker: Annotated[str | None, typer.Option("--speaker")] = None,
    conversation: Annotated[int, typer.Option("--conversation")] = 0,
    profile: Annotated[str, typer.Option("--profile")] = "local-64k",
    window: WindowOpt = None,
    max_turns: Annotated[int | None, typer.Option("--max-turns")] = None,
    as_json: JsonOpt = True,
) -> None:
    """Prefix-cache reuse of kioku's prompts against sliding window, summary-in-system and
    immediate fold, replayed on a real tokenizer.

    Example: kioku bench prefix --format locomo --conversation 0 --window 16384 --json
    """
    from kioku.bench.prefix import run

    emit(
        run(
            data,
            fmt,
            speaker=speaker,
            conversation=conversation,
            profile=profile,
            window=window,
            max_turns=max_turns,
        )
    )


@bench_app.command("turn")
def bench_turn(
    sizes: Annotated[str, typer.Option("--sizes")] = "500,5000,50000",
    as_json: JsonOpt = True,
) -> None:
    """prepare() time against history length (and the naive load-all baseline).

    Example: kioku bench turn --sizes 500,5000,50000 --json
    """
    from kioku.bench.turn import run

    emit(run([int(s) for s in sizes.split(",")]))


@bench_app.command("tokens")
def bench_tokens(
    turns: Annotated[int, typer.Option("--calibration-turns")] = 20,
    as_json: JsonOpt = True,
) -> None:
    """Calibrated token estimator against a real tokenizer, per language.

    Example: kioku bench tokens --json
    """
    from kioku.bench.tokens import run

    emit(run(calibration_turns=turns))


@bench_app.command("recall")
def bench_recall(
    data: Annotated[Path | None, typer.Option("--data")] = None,
    scale: Annotated[int | None, typer.Option("--scale")] = None,
    as_json: JsonOpt = True,
) -> None:
    """Archive recall on LoCoMo (evidence recall@k), or speed at --scale N messages.

    Example: kioku bench recall --data ../shared/datasets/locomo/locomo10.json --json
    """
    from kioku.bench.recall import run

    emit(run(data, scale))


def register_extensions() -> None:
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that part of kioku is not there
            raise
        module.register(app)


def main() -> None:
    register_extensions()
    try:
        app()
    except KiokuError as e:
        err.print(f"[red]error:[/red] {e}")
        raise SystemExit(2) from e
    except ModuleNotFoundError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        hint = escape(f"pip install -e '.[{extra}]' (or pip install 'kioku[{extra}]')")
        err.print(f"[red]error:[/red] this command needs {e.name!r}: {hint}")
        raise SystemExit(2) from e
