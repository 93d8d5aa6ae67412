"""`Authorization: Bearer KEY` on every route: the key names the tenant, nothing else does, and
its scopes say what it may do there (`kioku.service.keys`).

The scope a request needs follows from what it is, so every route is covered without naming
it: the proxy (`/v1/chat/completions`, `/v1/models`) and what a chat client does to its own chat
beside it (`…/sync` its whole transcript after an edit, `…/rename`) need `chat`; reading (GET)
needs `read`; anything else that changes memory (PUT, POST, DELETE under `/v1/conversations`:
notes, a corrected line, a cut, summarize now) needs `operator`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from kioku.errors import Forbidden, Unauthorized

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="kiokuKey",
    description="A kioku API key, from `kioku keys create --db URL TENANT`.",
)

CHAT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")
CHAT_ACTIONS = ("/sync", "/rename")  # a client's own chat, under /v1/conversations/{id}
READING = ("GET", "HEAD", "OPTIONS")


def scope_of(method: str, path: str) -> str:
    """The scope a request needs."""
    if path.startswith(CHAT_PATHS):
        return "chat"
    # a POST only: DELETE of a conversation named "sync" is an operator's delete
    chat_action = path.startswith("/v1/conversations/") and path.endswith(CHAT_ACTIONS)
    if chat_action and method.upper() == "POST":
        return "chat"
    return "read" if method.upper() in READING else "operator"


async def tenant_of(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> str:
    if credentials is None or not credentials.credentials:
        raise Unauthorized("send your kioku API key: Authorization: Bearer KEY")
    keys = request.app.state.service.keys
    key = credentials.credentials
    grant = keys.cached(key)
    if grant is None:
        grant = await run_in_threadpool(keys.grant, key)
    if grant is None:
        raise Unauthorized("unknown or revoked API key; create one with `kioku keys create`")
    needed = scope_of(request.method, request.url.path)
    if needed not in grant.scopes:
        raise Forbidden(
            f"this key may {', '.join(sorted(grant.scopes))} but not {needed} "
            f"({request.method} {request.url.path}); use a key made with `kioku keys create "
            f"--scope {needed} {grant.tenant}`"
        )
    return grant.tenant
