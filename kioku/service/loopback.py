"""Loopback doubles for the service's tests and benchmark: a fake OpenAI-compatible upstream and
a uvicorn server in a thread.

`FakeUpstream` is a small asyncio HTTP/1.1 server (no framework, so it costs the benchmark
little CPU) that answers `POST /v1/chat/completions` (JSON or SSE) after a fixed delay and
records every request body it got, so a test can read the prompt kioku sent. Replies come from
`reply(body) -> str | dict` (a dict is a whole completion payload, e.g. to script
`finish_reason: "length"`, tool calls or several choices; streamed, every choice's content and
tool calls go out as deltas), failures from `fail(body) -> int | None` (an HTTP status to
answer, with `error` as the error object), `garbage` is a raw line a stream sends after its
first delta, and any other answer comes from `raw(body) -> (status, content type, bytes) | None`
(e.g. a 200 that is not the SSE a streamed request asked for). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

Reply = Callable[[dict[str, Any]], "str | dict[str, Any]"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_answers(
    url: str,
    *,
    alive: Callable[[], bool] = lambda: True,
    timeout_s: float = 120.0,
    poll_s: float = 0.1,
    request_timeout_s: float = 1.0,
) -> bool:
    """Poll `url` until it answers 200 (True). False as soon as `alive()` says the server's
    process is gone, or once `timeout_s` has passed: the caller says which, with its log."""
    import httpx

    from kioku.tls import tls_context

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            # one TLS context for every poll: httpx would load the CA bundle (0.2 s) each time
            if httpx.get(url, timeout=request_timeout_s, verify=tls_context()).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    return False


def default_reply(body: dict[str, Any]) -> str:
    last = body["messages"][-1]["content"] if body.get("messages") else ""
    # what the user wrote, without the date line kioku puts in front of a new day's message
    said = re.sub(r"^⟦[^⟧\n]*⟧\n", "", str(last))
    return f"(reply to: {said[-60:]})"


class FakeUpstream:
    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        reply: Reply = default_reply,
        fail: Callable[[dict[str, Any]], int | None] | None = None,
        model: str = "fake-model",
        chunk_delay_s: float = 0.0,
    ) -> None:
        self.delay_s = delay_s
        self.reply = reply
        self.fail = fail
        self.raw: Callable[[dict[str, Any]], tuple[int, str, bytes] | None] | None = None
        # a server's own routes (method, path, body) → (status, JSON body), None: not served
        self.route: Callable[[str, str, bytes], tuple[int, Any] | None] | None = None
        self.model = model
        self.chunk_delay_s = chunk_delay_s
        self.error: dict[str, Any] | None = None
        self.garbage: bytes | None = None
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if "messages" in r]

    # the server -----------------------------------------------------------------------------

    def start(self) -> FakeUpstream:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=512)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-upstream", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                size = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(size) if size else b""
                keep = headers.get("connection", "").lower() != "close"
                await self._respond(method, path, raw, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the server is stopping
        finally:
            writer.close()

    async def _respond(
        self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter
    ) -> None:
        routed = self.route(method, path, raw) if self.route else None
        if routed is not None:
            return self._send(writer, routed[0], json.dumps(routed[1]).encode())
        if method == "GET" and path.endswith("/models"):
            body = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            return self._send(writer, 200, json.dumps(body).encode())
        if method != "POST" or not path.endswith("/chat/completions"):
            return self._send(writer, 404, b'{"error": {"message": "no such route"}}')
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._send(writer, 400, b'{"error": {"message": "not JSON"}}')
        with self._lock:
            self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        status = self.fail(body) if self.fail else None
        if status:
            error = self.error or {"message": f"scripted failure {status}"}
            return self._send(writer, status, json.dumps({"error": error}).encode())
        scripted = self.raw(body) if self.raw else None
        if scripted is not None:
            return self._send(writer, scripted[0], scripted[2], scripted[1])
        payload = self._payload(body)
        if body.get("stream"):
            await self._stream(writer, payload)
        else:
            self._send(writer, 200, json.dumps(payload).encode())
        await writer.drain()

    def _payload(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self.reply(body)
        if isinstance(out, dict):
            return out
        prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", ())) // 4
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": out},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": len(out) // 4,
                "total_tokens": prompt + len(out) // 4,
            },
        }

    async def _stream(self, writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        base = {"id": payload["id"], "object": "chat.completion.chunk", "model": payload["model"]}
        events: list[dict[str, Any]] = []
        for choice in payload["choices"]:
            events += [{**base, "choices": [{"index": choice["index"], "delta": d}]}
                       for d in _deltas(choice["message"])]  # fmt: skip
            events.append(
                {
                    **base,
                    "choices": [
                        {
                            "index": choice["index"],
                            "delta": {},
                            "finish_reason": choice["finish_reason"],
                        }
                    ],
                }
            )
        for n, ev in enumerate(events):
            self._chunk(writer, f"data: {json.dumps(ev)}\n\n".encode())
            if n == 1 and self.garbage:
                self._chunk(writer, self.garbage)
            await writer.drain()
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        self._chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    @staticmethod
    def _send(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/json",
    ) -> None:
        reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Error")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )


def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message as a server streams it: the role, the text in pieces of 8 characters, each
    tool call's id and name, then its arguments in two pieces."""
    text = message.get("content") or ""
    out: list[dict[str, Any]] = [{"role": "assistant"}]
    out += [{"content": text[i : i + 8]} for i in range(0, len(text), 8)] or [{"content": ""}]
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        head = {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"]}}
        out.append({"tool_calls": [head]})
        half = len(fn["arguments"]) // 2
        for piece in (fn["arguments"][:half], fn["arguments"][half:]):
            out.append({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    return out


class ServerThread:
    """uvicorn serving an ASGI app on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any, port: int | None = None, **config: Any) -> None:
        self.port = port or free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", **config
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> ServerThread:
        self._thread = threading.Thread(target=self.server.run, name="kioku-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("kioku serve did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(15)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
