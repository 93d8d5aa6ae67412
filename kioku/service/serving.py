"""Running the service in one process or several: `kioku serve --workers N`.

One process serves on one event loop, and a turn spends a few milliseconds of CPU there (the
sync, the prompt, the store), so one process saturates one core. `--workers N` starts N
processes on one listening socket (uvicorn's supervisor; the kernel hands each connection to
one of them). Any process may serve any conversation: the turn lock in the database makes them
take turns (`kioku.service.turns`), so several processes, or several hosts, on one database
(PostgreSQL: SQLite has one writer at a time) are as correct as one. Summaries run in every
process (`--worker`) or in `kioku worker` processes (`--no-worker`); jobs are claimed with a
lease, so any number of workers is safe.

The worker processes are spawned, not forked: each builds its app from the environment
(`from_environment`), which `serve` fills from the settings (`kioku.config.to_env`).
"""

from __future__ import annotations

import os

from fastapi import FastAPI

from kioku.config import Settings, from_env, to_env
from kioku.service.logs import log_config
from kioku.store import Store

EMBEDDED_WORKER_ENV = "KIOKU_SERVE_WORKER"  # "0": leave summaries to `kioku worker`


def from_environment() -> FastAPI:
    """The app of one of `serve --workers N`'s processes (a uvicorn factory)."""
    from kioku.service.app import create_app

    return create_app(from_env(), worker=os.environ.get(EMBEDDED_WORKER_ENV, "1") != "0")


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    worker: bool = True,
    log_level: str = "info",
    access_log: bool = True,
    store: Store | None = None,
) -> None:
    """Serve until stopped, in `workers` processes (one serves on `store` if given; several
    open their own)."""
    import uvicorn

    if workers <= 1:
        from kioku.service.app import create_app

        target: FastAPI | str = create_app(settings, store=store, worker=worker)
    else:
        if store is not None:
            store.close()  # opened (and migrated) here; each process opens its own
        os.environ.update(to_env(settings))
        os.environ[EMBEDDED_WORKER_ENV] = "1" if worker else "0"
        target = "kioku.service.serving:from_environment"
    uvicorn.run(
        target,
        factory=workers > 1,
        workers=workers if workers > 1 else None,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(log_level),
        access_log=access_log,
        timeout_graceful_shutdown=30,
    )
