"""The FastAPI app: `create_app(settings, …)` wires a store, the upstream, API keys, a `Kioku`
per tenant and (by default) an embedded summary worker.

Routes: `POST /v1/chat/completions`, `GET /v1/models` and `GET /v1/models/{id}` (the
OpenAI-compatible proxy; `POST /v1/completions` answers a clear error, see `conventions`), the
REST API under `/v1/conversations` (see `api`), `GET /metrics`, the console at `/console`, the
schema at `/openapi.json`, `GET /healthz` (the process's liveness) and `GET /readyz` (the upstream
and the database answer: `kioku.service.readiness`), neither with a key nor with data. Every error answers JSON in
OpenAI's shape `{"error": {"message", "type", "param", "code"}}` (`code` a string or null), never
a stack trace.

Turns of one conversation take turns, in this process and across every `kioku serve` process
on the same database (`kioku.service.turns`), which keeps a stateless client's sync exact and
lets any process serve any conversation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from kioku import __version__
from kioku.config import Settings
from kioku.engine import Kioku
from kioku.errors import (
    BadParameter,
    ConfigError,
    ContextOverflow,
    Forbidden,
    InputError,
    KeyReused,
    KiokuError,
    MessageTooLarge,
    ModelError,
    ModelTimeout,
    ModeUnclear,
    NameTaken,
    NotFound,
    NotJSON,
    RequestTooLarge,
    StoreError,
    SyncConflict,
    TurnInProgress,
    Unauthorized,
    UpstreamError,
    error_body,
)
from kioku.profiles import Profile
from kioku.service import proxy
from kioku.service.api import router as api_router
from kioku.service.auth import tenant_of
from kioku.service.client_api import router as client_router
from kioku.service.console_api import router as console_router
from kioku.service.conventions import COMPLETIONS_REFUSED
from kioku.service.deletion import router as deletion_router
from kioku.service.limits import BodyLimit, StrictJSONRoute
from kioku.service.paths import ConversationPaths
from kioku.service.readiness import router as readiness_router
from kioku.service.state import Service
from kioku.service.status import router as status_router
from kioku.service.upstream import Upstream
from kioku.store import Store

log = logging.getLogger("kioku.service")

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"

Tenant = Annotated[str, Depends(tenant_of)]


def error_response(
    status: int,
    message: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=status, headers=headers)


def kioku_error(e: KiokuError) -> JSONResponse:
    status, kind, code, param = 500, "server_error", None, None
    headers: dict[str, str] | None = None
    if isinstance(e, NotFound):
        status, kind, code = 404, "not_found_error", "not_found"
    elif isinstance(e, Forbidden):
        status, kind, code = 403, "permission_error", "insufficient_scope"
    elif isinstance(e, SyncConflict):
        status, kind, code = 409, "conflict_error", "transcript_conflict"
    elif isinstance(e, NameTaken):
        status, kind, code = 409, "conflict_error", "name_taken"
    elif isinstance(e, ModeUnclear):
        status, kind, code = 409, "conflict_error", "mode_unclear"
    elif isinstance(e, ContextOverflow) and e.cause != "raw":
        # kioku's memory (or the card) is what does not fit: not the request's fault
        status, kind, code = 503, "server_error", "memory_over_budget"
    elif isinstance(e, MessageTooLarge | ContextOverflow):
        status, kind, code = 400, "invalid_request_error", "context_length_exceeded"
    elif isinstance(e, BadParameter):
        status, kind, code, param = 400, "invalid_request_error", e.code, e.param
    elif isinstance(e, RequestTooLarge):
        status, kind, code = 413, "invalid_request_error", "request_too_large"
    elif isinstance(e, NotJSON):
        status, kind, code = 415, "invalid_request_error", "unsupported_media_type"
    elif isinstance(e, KeyReused):
        status, kind, code = 422, "invalid_request_error", "idempotency_key_reused"
        param = "Idempotency-Key"
    elif isinstance(e, TurnInProgress):
        status, kind, code = 409, "conflict_error", "turn_in_progress"
        headers = {"Retry-After": str(max(1, round(e.retry_after_s)))}
    elif isinstance(e, InputError):
        status, kind = 400, "invalid_request_error"
    elif isinstance(e, StoreError):
        status, kind, code = 503, "store_busy", "store_busy"
    elif isinstance(e, ModelTimeout):
        status, kind, code = 504, "upstream_timeout", "upstream_timeout"
    elif isinstance(e, ModelError):
        status, kind, code = 502, "upstream_error", "upstream_error"
    elif isinstance(e, ConfigError):
        kind, code = "config_error", "config_error"
    return error_response(status, str(e), kind, headers, code=code, param=param)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(Unauthorized)
    async def _unauthorized(_: Request, e: Unauthorized) -> Response:
        return error_response(
            401,
            e.message,
            "authentication_error",
            {"WWW-Authenticate": "Bearer"},
            code="invalid_api_key",
        )

    @app.exception_handler(UpstreamError)
    async def _upstream(_: Request, e: UpstreamError) -> Response:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(KiokuError)
    async def _kioku(_: Request, e: KiokuError) -> Response:
        return kioku_error(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> Response:
        def where(err: Any) -> str:
            # ("body", "messages", 0, "role") -> "messages.0.role", as OpenAI names a param
            loc = [str(p) for p in err.get("loc", ())]
            return ".".join(loc[1:] if len(loc) > 1 and loc[0] == "body" else loc)

        errors = e.errors()
        problems = "; ".join(f"{where(err)}: {err.get('msg', '')}" for err in errors[:5])
        return error_response(
            400,
            f"invalid request: {problems}",
            "invalid_request_error",
            code="invalid_value",
            param=where(errors[0]) if errors else None,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> Response:
        message, code = str(e.detail), None
        if e.status_code == 404 and e.detail == "Not Found":
            message = (
                f"no route {request.method} {request.url.path}; kioku serves "
                "/v1/chat/completions, /v1/models and /v1/conversations (see /docs)"
            )
            code = "unknown_url"
        elif e.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            code = "method_not_allowed"
        return error_response(e.status_code, message, "invalid_request_error", e.headers, code=code)

    @app.exception_handler(Exception)
    async def _crash(_: Request, e: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(
            500, f"internal error ({type(e).__name__}); see the server log", "server_error"
        )


def _proxy_routes(app: FastAPI, svc: Service) -> None:
    """The OpenAI-compatible routes: chat through memory; the upstream's models."""

    @app.post(
        "/v1/chat/completions",
        tags=["proxy"],
        summary="Chat with memory (OpenAI-compatible; streaming or not)",
        response_model=None,
    )
    async def chat_completions(request: Request, body: proxy.ChatBody, tenant: Tenant) -> Response:
        raw = await request.body()  # read once already; names the request (kioku.service.turns)
        return await proxy.chat(svc, body, tenant, dict(request.headers), raw)

    @app.get("/v1/models", tags=["proxy"], summary="The upstream's models", response_model=None)
    async def models(tenant: Tenant) -> Response:
        return JSONResponse(await svc.upstream.models())

    @app.get(
        "/v1/models/{model_id:path}",
        tags=["proxy"],
        summary="One of the upstream's models",
        response_model=None,
    )
    async def model(model_id: str, tenant: Tenant) -> Response:
        listed = (await svc.upstream.models()).get("data") or []
        found = next((m for m in listed if isinstance(m, dict) and m.get("id") == model_id), None)
        if found is None:
            ids = ", ".join(str(m.get("id")) for m in listed if isinstance(m, dict))
            return error_response(
                404,
                f"the upstream has no model {model_id!r}; it serves: {ids or 'none'}",
                "invalid_request_error",
                code="model_not_found",
                param="model",
            )
        return JSONResponse(found)

    @app.post(
        "/v1/completions",
        tags=["proxy"],
        summary="Not served: kioku remembers chats (use /v1/chat/completions)",
        response_model=None,
    )
    async def completions(tenant: Tenant) -> Response:
        return error_response(
            404, COMPLETIONS_REFUSED, "invalid_request_error", code="unsupported_endpoint"
        )


def _operations_routes(app: FastAPI, svc: Service) -> None:
    """What an operator reads: metrics and liveness (readiness has its own router)."""

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics of the key's tenant",
        response_class=PlainTextResponse,
    )
    def metrics(tenant: Tenant) -> PlainTextResponse:
        return PlainTextResponse(
            svc.metrics.render(svc.store, tenant), media_type="text/plain; version=0.0.4"
        )

    @app.get("/healthz", tags=["operations"], summary="Liveness (no key needed, no data)")
    def healthz() -> dict[str, Any]:
        return {"ok": True}


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    make_kioku: Callable[[str, Store], Kioku] | None = None,
    worker: bool = True,
    worker_poll_s: float = 1.0,
    profile: Profile | None = None,
) -> FastAPI:
    """The service. Tests inject `store`, `upstream` (e.g. with an httpx transport) and
    `make_kioku(tenant, store)` (e.g. an extractive summarizer) and the `profile` (timeouts,
    response reserve) that `make_kioku` uses; `worker=False` leaves the summaries to
    `kioku worker` processes."""
    svc = Service(
        settings,
        store=store,
        upstream=upstream,
        make_kioku=make_kioku,
        worker=worker,
        worker_poll_s=worker_poll_s,
        profile=profile,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(
        title="kioku",
        version=__version__,
        summary="Long-term memory for one very long LLM conversation, as an OpenAI-compatible "
        "proxy.",
        lifespan=lifespan,
    )
    app.state.service = svc
    app.state.max_messages = settings.max_messages
    app.router.route_class = StrictJSONRoute  # set before the routes are added
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ConversationPaths)  # a chat name with a `/`, percent-encoded
    _install_handlers(app)

    _proxy_routes(app, svc)
    _operations_routes(app, svc)
    app.include_router(readiness_router)
    app.include_router(api_router)
    app.include_router(console_router)
    app.include_router(status_router)
    app.include_router(client_router)
    app.include_router(deletion_router)
    if settings.cors_origins:
        # a front end's page (SillyTavern with the kioku extension) reads memory, presses cut
        # and deletes (a DELETE is preflighted: it must be allowed here)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["X-Kioku-Conversation", "X-Kioku-Seq", "X-Kioku-Memory-Version"],
            max_age=600,
        )
    if CONSOLE_DIR.is_dir():
        app.mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")
    return app
