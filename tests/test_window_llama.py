"""A real llama-cpp-python server (`-c 4096`) behind a real `kioku serve` with no `--window`
(issue 42.1). Its Python server reports no size: kioku must say so at start, naming `--window`,
and learn the size from its first refusal, so one turn fails at most and every turn after it
fits. The chronicler's model is a fake (this test is about the window, not the chapters)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.datasets import load_locomo
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream
from kioku.store import Store
from kioku.tls import tls_context
from tests.conftest import shared_file
from tests.killable import Server
from tests.llama import N_CTX, LlamaServer, llama_server

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
