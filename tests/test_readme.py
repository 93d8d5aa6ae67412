"""The README's first screen, done as a new user does it: the commands of "With your model"
pasted as written (only the model server's URL and kioku's port are this machine's), against a
fake llama.cpp that says its window at /props, then a chat through the proxy, then the commands
that read it, with no environment variable set (issue 42)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kioku.service.loopback import free_port, wait_until_answers
from tests.sized_upstream import SizedServer

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
README_URL = "http://127.0.0.1:8080/v1"
CONVERSATION = "mika-and-me"


def _blocks(section: str) -> list[str]:
    """The bash blocks under a `## section` heading of the README."""
    start = README.index(f"## {section}")
    end = README.find("\n## ", start + 1)
    body = README[start : end if end > 0 else len(README)]
    return re.findall(r"```bash\n(.*?)```", body, re.S)


def _commands(block: str) -> list[list[str]]:
    """Each `kioku …` line of a block, its comment left off."""
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "kioku":
            out.append(words)
    return out


def _env() -> dict[str, str]:
    """This machine's environment without anything of kioku's: a user who set nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIOKU_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _kioku(words: list[str]) -> list[str]:
    assert words[0] == "kioku"
    return [sys.executable, "-m", "kioku.cli", *words[1:]]


def test_the_first_screen_installs_the_server_and_runs_the_demo() -> None:
    first = README[: README.index("## With your model")]
    blocks = re.findall(r"```bash\n(.*?)```", first, re.S)
    assert [b.strip() for b in blocks] == [
        "pip install -e '.[server]' && kioku demo",
        "pip install -e '.[server,test]' && bash scripts/check",
    ]
    for server in ("llama.cpp", "Ollama", "KoboldCpp", "LM Studio", "vLLM"):
        assert server in README[: README.index("## How it works")]


@pytest.mark.slow
def test_with_your_model_as_written_against_llama_cpp(tmp_path: Path) -> None:
    (block,) = _blocks("With your model")
    create, serve = _commands(block)
    assert create[:3] == ["kioku", "keys", "create"] and serve[:2] == ["kioku", "serve"]
    env = _env()
    made = subprocess.run(
        _kioku(create), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("kioku_")

    with SizedServer("llama.cpp", 4096) as llama:
        assert README_URL in serve
        served = [llama.url if w == README_URL else w for w in serve]
        port = free_port()
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*_kioku(served), "--port", str(port)],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            up = wait_until_answers(f"{base}/healthz", alive=lambda: proc.poll() is None)
            assert up, log.read_text()
            # what the README says serve prints at start
            assert "window 4096 from llama.cpp /props" in log.read_text()
            headers = {"Authorization": f"Bearer {key}", "X-Kioku-Conversation": CONVERSATION}
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                for text in ("I planted tomatoes on the balcony.", "Do you like lanterns?"):
                    r = client.post(
                        "/v1/chat/completions",
                        json={
                            "model": "local",
                            "messages": [
                                {"role": "system", "content": "You are Mika."},
                                {"role": "user", "content": text},
                            ],
                        },
                    )
                    assert r.status_code == 200, r.text
        finally:
            proc.terminate()
            proc.wait(30)

    def read(*words: str) -> str:
        got = subprocess.run(
            _kioku(["kioku", *words]),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.returncode == 0, (words, got.stderr)
        return got.stdout

    assert CONVERSATION in read("memory", "--json")
    read("notes", CONVERSATION)
    assert "tomatoes" in read("search", CONVERSATION, "tomatoes")
    exported = read("export", CONVERSATION)
    assert "balcony" in exported and "lanterns" in exported
