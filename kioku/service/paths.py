"""Every name the proxy accepts is reachable under `/v1/conversations/{name}/…`, percent-encoded.

The proxy takes any chat name and keeps one a URL path cannot carry under `kioku.ids.key_for`
(`a/b` → `a_b ~1f2e…`). The REST API finds a conversation by that name too, but a name with a
`/` never reached a route: the server decodes `%2F` before routing, so
`/v1/conversations/a%2Fb/memory` was `/v1/conversations/a/b/memory`, no route (404), and a name
over 200 characters was refused by the route's length check. This middleware reads the
conversation's segment from the path as sent (`raw_path`, still encoded) and, for such a name,
routes the request under the id the name is kept under, so every route and its sub-routes
(`…/messages/{seq}/versions`) take it, and the key scopes (`kioku.service.auth`) read the same
path the router does.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from kioku.ids import FORBIDDEN, MAX_ID_LENGTH, key_for

PREFIX = "/v1/conversations/"
_RAW_PREFIX = PREFIX.encode()


def routed(raw_path: bytes) -> str | None:
    """The path to route a request for `raw_path` by, when its conversation segment names a
    chat a path cannot carry as it is; None when the path routes as it is."""
    if not raw_path.startswith(_RAW_PREFIX):
        return None
    segment, sep, rest = raw_path[len(_RAW_PREFIX) :].partition(b"/")
    name = unquote(segment.decode("ascii", "replace"))
    if not (FORBIDDEN & set(name)) and len(name) <= MAX_ID_LENGTH:
        return None
    tail = "/" + unquote(rest.decode("ascii", "replace")) if sep else ""
    return PREFIX + key_for(name) + tail


class ConversationPaths:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        path = routed(raw) if raw else None
        if path is not None:
            scope = {**scope, "path": path, "raw_path": quote(path).encode()}
        await self.app(scope, receive, send)
