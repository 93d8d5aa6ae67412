"""Fake upstreams with a context window, each saying it (or not) and refusing (or silently
cutting) a prompt beyond it as the server it stands for does.

    llama.cpp        GET /props n_ctx; refuses prompt > n_ctx (exceed_context_size_error)
    ollama           GET /api/ps context_length (num_ctx), POST /api/show (the model's own
                     context); cuts a longer prompt without a word
    vllm             GET /v1/models max_model_len; refuses prompt + max_tokens > it
    koboldcpp        GET /api/extra/true_max_context_length; cuts prompt + max_tokens > it
    lmstudio         GET /api/v0/models loaded_context_length; refuses prompt > it
    llama-cpp-python says nothing; refuses "Requested tokens (N) exceed context window of M"

A prompt is counted as kioku's default estimator counts it, with the generic chat template
(`usage.prompt_tokens` says that count, as a server's does), so "over the size" means over it
by kioku's own measure; every chat request is recorded with its count.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kioku.budget import Template
from kioku.service.loopback import FakeUpstream
from kioku.tokens import ScriptEstimator

KINDS = ("llama.cpp", "ollama", "vllm", "koboldcpp", "lmstudio", "llama-cpp-python")
MODEL = {
    "llama.cpp": "model.gguf",
    "ollama": "llama3.2:3b",
    "vllm": "Qwen/Qwen2.5-7B-Instruct",
    "koboldcpp": "koboldcpp/model",
    "lmstudio": "qwen2.5-7b-instruct",
    "llama-cpp-python": "gemma",
}
OLLAMA_MODEL_MAX = 131072


@dataclass
class Asked:
    """One chat request as the server read it."""

    body: dict[str, Any]
    tokens: int
    reserved: int
    over: bool  # beyond the server's size (refused, or cut short)
    refused: bool


@dataclass
class SizedServer:
    kind: str
    size: int
    reply: Callable[[dict[str, Any]], str] = field(default=lambda body: "Noted.")
    # the server's tokenizer counts this many times kioku's estimate (a real one differs)
    inflate: float = 1.0
    asked: list[Asked] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counter = ScriptEstimator()
        self.template = Template()
        self.fake = FakeUpstream(model=MODEL[self.kind], reply=self._payload)
        self.fake.route = self._route
        self.fake.raw = self._admit
        self._lock = threading.Lock()

    def __enter__(self) -> SizedServer:
        self.fake.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.stop()

    @property
    def url(self) -> str:
        return self.fake.url

    def tokens(self, body: dict[str, Any]) -> int:
        messages = body.get("messages") or []
        text = sum(self.counter.count(_text(m.get("content"))) for m in messages)
        return round((text + self.template.messages(len(messages))) * self.inflate)

    # what the server says about itself ----------------------------------------------------

    def _route(self, method: str, path: str, raw: bytes) -> tuple[int, Any] | None:
        k, n, name = self.kind, self.size, MODEL[self.kind]
        if k == "llama.cpp" and method == "GET" and path == "/props":
            return 200, {"default_generation_settings": {"n_ctx": n}, "total_slots": 1}
        if k == "ollama" and method == "GET" and path == "/api/ps":
            running = {"name": name, "model": name, "size_vram": 0, "context_length": n}
            return 200, {"models": [running]}
        if k == "ollama" and method == "POST" and path == "/api/show":
            asked = json.loads(raw or b"{}")
            if name not in (asked.get("model"), asked.get("name")):
                return 404, {"error": f"model '{asked}' not found"}
            info = {"general.architecture": "llama", "llama.context_length": OLLAMA_MODEL_MAX}
            return 200, {"parameters": 'stop "<|eot_id|>"', "model_info": info}
        if k == "vllm" and method == "GET" and path == "/v1/models":
            listed = {"id": name, "object": "model", "max_model_len": n}
            return 200, {"object": "list", "data": [listed]}
        if k == "koboldcpp" and method == "GET" and path == "/api/extra/true_max_context_length":
            return 200, {"value": n}
        if k == "lmstudio" and method == "GET" and path == "/api/v0/models":
            loaded = {
                "id": name,
                "type": "llm",
                "state": "loaded",
                "max_context_length": 32768,
                "loaded_context_length": n,
            }
            return 200, {"object": "list", "data": [loaded]}
        if method == "GET" and path.startswith(("/props", "/api/")):
            return 404, {"error": {"message": "File Not Found"}}
        return None

    # what it does with a prompt -----------------------------------------------------------

    def _admit(self, body: dict[str, Any]) -> tuple[int, str, bytes] | None:
        n = self.tokens(body)
        reserved = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        counts_reply = self.kind in ("vllm", "koboldcpp")
        over = (n + reserved if counts_reply else n) > self.size
        refuses = self.kind in ("llama.cpp", "vllm", "lmstudio", "llama-cpp-python")
        with self._lock:
            self.asked.append(Asked(body, n, reserved, over, over and refuses))
        if not (over and refuses):
            return None  # answered (Ollama and KoboldCpp cut the prompt and answer anyway)
        return 400, "application/json", json.dumps(self._refusal(n, reserved)).encode()

    def _refusal(self, n: int, reserved: int) -> dict[str, Any]:
        s = self.size
        if self.kind == "llama.cpp":
            return {
                "error": {
                    "code": 400,
                    "message": f"request ({n} tokens) exceeds the available context size ({s} "
                    "tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": n,
                    "n_ctx": s,
                }
            }
        if self.kind == "vllm":
            return {
                "object": "error",
                "message": f"This model's maximum context length is {s} tokens. However, you "
                f"requested {n + reserved} tokens ({n} in the messages, {reserved} in the "
                "completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        if self.kind == "lmstudio":
            return {
                "error": f"Trying to keep the first {n} tokens when context the overflows. "
                f"However, the model is loaded with context length of only {s} tokens"
            }
        return {
            "error": {
                "message": f"Requested tokens ({n}) exceed context window of {s}",
                "type": "invalid_request_error",
            }
        }

    def _payload(self, body: dict[str, Any]) -> dict[str, Any]:
        text = self.reply(body)
        n = self.tokens(body)
        return {
            "id": "chatcmpl-sized",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL[self.kind],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": n,
                "completion_tokens": self.counter.count(text),
                "total_tokens": n + self.counter.count(text),
            },
        }


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")
