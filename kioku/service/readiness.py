"""Is this `kioku serve` ready to answer a turn? `GET /readyz`, and the line `serve` prints at
start when it is not.

`/healthz` says the process runs (a supervisor restarts it when it stops answering);
readiness says whether what a turn needs answers: the upstream (one GET of its `/models`, a
few seconds at most) and the database (one trivial read of kioku's schema), and the
chronicler's model when it is another server. `/readyz` answers 200 when all do, else 503
with which is down and why. It needs no key and says nothing an anonymous caller should not
know: no URL, no conversation, no database error text (that may name hosts and users), only
the kind of failure. `kioku serve` asks the same of the upstream before it listens and prints
one line when it cannot be reached; it starts all the same (the upstream may come up later).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from kioku.client import api_root
from kioku.errors import ConfigError, StoreError
from kioku.tls import tls_context

if TYPE_CHECKING:
    from kioku.config import Settings
    from kioku.service.state import Service
    from kioku.store import Store

DEFAULT_READY_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Check:
    name: str  # "upstream", "database", "chronicler"
    ok: bool
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **({"error": self.why} if self.why else {})}


def _status_problem(status: int) -> str | None:
    """What an HTTP answer to `GET /models` says is wrong, or None: a server that answers
    is up, even with a 404 (not every server lists its models)."""
    if status in (401, 403):
        return f"refused kioku's key ({status}); set KIOKU_LLM_API_KEY"
    if status >= 500:
        return f"answered {status} (still loading, or failing)"
    return None


def _error_problem(e: httpx.HTTPError, timeout_s: float) -> str:
    if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot connect ({type(e).__name__})"
    if isinstance(e, httpx.TimeoutException):
        return f"no answer within {timeout_s:g} s"
    return f"the connection failed ({type(e).__name__})"


def _check(name: str, status: int | None, error: httpx.HTTPError | None, timeout_s: float) -> Check:
    if error is not None:
        return Check(name, False, _error_problem(error, timeout_s))
    problem = _status_problem(status or 0)
    return Check(name, problem is None, problem or "")


async def upstream_check(
    http: httpx.AsyncClient,
    root: str,
    name: str = "upstream",
    timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> Check:
    """One GET of `root`/models on `http` (its key and TLS), within `timeout_s`."""
    try:
        r = await http.get(f"{root}/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        return _check(name, None, e, timeout_s)
    return _check(name, r.status_code, None, timeout_s)


def upstream_check_sync(
    url: str,
    api_key: str | None = None,
    name: str = "upstream",
    timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> Check:
    """The same check without an event loop (before `serve` starts one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        root = api_root(url)
    except ConfigError as e:
        return Check(name, False, str(e))
    try:
        r = httpx.get(f"{root}/models", headers=headers, timeout=timeout_s, verify=tls_context())
    except httpx.HTTPError as e:
        return _check(name, None, e, timeout_s)
    return _check(name, r.status_code, None, timeout_s)


async def database_check(store: Store, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> Check:
    """One trivial read (`Store.ping`) in a thread, within `timeout_s`."""
    try:
        await asyncio.wait_for(run_in_threadpool(store.ping), timeout_s)
    except TimeoutError:
        return Check("database", False, f"no answer within {timeout_s:g} s")
    except StoreError as e:
        return Check("database", False, str(e))
    return Check("database", True)


def _chronicler_url(settings: Settings) -> str | None:
    """The chronicler's own server, when it is not the upstream."""
    url = settings.summarizer_url
    return url if url and url.rstrip("/") != (settings.llm_url or "").rstrip("/") else None


async def readiness(svc: Service, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> list[Check]:
    """Every check of `/readyz`, run at once."""
    up = svc.upstream
    checks = [upstream_check(up.http, up.root, timeout_s=timeout_s)]
    checks.append(database_check(svc.store, timeout_s))
    chronicler = _chronicler_url(svc.settings)
    if chronicler:
        checks.append(
            run_in_threadpool(
                upstream_check_sync, chronicler, svc.settings.api_key, "chronicler", timeout_s
            )
        )
    return list(await asyncio.gather(*checks))


def startup_line(settings: Settings, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> str | None:
    """The line `kioku serve` prints before it listens when the upstream (or the chronicler's
    server) cannot be reached; None when it answers."""
    servers = [("upstream", settings.llm_url)]
    if chronicler := _chronicler_url(settings):
        servers.append(("chronicler", chronicler))
    down = []
    for name, url in servers:
        if not url:
            continue
        check = upstream_check_sync(url, settings.api_key, name, timeout_s)
        if not check.ok:
            down.append(f"the {name} at {url} is unreachable: {check.why}")
    if not down:
        return None
    return "; ".join(down) + ". kioku serves anyway: turns answer 502 until it is up (GET /readyz)"


router = APIRouter(tags=["operations"])


@router.get(
    "/readyz",
    summary="Readiness: the upstream and the database answer (no key needed, no data)",
    response_model=None,
)
async def readyz(request: Request) -> JSONResponse:
    checks = await readiness(request.app.state.service)
    down = [c.name for c in checks if not c.ok]
    body = {"ok": not down, "down": down, "checks": {c.name: c.to_json() for c in checks}}
    return JSONResponse(body, status_code=503 if down else 200)
