"""What the service admits: a body size limit enforced before parsing, strict JSON, a cap on
messages per request.

A request kioku can never serve must be refused before it costs memory, CPU or a row in the
log. Measured before these limits: four concurrent 50 MB bodies took the server from 261 MB to
1.4 GB; a 100,000-message transcript took 175 s of CPU; a lone surrogate or a `NaN` became a 500
after the user message was stored. So:

- `BodyLimit` (ASGI middleware) answers 413 from `Content-Length` without reading the body, and
  stops reading a body without one as soon as it passes the limit;
- `StrictJSONRoute` parses the body once, strictly, before FastAPI validates it: it must say it is
  JSON (415 otherwise), be UTF-8, nest at most `MAX_JSON_DEPTH` deep (measured before parsing:
  a body nested 1,000 deep was a `RecursionError`, a 500), hold no `NaN`/`Infinity`, no number
  beyond 64 bits, no lone UTF-16 surrogate (none of which the database, the upstream or the
  JSON encoder can take); `messages` beyond the cap answer 413.

Every refusal is a 4xx in the OpenAI error shape, before anything is stored.
"""

from __future__ import annotations

import email.message
import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kioku.errors import InputError, NotJSON, RequestTooLarge, error_body

INT_LIMIT = 2**64  # what upstreams (C++ servers) can hold in a seed or a logit-bias key
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Far deeper than any chat request (a tool's JSON schema nests a few levels), far below the
# interpreter's recursion limit, which parsing, validating and encoding a body each recurse into.
MAX_JSON_DEPTH = 100
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"the request body is over {_mib(limit)} (kioku serve --max-body); send less history "
        "(kioku already has it: a stateful client sends only the new message)"
    )


def refusal(message: str, code: str) -> bytes:
    return json.dumps(error_body(message, "invalid_request_error", code)).encode()


class BodyLimit:
    """Refuse a body over `max_bytes` with 413 before the app reads it into memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            body = refusal(str(too_large(self.max_bytes)), "request_too_large")
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    # the unread body makes the connection unusable: say so, and close it
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large(self.max_bytes)
            return message

        await self.app(scope, counted, send)


# json.loads lets what these raise pass through unchanged


def _no_constant(name: str) -> Any:
    raise InputError(f"invalid JSON body: {name} is not a JSON number; send a finite number")


def _int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 20 or abs(int(text)) >= INT_LIMIT:
        raise InputError(
            f"invalid JSON body: the number {text[:24]}… is out of range (integers of at most "
            "64 bits)"
        )
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(
            f"invalid JSON body: the number {text[:24]} is out of range (it overflows a double)"
        )
    return value


def json_depth(text: str) -> int:
    """How deep JSON text nests its arrays and objects, without parsing it (brackets inside
    strings do not count): in C and numpy, so an 8 MiB body of brackets costs milliseconds."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0  # cannot be too deep: not worth measuring
    bare = np.frombuffer(_JSON_STRING.sub("", text).encode("utf-8", "replace"), dtype=np.uint8)
    steps = np.zeros(bare.shape, dtype=np.int32)
    steps[(bare == ord("[")) | (bare == ord("{"))] = 1
    steps[(bare == ord("]")) | (bare == ord("}"))] = -1
    return int(np.cumsum(steps).max(initial=0))


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, refusing what kioku could not store or forward (`InputError`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"the body is not UTF-8 (bad byte at offset {e.start}); send JSON encoded as UTF-8"
        ) from None
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InputError(
            f"the body nests {depth} levels deep; kioku takes JSON nested at most "
            f"{MAX_JSON_DEPTH} deep (no chat request needs more)"
        )
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as e:
        raise InputError(
            f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    except RecursionError:  # the depth check above keeps valid JSON from getting here
        raise InputError(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    if _SURROGATE_ESCAPE.search(text):
        # a pair of escapes is one valid character; only a lone half cannot be encoded
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(
                "the body holds a lone UTF-16 surrogate escape (such as \\udc80) that is no "
                "character; send valid Unicode text"
            ) from None
    return value


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # FastAPI reads a body without a content type as JSON
    m = email.message.Message()
    m["content-type"] = content_type
    sub = m.get_content_subtype()
    return m.get_content_maintype() == "application" and (sub == "json" or sub.endswith("+json"))


def _cap_messages(request: Request, data: Any) -> None:
    limit = getattr(request.app.state, "max_messages", None)
    messages = data.get("messages") if isinstance(data, dict) else None
    if limit is not None and isinstance(messages, list) and len(messages) > limit:
        raise RequestTooLarge(
            f"the request has {len(messages)} messages; kioku takes at most {limit} per request "
            "(kioku serve --max-messages): send the recent ones, kioku already has the rest"
        )


class StrictJSONRoute(APIRoute):
    """A route whose JSON body is parsed by `parse_json` (once: FastAPI reuses the result)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            if request.method in ("POST", "PUT", "PATCH"):
                raw = await request.body()
                if raw:
                    content_type = request.headers.get("content-type")
                    if not is_json(content_type):
                        raise NotJSON(
                            f"the body must be JSON, sent with the header Content-Type: "
                            f"application/json (got {content_type!r})"
                        )
                    data = parse_json(raw)
                    _cap_messages(request, data)
                    request._json = data  # what FastAPI's `await request.json()` returns
            return await handler(request)

        return strict
