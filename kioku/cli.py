"""The `kioku` command: a thin shell, one library call per command.

Read commands (`memory`, `notes`, `search`, `tics`, `stats`, `export`) open the database
read-only and refuse a conversation that does not exist; they print a table or plain text for
people and JSON with `--json`. Failures are mapped to one line in one place
(`kioku.terminal.KiokuGroup`), never a traceback. Commands of the service (`serve`, `worker`,
`keys`) and of the evaluation (`eval …`, `demo`) live beside the code they run and register
themselves here through `register(app)`. Nothing heavy is imported before a command runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kioku import terminal
from kioku.cli_options import (
    FORMATS,
    ConvArg,
    DbOpt,
    JsonOpt,
    ProfileOpt,
    ReplyTimeoutOpt,
    SpeakerOpt,
    SummaryTimeoutOpt,
    TenantOpt,
    WindowOpt,
    data_path,
    settings,
)
from kioku.errors import KiokuError, NotFound
from kioku.terminal import emit, plural

if TYPE_CHECKING:
    pass

CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    cls=terminal.KiokuGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=CONTEXT,
    help="kioku: long-term memory for one very long LLM conversation.",
)
# Modules that add their own commands (the service adds `bench serve`: after the benchmarks).
EXTENSIONS = ("kioku.summarize_cli", "kioku.bench.cli", "kioku.service.cli", "kioku.eval.cli")


def _version(value: bool) -> None:
    if value:
        from kioku import __version__

        typer.echo(f"kioku {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version),
    ] = False,
) -> None:
    """kioku: long-term memory for one very long LLM conversation.

    Start with `kioku demo`; `kioku COMMAND -h` explains each command.
    """


@app.command("import")
def import_(
    data: Annotated[Path, typer.Option("--data", help="The file to read.", callback=data_path)],
    fmt: Annotated[
        str | None,
        typer.Option("--format", help=f"{FORMATS} (default: told from the file)."),
    ] = None,
    conversation: Annotated[
        str | None, typer.Option("--conversation", help="Conversation id (default: file name).")
    ] = None,
    speaker: SpeakerOpt = None,
    index: Annotated[int, typer.Option(help="locomo: which conversation (0-9).")] = 0,
    db: DbOpt = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
    tenant: TenantOpt = None,
    append: Annotated[
        bool,
        typer.Option(
            "--append", help="Add to a conversation that has messages (only what it lacks)."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Import a conversation into the log and compact it as it would have been live. Into an
    existing conversation only with --append; importing the same file again changes nothing.

    Example: kioku import --data "Mika - 2024-11-12@10h11m12s.jsonl" --format sillytavern
    --tenant acme --db kioku.db
    """
    from kioku.importer import import_into, read

    transcript = read(data, fmt, speaker=speaker, index=index)  # before any database opens
    kk = terminal.open_kioku(settings(db, profile, window), write=True, tenant=tenant)
    result = import_into(kk, conversation or data.stem, transcript, append=append)
    if as_json:
        emit(result)
        return
    kept = result["already_there"]
    terminal.text(
        f"imported {plural(result['imported'], 'message')} into {result['conversation']!r}"
        + (f" (tenant {result['tenant']!r})" if result["tenant"] != "default" else "")
        + (f", {plural(kept, 'message')} of the file already there" if kept else "")
        + f": {plural(result['messages'], 'message')} in all, raw window from seq "
        f"{result['raw_start']}, memory version {result['memory_version']}"
    )


@app.command()
def memory(
    conversation: Annotated[
        str | None, typer.Argument(help="Conversation id; without one, list them.")
    ] = None,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a conversation's memory (synopsis, chapters, notes), or list conversations.

    Example: kioku memory mika --db kioku.db
    """
    kk = terminal.open_kioku(settings(db), write=False, tenant=tenant)
    if conversation is None:
        active = kk.store.last_activity(kk.tenant)
        rows: list[dict[str, Any]] = [
            {
                "id": c.public_id or c.id,
                "character": c.character,
                "messages": c.next_seq,
                "raw_start": c.raw_start,
                "memory_version": c.memory_version,
                "last_activity": active.get(c.id),
            }
            for c in kk.conversations()
        ]
        rows.sort(key=lambda r: -(r["last_activity"] or 0))
        if as_json:
            emit(rows)
            return
        if not rows:
            hint = terminal.elsewhere(kk.store, kk.tenant)
            if hint and kk.tenant not in kk.store.tenants():  # a tenant this database lacks
                raise NotFound(f"no conversations{hint}")
            terminal.note("no conversations yet (`kioku import` or `kioku serve` adds them)")
            return
        terminal.table(
            ("conversation", "character", "messages", "raw window from", "memory", "last active"),
            [
                (
                    r["id"],
                    r["character"],
                    f"{r['messages']:,}",
                    r["raw_start"],
                    f"v{r['memory_version']}",
                    terminal.when(r["last_activity"]),
                )
                for r in rows
            ],
            right=("messages", "raw window from"),
        )
        return
    from kioku.engine import Conversation
    from kioku.memory import render_memory

    conv = Conversation(kk, terminal.find_conversation(kk.store, conversation, kk.tenant).id)
    mem = conv.memory()
    if as_json:
        from kioku.grounding.records import grounded_share

        def shown(item: Any) -> dict[str, Any]:
            return {**item.__dict__, "grounded_share": grounded_share(item)}

        emit(
            {
                "synopsis": shown(mem.synopsis) if mem.synopsis else None,
                "chapters": [shown(c) for c in mem.chapters],
                "notes": mem.notes,
            }
        )
        return
    if mem.is_empty():
        terminal.note(f"{conversation!r} has no memory yet: every message is still raw")
    terminal.text(render_memory(mem, conv.lang)[0])


@app.command()
def chat(
    conversation: ConvArg,
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
    tenant: TenantOpt = None,
    profile: ProfileOpt = None,
    window: WindowOpt = None,
    summary_timeout: SummaryTimeoutOpt = None,
    reply_timeout: ReplyTimeoutOpt = None,
) -> None:
    """Chat in the terminal with memory. Empty line or Ctrl-D ends. A conversation this
    command started is not kept when it ends without a reply (the model failed, or nothing
    was said).

    Example: kioku chat mika --model http://127.0.0.1:8080/v1
    """
    s = settings(
        db,
        profile,
        window,
        llm_url=model,
        summarizer_url=summarizer_model,
        summary_timeout_s=summary_timeout,
        reply_timeout_s=reply_timeout,
    )
    if not s.llm_url:
        raise KiokuError("no model: pass --model URL or set KIOKU_LLM_URL")
    kk = terminal.open_kioku(s, write=True, background=True, tenant=tenant)
    new = not terminal.has_conversation(kk.store, conversation, kk.tenant)
    replied = False
    key: str | None = None
    try:
        conv = kk.conversation(conversation, system_prompt=system, character=character)
        key = conv.id
        name = conv.info().character or "them"
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            if not line.strip():
                break
            reply = conv.chat(line, strict=False)
            replied = True
            terminal.text(f"{name}> {reply.text}")
            if reply.truncated:
                terminal.note("the reply was cut at max_tokens (finish_reason=length)")
    finally:
        kk.close()
        if new and not replied and key is not None:
            kk.store.delete_conversation(key)  # a failed command leaves nothing behind


@app.command()
def stats(
    conversation: Annotated[
        str | None, typer.Argument(help="Conversation id; without one, all of them.")
    ] = None,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compaction statistics: chapters, major GCs, cuts, refusals, retries, forced cuts.

    Example: kioku stats --db kioku.db
    """
    from kioku.stats import compaction_stats

    store = terminal.open_store(settings(db).db, write=False)
    key = None  # the store's key of the tenant's conversation (ids are per tenant)
    if conversation is not None:
        key = terminal.find_conversation(
            store, conversation, terminal.pick_tenant(store, tenant)
        ).id
    st = compaction_stats(store, key)
    if as_json:
        emit(st)
        return
    terminal.table(
        ("event", "count", "outcomes", "median s", "mean in tok", "mean out tok"),
        [
            (
                name,
                e["count"],
                ", ".join(f"{k} {v}" for k, v in sorted(e["outcomes"].items())),
                _num(e["median_duration_s"], 1),
                _num(e["mean_input_tokens"]),
                _num(e["mean_output_tokens"]),
            )
            for name, e in st["events"].items()
        ],
        title=f"compaction: {plural(st['rows'], 'log row')}, "
        f"{plural(st['conversations'], 'conversation')}",
        right=("count", "median s", "mean in tok", "mean out tok"),
    )


def _num(v: float | None, digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


@app.command()
def notes(
    conversation: ConvArg,
    edit: Annotated[
        bool, typer.Option("--edit", help="Edit in $EDITOR; your edit wins over extracted notes.")
    ] = False,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a conversation's notes (one editable line each), or edit them.

    Example: kioku notes mika --edit
    """
    from kioku import notes as notes_layer
    from kioku.engine import Conversation

    if edit and as_json:
        raise typer.BadParameter("--json prints the notes; it does not go with --edit")
    kk = terminal.open_kioku(settings(db), write=edit, tenant=tenant)
    key = terminal.find_conversation(kk.store, conversation, kk.tenant).id
    held = notes_layer.notes(kk.store, key)
    if as_json:
        emit([_note_json(n) for n in held])
        return
    base = notes_layer.render_editable(held)
    if not edit:
        if base:
            terminal.text(base)
        else:
            terminal.note("no notes yet")
        return
    import click

    edited = click.edit(base, extension=".txt")
    if edited is None:
        terminal.note("no change")
        return
    result = Conversation(kk, key).edit_notes(edited, base=base)
    terminal.text(
        f"notes saved: {len(result.added)} added, {len(result.changed)} changed, "
        f"{len(result.retracted)} retracted"
    )


def _note_json(n: Any) -> dict[str, Any]:
    """A note in force as `kioku notes --json` prints it: the line a person edits, and where
    it came from."""
    return {
        "subject": n.subject,
        "kind": n.kind,
        "text": n.text,
        "line": n.line(),
        "author": n.author,
        "source_seq": n.source_seq,
        "said_by": n.said_by or None,
        "on_date": n.on_date,
        "mentions": n.mentions,
    }


@app.command()
def search(
    conversation: ConvArg,
    query: Annotated[str, typer.Argument(help="What to look for.")],
    k: Annotated[int, typer.Option("-k", help="How many hits.")] = 5,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the whole archive of a conversation: the messages that match, best first, each
    with the messages beside it as context (indented, no score).

    Example: kioku search mika "birthday present"
    """
    from kioku.recall.archive import DEFAULT_REACH, Terms
    from kioku.recall.found import around, found

    kk = terminal.open_kioku(settings(db), write=False, tenant=tenant)
    key = terminal.find_conversation(kk.store, conversation, kk.tenant).id

    hits = kk.layers.search(key, query, k)
    indexes = getattr(kk.layers, "indexes", None)
    reach = indexes.params.reach if indexes else DEFAULT_REACH
    entries = {e.seq: e for e in kk.store.entries_at(key, around(hits, reach))}
    matches = found(hits, entries, query, indexes.terms if indexes else Terms(), reach)

    def shown(seq: int) -> dict[str, Any]:
        m = entries[seq].message
        return {
            "seq": seq,
            "at": m.at.isoformat() if m.at else None,
            "author": m.author,
            "text": m.text,
        }

    rows = [
        {**shown(f.seq), "score": round(f.score, 3), "context": [shown(q) for q in f.context]}
        for f in matches
    ]
    if as_json:
        emit(rows)
        return
    if not rows:
        terminal.note(f"nothing in {conversation!r} matches {query!r}")
        return
    # each hit with the messages beside it in seq order; only the hit has a score
    lines: list[tuple[Any, ...]] = []
    for r in rows:
        for c in sorted([r, *r["context"]], key=lambda c: c["seq"]):
            hit = c is r
            lines.append(
                (
                    c["seq"],
                    f"{r['score']:.2f}" if hit else "",
                    terminal.when(c["at"]),
                    c["author"],
                    _line(c["text"]) if hit else "  " + _line(c["text"]),
                )
            )
    terminal.table(
        ("seq", "score", "when", "who", "text (context indented)"),
        lines,
        right=("seq", "score"),
    )


def _line(s: str) -> str:
    return terminal.one_line(s, 10_000 if terminal.piped() else 100)


@app.command()
def tics(
    conversation: ConvArg, db: DbOpt = None, tenant: TenantOpt = None, as_json: JsonOpt = False
) -> None:
    """Verbal tics across the last 20 replies.

    Example: kioku tics mika
    """
    kk = terminal.open_kioku(settings(db), write=False, tenant=tenant)
    key = terminal.find_conversation(kk.store, conversation, kk.tenant).id
    alerts = kk.layers.tic_alerts(key)
    if as_json:
        emit([a.__dict__ for a in alerts])
        return
    if not alerts:
        terminal.note("no phrase repeats across the latest replies")
        return
    terminal.table(
        ("phrase", "replies", "kind"),
        [(a.phrase, f"{a.count} of {a.window}", a.kind) for a in alerts],
    )


@app.command()
def cut(
    conversation: ConvArg, db: DbOpt = None, tenant: TenantOpt = None, as_json: JsonOpt = False
) -> None:
    """区切り: fold everything not yet summarized and start the raw window now.

    Example: kioku cut mika
    """
    from kioku.engine import Conversation

    kk = terminal.open_kioku(settings(db), write=True, tenant=tenant)
    before = terminal.find_conversation(kk.store, conversation, kk.tenant)
    report = Conversation(kk, before.id).cut()
    after = kk.store.conversation(before.id)
    if as_json:
        emit({"reasons": list(report.reasons), "raw_start": after.raw_start})
        return
    terminal.text(
        f"cut {conversation!r}: the raw window starts at seq {after.raw_start} "
        f"(was {before.raw_start}); {'; '.join(report.reasons)}"
    )


@app.command()
def forget(
    conversation: ConvArg,
    seq: Annotated[int, typer.Argument(min=0, help="The message's seq (`kioku export`).")],
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete one message: its notes, recollections and chapter lines go with it.

    The log keeps it as a version for the operator; no model reads it again.

    Example: kioku forget mika 2
    """
    from kioku.engine import Conversation
    from kioku.sync import forget as forget_message

    kk = terminal.open_kioku(settings(db), write=True, tenant=tenant)
    key = terminal.find_conversation(kk.store, conversation, kk.tenant).id
    done = forget_message(Conversation(kk, key), seq)
    if as_json:
        emit(done.__dict__)
        return
    if not done.deleted:
        terminal.note(f"#{seq} of {conversation!r} was deleted already")
        return
    terminal.text(
        f"forgot #{seq} of {conversation!r}: {plural(len(done.retracted), 'note')} retracted, "
        f"{plural(len(done.stale), 'memory item')} written again"
    )


@app.command()
def export(
    conversation: ConvArg,
    fmt: Annotated[
        str, typer.Option("--format", help="kioku (JSONL, re-importable) or sillytavern.")
    ] = "kioku",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write to this file (default: stdout).")
    ] = None,
    db: DbOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Export a conversation's whole transcript: your chats are yours.

    The kioku format is described in docs/formats.md; `kioku import` reads it back.

    Example: kioku export mika --format sillytavern --out mika.jsonl
    """
    from kioku.export import export_lines

    store = terminal.open_store(settings(db).db, write=False)
    key = terminal.find_conversation(store, conversation, terminal.pick_tenant(store, tenant)).id
    lines = export_lines(store, key, fmt)
    if out is None:
        for line in lines:
            terminal.text(line)
        return
    n = -1  # the header line is not a message
    with open(out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    terminal.note(f"wrote {plural(n, 'message')} to {out}")


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
    app(prog_name="kioku")


if __name__ == "__main__":
    main()
