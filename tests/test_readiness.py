"""`/readyz` (kioku/service/readiness.py) in process: which answers of the upstream's
`/models` count as up, and what the 503 says (no URL, no key needed)."""

from __future__ import annotations

import asyncio
import importlib.util

import httpx
import pytest

from kioku.config import Settings
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from tests.conftest import need

URL = "http://secret-host.internal:8080/v1"


def readyz(status: int | None) -> httpx.Response:
    """GET /readyz of an app whose upstream answers `/models` with `status` (None: refuses the
    connection)."""
    need(importlib.util.find_spec("fastapi") is not None, "fastapi is not installed")
    from kioku.service.app import create_app
    from kioku.service.upstream import Upstream

    def models(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        if status is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, json={"object": "list", "data": []})

    store = Store.open("sqlite://")
    upstream = Upstream(URL, LOCAL_8K, transport=httpx.MockTransport(models))
    app = create_app(Settings(db="sqlite://", llm_url=URL), store=store, upstream=upstream)

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://kioku"
        ) as h:
            return await h.get("/readyz")

    try:
        return asyncio.run(get())
    finally:
        store.close()


@pytest.mark.parametrize("status", [200, 404])
def test_an_upstream_that_answers_is_ready(status: int) -> None:
    r = readyz(status)
    assert r.status_code == 200, r.text
    assert r.json()["checks"] == {"upstream": {"ok": True}, "database": {"ok": True}}


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (None, "cannot connect (ConnectError)"),
        (503, "answered 503 (still loading, or failing)"),
        (401, "refused kioku's key (401); set KIOKU_LLM_API_KEY"),
    ],
)
def test_an_upstream_down_is_named_without_its_url(status: int | None, error: str) -> None:
    r = readyz(status)
    assert r.status_code == 503
    assert r.json() == {
        "ok": False,
        "down": ["upstream"],
        "checks": {"upstream": {"ok": False, "error": error}, "database": {"ok": True}},
    }
    assert "secret-host" not in r.text
