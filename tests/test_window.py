"""The window is found, not guessed (issue 42.1): a real `kioku serve --upstream URL` with no
`--window` asks the upstream for its context size, keeps every prompt within it through a
dataset chat long enough to fold many times, and uses most of it; a server that says nothing
is named at start, and its first refusal for size teaches kioku the size.

The upstreams are fakes shaped like llama.cpp, Ollama, vLLM, KoboldCpp, LM Studio and
llama-cpp-python (`tests.sized_upstream`): each says its size its own way and refuses (or
silently cuts) a prompt beyond it. The chat is LoCoMo's first conversation: the user says one
speaker's lines, the model answers with the other's.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.datasets import load_locomo
from kioku.service.keys import create_key
from kioku.store import Store
from kioku.tls import tls_context
from tests.conftest import shared_file
from tests.killable import Server
from tests.sized_upstream import OLLAMA_MODEL_MAX, SizedServer

pytestmark = pytest.mark.slow

SERVE = ("--summary-delay", "0")
# (server, its size, turns): one long chat of 200 turns, shorter ones for the other dialects
SERVERS = (
    ("llama.cpp", 4096, 200),
    ("ollama", 2048, 80),
    ("vllm", 8192, 200),
    ("koboldcpp", 4096, 80),
    ("lmstudio", 4096, 80),
)
SOURCES = {
    "llama.cpp": "llama.cpp /props",
    "ollama": "Ollama /api/ps",
    "vllm": "vLLM /v1/models max_model_len",
    "koboldcpp": "KoboldCpp /api/extra/true_max_context_length",
    "lmstudio": "LM Studio /api/v0/models",
}


@dataclass
class Chat:
    """What the client saw of a chat through kioku."""

    statuses: list[int]
    errors: list[str]
    memory_versions: list[int]


def lines() -> list[tuple[str, str]]:
    """LoCoMo 0 as (what the user says, what the model answers) pairs."""
    t = load_locomo(shared_file("datasets", "locomo", "locomo10.json"), 0)
    texts = [m.text for m in t.messages]
    return list(zip(texts[0::2], texts[1::2], strict=False))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'kioku.db'}"


@pytest.fixture
def serve(db: str, tmp_path: Path) -> Iterator[Any]:
    """Start `kioku serve --upstream URL` (with `args`, no --window) and return it."""
    started: list[Server] = []

    def start(upstream: str, *args: str) -> Server:
        key = create_key(Store.open(db), "acme")[1]
        server = Server(db, upstream, tmp_path / "serve.log", key, (*SERVE, *args))
        started.append(server)
        server.start()
        return server

    yield start
    for s in started:
        s.stop()


def chat(
    server: Server, up: SizedServer, turns: int, cid: str = "long", stream: bool = False
) -> Chat:
    """`turns` turns of the dataset chat; with `stream`, every other turn is streamed."""
    pairs = lines()[:turns]
    answers = dict(pairs)
    up.reply = lambda body: answers.get(_last_user(body), "I see.")
    out = Chat([], [], [])
    auth = {"Authorization": f"Bearer {server.key}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=60, verify=tls_context()) as h:
        for n, (said, _) in enumerate(pairs):
            body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": said}]}
            if stream and n % 2:
                body["stream"] = True
            r = h.post("/v1/chat/completions", headers={"X-Kioku-Conversation": cid}, json=body)
            out.statuses.append(r.status_code)
            if r.status_code != 200:
                out.errors.append(r.json()["error"]["message"])
            elif stream and n % 2:
                assert r.text.rstrip().endswith("data: [DONE]")
            out.memory_versions.append(int(r.headers.get("x-kioku-memory-version", -1)))
    return out


def _last_user(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", ()) if m.get("role") == "user"]
    text = str(users[-1].get("content")) if users else ""
    return re.sub(r"^⟦[^⟧\n]*⟧\n", "", text).strip()


def turn_requests(up: SizedServer, said: set[str]) -> list[Any]:
    """The chat turns the server read (the chronicler's requests left out)."""
    return [a for a in up.asked if any(_last_user(a.body).endswith(s) for s in said)]


def use_after_first_fold(up: SizedServer, said: set[str]) -> tuple[float, float, int]:
    """How much of the window turns used after the prompt first shrank (the first fold): the
    most a turn took (its prompt and the reply it reserved ÷ the size: the size found is the
    size filled), the median prompt ÷ (the size − the reply reserved: SPEC §3's measure, which
    the profile's trigger and headroom set), and how many turns there were."""
    asked = turn_requests(up, said)
    first = next((i for i in range(1, len(asked)) if asked[i].tokens < asked[i - 1].tokens), None)
    assert first is not None, "the chat never folded"
    after = asked[first:]
    peak = max((a.tokens + a.reserved) / up.size for a in after)
    median = statistics.median(a.tokens / (up.size - a.reserved) for a in after)
    return peak, median, len(after)


@pytest.mark.parametrize(("kind", "size", "turns"), SERVERS, ids=[s[0] for s in SERVERS])
def test_the_window_is_found_and_every_prompt_fits(
    kind: str, size: int, turns: int, serve: Any, tmp_path: Path
) -> None:
    with SizedServer(kind, size) as up:
        server = serve(up.url)
        log = (tmp_path / "serve.log").read_text()
        assert f"window {size} from {SOURCES[kind]}" in log
        seen = chat(server, up, turns)
    said = {s for s, _ in lines()[:turns]}
    assert seen.errors == [] and seen.statuses == [200] * turns
    over = [a.tokens for a in up.asked if a.over]
    assert over == [], f"{len(over)} prompts over {size} tokens: {over[:5]}"
    peak, median, n = use_after_first_fold(up, said)
    print(f"{kind} {size}: {len(up.asked)} requests, {n} turns after the first fold, "
          f"peak use {peak:.3f}, median prompt {median:.3f} of the budget")  # fmt: skip
    assert peak >= 0.85 and median >= 0.75
    if kind == "ollama":  # num_ctx below the model's own: the fix is named at start
        assert f"less than the model's own {OLLAMA_MODEL_MAX}" in log
        assert "OLLAMA_CONTEXT_LENGTH" in log


def test_a_server_that_says_nothing_is_named_and_its_refusal_teaches_the_size(
    serve: Any, tmp_path: Path
) -> None:
    """llama-cpp-python's server reports no size: the start-up line says so and names
    --window; the one turn it refuses says --window and its size, and every turn after fits."""
    with SizedServer("llama-cpp-python", 4096) as up:
        server = serve(up.url)
        log = (tmp_path / "serve.log").read_text()
        assert "window unknown" in log and "--window" in log
        seen = chat(server, up, 80, stream=True)
    failed = [i for i, s in enumerate(seen.statuses) if s != 200]
    assert len(failed) == 1 and seen.statuses[failed[0]] == 400
    assert "--window 4096" in seen.errors[0] and "4096" in seen.errors[0]
    refused = [a for a in up.asked if a.refused]
    assert len(refused) == 1
    later = up.asked[up.asked.index(refused[0]) + 1 :]
    assert later and not any(a.over for a in later)
    assert seen.statuses[failed[0] + 1 :] == [200] * (80 - failed[0] - 1)
    logged = (tmp_path / "serve.log").read_text()
    assert logged.count("kioku now keeps prompts within") == 1


def test_a_refusal_when_the_size_was_wrong_costs_one_turn(serve: Any, tmp_path: Path) -> None:
    """A llama.cpp whose /props says 8192 while it runs 4096 (a proxy in front of it, a
    changed -c): it refuses once, says its size, and the next turns fit it."""
    with SizedServer("llama.cpp", 4096) as up:
        real = up.fake.route
        assert real is not None
        up.fake.route = lambda m, p, raw: (
            (200, {"default_generation_settings": {"n_ctx": 8192}})
            if p == "/props"
            else real(m, p, raw)
        )
        server = serve(up.url)
        seen = chat(server, up, 80, stream=True)
    assert sum(s != 200 for s in seen.statuses) == 1
    assert "--window 4096" in seen.errors[0]
    refused = next(i for i, a in enumerate(up.asked) if a.refused)
    assert not any(a.over for a in up.asked[refused + 1 :])


def test_the_window_follows_the_upstream_when_it_changes(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server restarted with another -c while kioku serves: asked again, it says its new
    size, and the next turns are built for it, smaller and then larger again."""
    monkeypatch.setenv("KIOKU_WINDOW_PROBE_S", "0.2")
    log = tmp_path / "serve.log"
    with SizedServer("llama.cpp", 8192) as up:
        server = serve(up.url)
        assert "window 8192 from llama.cpp /props" in log.read_text()
        first = chat(server, up, 20)
        up.size = 4096
        wait_for(lambda: "the upstream changed: window 4096" in log.read_text())
        up.asked.clear()
        second = chat(server, up, 80, cid="after")
        assert not any(a.over for a in up.asked)
        assert max(a.tokens + a.reserved for a in up.asked) > 0.85 * 4096
        up.size = 8192
        wait_for(lambda: "the upstream changed: window 8192" in log.read_text())
        up.asked.clear()
        third = chat(server, up, 120, cid="grown")
    assert first.statuses + second.statuses + third.statuses == [200] * 220
    # the larger window is used: the longest prompts pass the 4096 the server had before
    assert max(a.tokens + a.reserved for a in up.asked) > 4096


def wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_window_n_still_wins(serve: Any, tmp_path: Path) -> None:
    with SizedServer("llama.cpp", 8192) as up:
        serve(up.url, "--window", "4096")
    log = (tmp_path / "serve.log").read_text()
    assert "window 4096 from --window" in log and "llama.cpp /props" not in log
    assert "profile local-64k@4096" in log


def test_a_silent_cut_is_never_risked_when_the_servers_tokens_outnumber_kiokus(
    serve: Any,
) -> None:
    """Ollama cuts a prompt beyond num_ctx without a word, so no refusal can teach kioku:
    what keeps its prompts within it when the model's tokenizer counts 15% more than kioku's
    estimate is the margin kioku learns from each reply's `usage.prompt_tokens`."""
    with SizedServer("ollama", 2048, inflate=1.15) as up:
        server = serve(up.url)
        seen = chat(server, up, 80)
    assert seen.statuses == [200] * 80
    assert [a.tokens for a in up.asked if a.over] == []


def test_kioku_worker_sizes_chapters_for_the_window_serve_found(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kioku serve --no-worker` beside `kioku worker`: the worker asks the same upstream, so
    its chapters are sized for the window the turns are built for."""
    from typer.testing import CliRunner

    from kioku.cli import app, register_extensions

    register_extensions()
    with SizedServer("llama.cpp", 4096) as up:
        monkeypatch.setenv("KIOKU_LLM_URL", up.url)
        out = CliRunner().invoke(app, ["worker", "--db", db, "--once"])
    assert out.exit_code == 0, out.output
    assert "window 4096 from llama.cpp /props" in out.output
    assert "on local-64k@4096" in out.output
