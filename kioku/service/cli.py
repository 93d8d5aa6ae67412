"""The service's commands: `kioku serve`, `kioku keys create|list|revoke`, `kioku delete` (it
takes the turn lock as the service does), `kioku bench serve`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from kioku import terminal
from kioku.cli_options import (
    ConvArg,
    DbOpt,
    JsonOpt,
    ProfileOpt,
    ReplyTimeoutOpt,
    SummaryTimeoutOpt,
    TenantOpt,
    settings,
)
from kioku.service.worker_cli import worker_command
from kioku.terminal import emit, plural

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from kioku.config import Settings
    from kioku.service.deletion import Deleted
    from kioku.store import Store

WINDOW_PROBE_S = 60.0  # how often `--window auto` asks the upstream again

keys_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="API keys of `kioku serve`, one tenant each.",
)


_UpstreamOpt = Annotated[
    str | None,
    typer.Option("--upstream", help="OpenAI-compatible base URL (env KIOKU_LLM_URL)."),
]

_SummarizerUpstreamOpt = Annotated[
    str | None,
    typer.Option("--summarizer-upstream", help="Base URL of the chronicler's model."),
]

_ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model name sent upstream (default: client's).")
]

_WindowOpt = Annotated[
    str,
    typer.Option(
        "--window",
        metavar="auto|<tokens>",
        help="The upstream's context window: auto asks the upstream (llama.cpp, Ollama, "
        "vLLM, KoboldCpp, LM Studio say it) and learns from a refusal for size; a number "
        "scales the profile to it (env KIOKU_WINDOW).",
    ),
]

_HostOpt = Annotated[str, typer.Option("--host", help="Address to bind.")]

_PortOpt = Annotated[int, typer.Option("--port", help="Port to listen on.")]

_WorkerOpt = Annotated[
    bool,
    typer.Option(
        "--worker/--no-worker", help="Run summaries in this process (or in `kioku worker`)."
    ),
]

_WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        min=1,
        help="Serving processes (one saturates one core; PostgreSQL for more than one).",
    ),
]

_MaxBodyOpt = Annotated[
    int | None,
    typer.Option("--max-body", help="Largest request body in bytes (413 beyond; 8 MiB)."),
]

_MaxMessagesOpt = Annotated[
    int | None,
    typer.Option("--max-messages", help="Most messages in one request (413 beyond)."),
]

_SummaryDelayOpt = Annotated[
    float | None,
    typer.Option(
        "--summary-delay",
        min=0,
        help="Seconds a summary job waits so it does not compete with the turn for the GPU "
        "(env KIOKU_SUMMARY_DELAY; default 30; 0 for replays and tests).",
    ),
]

_CorsOriginOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--cors-origin",
        help="A browser origin allowed to call the REST API, e.g. SillyTavern's "
        "http://127.0.0.1:8000 for the kioku extension (repeatable; env KIOKU_CORS_ORIGINS).",
    ),
]

_CardAsSentOpt = Annotated[
    bool,
    typer.Option(
        "--card-as-sent",
        help="Keep the card exactly as the client sends it: the parts the SillyTavern "
        "extension marks as changing stay in it (an ablation; env KIOKU_CARD_AS_SENT=1).",
    ),
]


def serve(
    upstream: _UpstreamOpt = None,
    summarizer_upstream: _SummarizerUpstreamOpt = None,
    model: _ModelOpt = None,
    db: DbOpt = None,
    profile: ProfileOpt = None,
    window: _WindowOpt = "auto",
    host: _HostOpt = "127.0.0.1",
    port: _PortOpt = 8000,
    worker: _WorkerOpt = True,
    workers: _WorkersOpt = 1,
    max_body: _MaxBodyOpt = None,
    max_messages: _MaxMessagesOpt = None,
    summary_delay: _SummaryDelayOpt = None,
    summary_timeout: SummaryTimeoutOpt = None,
    reply_timeout: ReplyTimeoutOpt = None,
    cors_origin: _CorsOriginOpt = None,
    card_as_sent: _CardAsSentOpt = False,
) -> None:
    """Serve the OpenAI-compatible memory proxy, the REST API and the console.

    Example: kioku serve --db kioku.db --upstream http://127.0.0.1:8080/v1 --port 8000
    """
    from kioku.config import writes_chapters
    from kioku.service.serving import serve as run

    s = settings(
        db,
        profile,
        _window(window),
        llm_url=upstream,
        summarizer_url=summarizer_upstream,
        llm_model=model,
        max_body_bytes=max_body,
        max_messages=max_messages,
        summary_delay_s=summary_delay,
        summary_timeout_s=summary_timeout,
        reply_timeout_s=reply_timeout,
        cors_origins=tuple(cors_origin) if cors_origin else None,
        card_as_sent=card_as_sent or None,
    )
    if not s.llm_url:
        from kioku.errors import ConfigError

        raise ConfigError("no upstream: pass --upstream URL (or set KIOKU_LLM_URL)")
    s = _settle_window(s, given=window != "auto")
    store = terminal.open_store(s.db, write=True)
    p = s.profile_obj
    terminal.note(
        f"kioku serving on http://{host}:{port} → {s.llm_url} (profile {p.name}, "
        f"reply timeout {p.reply_timeout_s:g} s, {workers} process"
        f"{'es' if workers > 1 else ''}; console at /console)"
    )
    if not writes_chapters(s):
        terminal.note(
            f"chapters: extractive (profile {p.name}); --summarizer-upstream URL has a model "
            "write them"
        )
    from kioku.service.readiness import startup_line

    if down := startup_line(s):
        terminal.note(down)
    run(s, host=host, port=port, workers=workers, worker=worker, store=store)


def _settle_window(s: Settings, *, given: bool) -> Settings:
    """The window to serve with: the one given (`--window N` or KIOKU_WINDOW), else the one
    the upstream says, probed again while serving to follow a change."""
    if s.window is not None:
        terminal.note(f"window {s.window} from {'--window' if given else 'KIOKU_WINDOW'}")
        return s
    from kioku.service.discovery import find_window

    assert s.llm_url is not None
    found = find_window(s.llm_url, model=s.llm_model, api_key=s.api_key)
    found = found.within(s.profile_obj.window)
    terminal.note(found.line())
    if found.warning:
        terminal.note(f"warning: {found.warning}")
    # and again while serving, to follow a change (env KIOKU_WINDOW_PROBE_S)
    return s.with_(window=found.size, window_probe_s=s.window_probe_s or WINDOW_PROBE_S)


def _window(value: str) -> int | None:
    """--window: "auto" (None: ask the upstream, unless KIOKU_WINDOW names a size) or tokens."""
    from kioku.config import window_size

    try:
        return window_size(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: give auto or a number of tokens", param_hint="--window"
        ) from None


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="The tenant the key reaches.")],
    db: DbOpt = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="What the key may do: chat (the proxy), read (the REST API's reads), operator "
            "(edit notes and memory, cut; reads too). Repeatable or comma-separated; "
            "default: all three.",
        ),
    ] = None,
) -> None:
    """Create an API key; the key is printed once, as the last line.

    Example: kioku keys create --db kioku.db acme --scope chat
    """
    from kioku.service.keys import create_key, parse_scopes

    scopes = parse_scopes(scope)
    key, text = create_key(terminal.open_store(settings(db).db, write=True), tenant, scopes)
    typer.echo(
        f"key id {key.id} for tenant {key.tenant}, scopes {','.join(key.scopes)} "
        "(store it now: it is not kept)"
    )
    typer.echo(text)


@keys_app.command("list")
def keys_list(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """List API keys (ids and tenants; the keys themselves are not stored).

    Example: kioku keys list --db kioku.db
    """
    from kioku.service.keys import list_keys

    keys = list_keys(terminal.open_store(settings(db).db, write=False))
    if as_json:
        emit([k.__dict__ for k in keys])
        return
    if not keys:
        terminal.note("no API keys yet (`kioku keys create TENANT` makes one)")
        return
    terminal.table(
        ("key id", "tenant", "scopes", "created", "revoked"),
        [
            (
                k.id,
                k.tenant,
                ",".join(k.scopes),
                terminal.when(k.created_at),
                terminal.when(k.revoked_at),
            )
            for k in keys
        ],
    )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (`kioku keys list`).")],
    db: DbOpt = None,
) -> None:
    """Revoke an API key (a running server stops accepting it within seconds).

    Example: kioku keys revoke --db kioku.db 3f2a9c1b7d40
    """
    from kioku.service.keys import revoke_key

    key = revoke_key(terminal.open_store(settings(db).db, write=True), key_id)
    typer.echo(f"revoked key {key.id} of tenant {key.tenant}")


def delete(
    conversation: ConvArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    db: DbOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a conversation and everything kept of it: its messages and their earlier
    versions, memory, notes and their ledger, summary jobs, the recall index, events and media.
    It cannot be undone: `kioku export ID --out ID.jsonl` first keeps a copy that `kioku import`
    reads back. Safe while `kioku serve` runs: a turn in flight finishes first. The id is free
    again afterwards.

    Example: kioku delete mika --db kioku.db
    """
    s = settings(db)
    store = terminal.open_store(s.db, write=True)
    tenant = terminal.pick_tenant(store, tenant)
    info = terminal.find_conversation(store, conversation, tenant)
    name = info.public_id or conversation
    if not yes:
        typer.confirm(
            f"delete {name!r} of tenant {tenant!r} ({plural(info.next_seq, 'message')}, "
            f"memory, notes and everything else of it)? It cannot be undone; "
            f"`kioku export {name} --out {name}.jsonl` keeps a copy",
            abort=True,
            err=True,
        )
    import asyncio

    wait_s = s.profile_obj.reply_timeout_s + s.profile_obj.connect_timeout_s
    done = asyncio.run(_delete(store, tenant, name, wait_s))
    if as_json:
        emit({"id": done.conversation, "tenant": tenant, "deleted": done.rows})
        return
    messages = done.rows.get("messages", 0)
    terminal.text(
        f"deleted {name!r} (tenant {tenant!r}): {plural(messages, 'message')}, "
        f"{plural(done.total, 'row')} in {plural(len(done.rows), 'table')}; the id is free again"
    )


async def _delete(store: Store, tenant: str, conversation: str, wait_s: float) -> Deleted:
    """The delete under the conversation's turn lock, as `kioku serve` takes it: this process
    is one more owner of the store's lock."""
    import asyncio

    from kioku.service.deletion import delete_conversation
    from kioku.service.slot import Slot
    from kioku.service.turns import Gate

    tasks: set[asyncio.Task[object]] = set()

    def spawn(coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    slots: dict[tuple[str, str], Slot] = {}

    def slot(tenant: str, key: str) -> Slot:
        return slots.setdefault((tenant, key), Slot())

    def waiting() -> None:
        terminal.note(f"waiting for the turn of {conversation!r} in flight to finish…")

    gate = Gate(store, wait_s=wait_s, spawn=spawn, slot=slot)
    try:
        return await delete_conversation(gate, tenant, conversation, waiting=waiting)
    finally:
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def bench_serve(
    conversations: Annotated[
        int, typer.Option("--conversations", help="Conversations running at once.")
    ] = 20,
    turns: Annotated[int, typer.Option("--turns", help="Turns per conversation.")] = 20,
    upstream_ms: Annotated[
        float, typer.Option("--upstream-ms", help="How long the fake upstream takes to answer.")
    ] = 20.0,
    think_ms: Annotated[
        float, typer.Option("--think-ms", help="Mean pause between a reply and the next turn.")
    ] = 500.0,
    processes: Annotated[
        str,
        typer.Option(
            "--processes", help="Process counts for the saturated load (kioku serve --workers)."
        ),
    ] = "1",
    db: Annotated[
        str | None,
        typer.Option("--db", help="Database URL (default: a temporary SQLite file)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """kioku's added latency on loopback: a fake upstream answering in fixed time, N concurrent
    conversations × M turns, direct and through kioku in the same run; saturated (always N in
    flight) for each process count.

    Example: kioku bench serve --processes 1,2,4 --db postgresql://kioku:kioku@127.0.0.1/kioku --json
    """
    from kioku.service.bench import run

    result = run(
        conversations=conversations,
        turns=turns,
        upstream_ms=upstream_ms,
        think_ms=think_ms,
        processes=[int(x) for x in processes.split(",") if x.strip()],
        db=db,
    )
    if as_json:
        emit(result)
    else:
        terminal.text("\n".join(terminal.outline(result)))


def bench_sync(
    sizes: Annotated[str, typer.Option("--sizes", help="Transcript lengths, comma-separated.")] = (
        "2000,20000"
    ),
    as_json: JsonOpt = False,
) -> None:
    """CPU a stateless client's transcript costs to sync (first request, next turn, and a chat
    of repeated messages), per transcript length: it must grow linearly.

    Example: kioku bench sync --sizes 2000,20000 --json
    """
    from kioku.bench.sync import run

    result = run([int(x) for x in sizes.split(",") if x.strip()])
    if as_json:
        emit(result)
    else:
        terminal.text("\n".join(terminal.outline(result)))


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("delete")(delete)
    app.command("worker")(worker_command)
    app.add_typer(keys_app, name="keys")
    for group in app.registered_groups:
        if group.name == "bench" and group.typer_instance is not None:
            group.typer_instance.command("serve")(bench_serve)
            group.typer_instance.command("sync")(bench_sync)
