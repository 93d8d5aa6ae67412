"""Roles alternate upstream, checked by a real llama.cpp server that formats chats with a GGUF's
own strict Jinja template: Gemma 3's official one, which raises unless, after one optional
system message, user and assistant take turns.

The test GGUF (the base gemma-3-270m) ships no template, so a copy gets Gemma's written into its
metadata with the `gguf` package (cached beside the original) and is served without
`--chat_format`: llama-cpp-python then renders the GGUF's template, as llama.cpp does. First the
server is shown to refuse what kioku used to send; then a SillyTavern-shaped conversation goes
through `kioku serve` — a chat that opens with the greeting, an author's note inside the history,
a turn whose reply failed, folds with the memory exchange — and every turn is answered.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from kioku.alternation import alternate
from kioku.config import Settings
from kioku.engine import Kioku
from kioku.service.app import create_app
from kioku.service.keys import create_key
from kioku.service.loopback import ServerThread
from kioku.store import Store
from tests.conftest import need
from tests.llama import LlamaServer, need_llama
from tests.test_service_support import SERVICE_PROFILE

pytestmark = pytest.mark.llama

# Gemma 3's chat template, as google/gemma-3-*-it ship it in tokenizer_config.json
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# folds after a few short turns; replies of a few tokens keep each turn ~1 s on 2 cores
PROFILE = replace(
    SERVICE_PROFILE,
    name="strict-test",
    window=2048,
    response_reserve=12,
    trigger=300,
    ceiling=480,
    min_raw=40,
    headroom=50,
    chapter_tokens=40,
    synopsis_tokens=60,
    major_gc=100,
    notes_tokens=0,
    connect_timeout_s=10.0,
    reply_timeout_s=120.0,
)
CARD = "You are Seraphina, the guardian of a forest glade. Answer briefly."
GREETING = "*Seraphina smiles.* Welcome to my glade, traveller."


def strict_gguf(base: Path) -> Path:
    """A copy of `base` with Gemma 3's template in its metadata (written once, cached)."""
    need(importlib.util.find_spec("gguf") is not None, "the gguf package is not installed")
    digest = hashlib.sha256(GEMMA3_TEMPLATE.encode()).hexdigest()[:12]
    out = base.with_name(f"{base.stem}-gemma3-template-{digest}.gguf")
    if out.exists():
        return out
    template = out.with_suffix(".jinja")
    template.write_text(GEMMA3_TEMPLATE, encoding="utf-8")
    partial = out.with_suffix(".partial")
    subprocess.run(
        [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(base), str(partial),
         "--chat-template-file", str(template), "--force"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    template.unlink()
    shutil.move(partial, out)
    return out


@pytest.fixture(scope="module")
def strict_server() -> Iterator[LlamaServer]:
    server = LlamaServer(strict_gguf(need_llama()), chat_format=None).start()
    try:
        yield server
    finally:
        server.stop()


def ask(server: LlamaServer, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": server.alias, "messages": messages, "max_tokens": 4},
        timeout=120,
    )


SHAPES = {
    "a chat that opens with the greeting": [
        {"role": "system", "content": CARD},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": "Hello."},
    ],
    "the memory exchange, then a raw window that starts with a reply": [
        {"role": "system", "content": CARD},
        {"role": "user", "content": "The story so far: the traveller arrived hurt."},
        {"role": "assistant", "content": "Understood."},
        {"role": "assistant", "content": "*She brings tea.*"},
        {"role": "user", "content": "Thank you."},
    ],
    "two user messages after a failed turn": [
        {"role": "system", "content": CARD},
        {"role": "user", "content": "Hello?"},
        {"role": "user", "content": "Hello? Anyone?"},
    ],
    "an author's note inside the history": [
        {"role": "system", "content": CARD},
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi."},
        {"role": "system", "content": "[Author's note: it is raining.]"},
        {"role": "user", "content": "What is the weather?"},
    ],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_template_refuses_the_shape_and_takes_it_alternated(
    strict_server: LlamaServer, shape: str
) -> None:
    raw = ask(strict_server, SHAPES[shape])
    assert raw.status_code >= 400, "the template must be strict for this test to mean anything"
    fixed = ask(strict_server, alternate(SHAPES[shape]))
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_sillytavern_shaped_conversation_through_kioku(
    strict_server: LlamaServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'kioku.db'}"
    store = Store.open(db)
    key = create_key(store, "t")[1]

    def make(tenant: str, st: Store) -> Kioku:
        return Kioku(st, profile=PROFILE, tenant=tenant)

    app = create_app(Settings(db=db, llm_url=f"{strict_server.url}/v1"), store=store,
                     make_kioku=make, worker=False, profile=PROFILE)  # fmt: skip
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=180) as h:
        auth = {"Authorization": f"Bearer {key}", "X-Kioku-Conversation": "glade"}
        chat: list[dict[str, Any]] = [{"role": "assistant", "content": GREETING}]

        def settle() -> None:
            svc = app.state.service
            deadline = time.monotonic() + 10
            while svc._tasks and time.monotonic() < deadline:
                time.sleep(0.02)  # the reply is stored after the response
            svc.kioku("t").worker.run_until_idle()

        def turn(*new: dict[str, Any], note: str | None = None) -> httpx.Response:
            chat.extend(new)
            history = list(chat)
            if note:  # SillyTavern's author's note at depth 1: a system message in the history
                history.insert(len(history) - 1, {"role": "system", "content": note})
            r = h.post("/v1/chat/completions", headers=auth,
                       json={"model": "gemma", "messages": [{"role": "system", "content": CARD}, *history]})  # fmt: skip
            settle()
            if r.status_code == 200:
                chat.append(
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                )
            return r

        assert turn({"role": "user", "content": "Hello, who are you?"}).status_code == 200
        assert (
            turn({"role": "user", "content": "Where am I?"}, note="[It is raining.]").status_code
            == 200
        )
        # a turn whose reply never came: the next request has two user messages in a row
        chat.append({"role": "user", "content": "Are you there?"})
        folded = 0
        for i in range(24):
            r = turn({"role": "user", "content": f"Tell me about the river, part {i}."})
            assert r.status_code == 200, r.text
            folded += store.conversation("glade").memory_version > 0
            if folded == 2:  # a turn with the memory exchange was answered too
                break
        assert folded == 2, "the test needs a fold"
