"""`Authorization: Bearer KEY` on every route: the key names the tenant, nothing else does."""

from __future__ import annotations

from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from kioku.errors import Unauthorized

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="kiokuKey",
    description="A kioku API key, from `kioku keys create --db URL TENANT`.",
)


async def tenant_of(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> str:
    if credentials is None or not credentials.credentials:
        raise Unauthorized("send your kioku API key: Authorization: Bearer KEY")
    keys = request.app.state.service.keys
    key = credentials.credentials
    tenant = keys.cached(key)
    if tenant is None:
        tenant = await run_in_threadpool(keys.tenant, key)
    if tenant is None:
        raise Unauthorized("unknown or revoked API key; create one with `kioku keys create`")
    return str(tenant)
