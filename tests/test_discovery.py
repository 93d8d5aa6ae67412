"""The upstream's window as each server says it (`kioku.service.discovery`), and what a refusal
for size says (`kioku.service.oversize`): the response shapes of llama.cpp, Ollama, vLLM,
KoboldCpp and LM Studio, answered by an `httpx.MockTransport`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kioku.service.discovery import Found, find_window, server_root
from kioku.service.oversize import Oversize, learned_window, oversize_of

Routes = dict[tuple[str, str], Any]


def served(routes: Routes) -> tuple[httpx.MockTransport, list[str]]:
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        said = routes.get((request.method, request.url.path))
        if callable(said):
            said = said(json.loads(request.content or b"{}"))
        if said is None:
            return httpx.Response(404, text="Not Found")
        return httpx.Response(200, json=said)

    return httpx.MockTransport(handle), asked


def found(routes: Routes, url: str = "http://host:8080/v1", model: str | None = None) -> Found:
    transport, _ = served(routes)
    return find_window(url, model=model, transport=transport)


def test_the_servers_own_routes_are_asked_at_its_root() -> None:
    assert server_root("http://host:8080/v1") == "http://host:8080"
    assert server_root("http://host:11434") == "http://host:11434"
    assert server_root("https://proxy.example/llm/v1/") == "https://proxy.example/llm"
    transport, asked = served({})
    find_window("http://host:8080/v1", transport=transport)
    assert "GET /props" in asked and "GET /api/ps" in asked and "GET /v1/models" in asked


def test_llama_cpp_props_the_slots_size() -> None:
    props = {"default_generation_settings": {"n_ctx": 4096, "n_predict": -1}, "total_slots": 1}
    assert found({("GET", "/props"): props}) == Found(4096, "llama.cpp /props")
    # newer builds say the whole context at the top; a request gets one slot's share
    props = {"default_generation_settings": {"n_ctx": 2048}, "n_ctx": 8192, "total_slots": 4}
    assert found({("GET", "/props"): props}).size == 2048
    assert found({("GET", "/props"): {"n_ctx": 8192}}).size == 8192


def test_koboldcpp_true_max_context_length() -> None:
    f = found({("GET", "/api/extra/true_max_context_length"): {"value": 8192}})
    assert f == Found(8192, "KoboldCpp /api/extra/true_max_context_length")


def test_lm_studio_the_loaded_context_before_the_models_maximum() -> None:
    listed: dict[str, Any] = {
        "object": "list",
        "data": [
            {
                "id": "nomic-embed",
                "type": "embeddings",
                "state": "loaded",
                "max_context_length": 2048,
            },
            {"id": "other", "type": "llm", "state": "not-loaded", "max_context_length": 131072},
            {
                "id": "qwen2.5-7b-instruct",
                "type": "llm",
                "state": "loaded",
                "max_context_length": 32768,
                "loaded_context_length": 4096,
            },
        ],
    }
    f = found({("GET", "/api/v0/models"): listed}, "http://localhost:1234/v1")
    assert f.size == 4096 and f.source.startswith("LM Studio /api/v0/models")
    # an older LM Studio says only the maximum: used, with a warning to set --window
    del listed["data"][2]["loaded_context_length"]
    f = found({("GET", "/api/v0/models"): listed}, "http://localhost:1234/v1")
    assert f.size == 32768 and "--window" in f.warning


def test_lm_studio_0_4_a_loaded_instances_context() -> None:
    listed = {
        "models": [
            {
                "type": "embedding",
                "key": "nomic",
                "loaded_instances": [{"id": "nomic", "config": {"context_length": 2048}}],
            },
            {"type": "llm", "key": "other", "loaded_instances": [], "max_context_length": 131072},
            {
                "type": "llm",
                "key": "openai/gpt-oss-20b",
                "loaded_instances": [
                    {"id": "openai/gpt-oss-20b", "config": {"context_length": 16384}}
                ],
                "max_context_length": 131072,
            },
        ]
    }
    f = found({("GET", "/api/v1/models"): listed}, "http://localhost:1234/v1")
    assert f == Found(16384, "LM Studio /api/v1/models (openai/gpt-oss-20b, loaded)")
    assert found({("GET", "/api/v1/models"): listed}, model="other").size is None


def ollama(running: list[dict[str, Any]], parameters: str = "") -> Routes:
    def show(asked: dict[str, Any]) -> dict[str, Any] | None:
        if asked.get("model") != "llama3.2:3b":
            return None
        info = {"general.architecture": "llama", "llama.context_length": 131072}
        return {"parameters": parameters, "model_info": info, "modelfile": "FROM x"}

    return {("GET", "/api/ps"): {"models": running}, ("POST", "/api/show"): show}


def test_ollama_the_num_ctx_it_loaded_not_the_models_maximum() -> None:
    loaded = {"name": "llama3.2:3b", "model": "llama3.2:3b", "context_length": 2048}
    f = found(ollama([loaded]), "http://localhost:11434/v1")
    assert f.size == 2048 and f.source == "Ollama /api/ps (llama3.2:3b)"
    assert "131072" in f.warning and "OLLAMA_CONTEXT_LENGTH" in f.warning
    assert "num_ctx" in f.warning
    # not loaded yet: a Modelfile's num_ctx, else the smallest default
    f = found(ollama([], 'num_ctx 8192\nstop "<|eot_id|>"'), model="llama3.2:3b")
    assert f.size == 8192 and "num_ctx" in f.source
    f = found(ollama([]), model="llama3.2:3b")
    assert f.size == 2048 and "not loaded" in f.source
    # loaded with its whole context: nothing to warn about
    loaded["context_length"] = 131072
    assert found(ollama([loaded])).warning == ""


def test_vllm_max_model_len_of_the_model_sent() -> None:
    listed = {
        "object": "list",
        "data": [
            {"id": "small", "object": "model", "max_model_len": 4096},
            {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "max_model_len": 32768},
        ],
    }
    routes = {("GET", "/v1/models"): listed}
    assert found(routes, model="Qwen/Qwen2.5-7B-Instruct").size == 32768
    assert found(routes).size == 4096


def test_a_model_name_is_the_last_resort_and_silence_is_said() -> None:
    listed = {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]}
    f = found({("GET", "/v1/models"): listed}, "https://api.example/v1")
    assert f.size == 128_000 and "gpt-4o-mini" in f.source and f.bound
    # a table's word is a bound: a profile keeps to its own smaller window
    assert f.within(200_000) == f
    assert f.within(65536).size == 65536 and "--window" in f.within(65536).line()
    # a hosted API lists many models: only the one kioku sends is looked up
    many = {"data": [{"id": "gpt-4-0613"}, {"id": "gpt-4o"}]}
    assert found({("GET", "/v1/models"): many}).size is None
    assert found({("GET", "/v1/models"): many}, model="gpt-4o").size == 128_000
    silent = found({("GET", "/v1/models"): {"data": [{"id": "gemma"}]}})
    assert silent.size is None
    assert "--window" in silent.line() and "window unknown" in silent.line()
    assert found({("GET", "/props"): {"n_ctx": 4096}}).line() == "window 4096 from llama.cpp /props"


def test_an_upstream_that_is_down_is_said_not_raised() -> None:
    f = find_window("http://127.0.0.1:9/v1", timeout_s=1)
    assert f.size is None and "did not answer" in f.source


@pytest.mark.parametrize(
    ("status", "message", "body", "said"),
    [
        (
            400,
            "request (4476 tokens) exceeds the available context size (4096 tokens), try "
            "increasing it",
            {
                "error": {
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 4476,
                    "n_ctx": 4096,
                }
            },
            Oversize(4096, 4476),
        ),
        (
            400,
            "the request exceeds the available context size (4110 tokens)",
            None,
            Oversize(4110, None),
        ),
        (
            400,
            "the request exceeds the available context size, try increasing it",
            {"error": {"type": "exceed_context_size_error"}},
            Oversize(None, None),
        ),
        (400, "Requested tokens (5000) exceed context window of 4096", None, Oversize(4096, 5000)),
        (
            400,
            "This model's maximum context length is 8192 tokens. However, you requested 9000 "
            "tokens (8000 in the messages, 1000 in the completion).",
            None,
            Oversize(8192, 8000),
        ),
        (
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens.",
            {"error": {"code": "context_length_exceeded"}},
            Oversize(128000, 130000),
        ),
        (
            400,
            "input too long",
            {"error": {"code": "context_length_exceeded"}},
            Oversize(None, None),
        ),
        (400, "temperature must be between 0 and 2", None, None),
        (500, "maximum context length is 8192", None, None),
    ],
)
def test_a_refusal_for_size_is_read_in_each_dialect(
    status: int, message: str, body: Any, said: Oversize | None
) -> None:
    assert oversize_of(status, message, body) == said


def test_the_learned_window_is_the_servers_size_in_kiokus_tokens() -> None:
    # the server said its size and counted the prompt as kioku did
    assert learned_window(65536, 4476, Oversize(4096, 4476)) == 4096
    # it counts 10% more than kioku: its 4096 are ~3724 of kioku's
    assert learned_window(65536, 4000, Oversize(4096, 4400)) == 3723
    # nothing said, or a size kioku already kept to: a smaller window all the same
    assert learned_window(4096, 3900, Oversize(None, None)) == 3481
    assert learned_window(4096, 3900, Oversize(4096, None)) == 3481
    assert learned_window(600, 500, Oversize(None, None)) == 512
