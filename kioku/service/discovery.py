"""The upstream's context window, asked of the upstream (`kioku serve --window auto`).

Servers people run at home say their window in their own dialect, at the server's root (an
upstream URL usually ends in /v1): llama.cpp's `llama-server` `GET /props` (the slot's
`default_generation_settings.n_ctx`; newer versions also a top-level `n_ctx`), KoboldCpp's
`GET /api/extra/true_max_context_length`, LM Studio's `GET /api/v1/models` (a loaded instance's
`config.context_length`) or, before 0.4, `GET /api/v0/models` (`loaded_context_length`), Ollama's `GET /api/ps` (`context_length`: the `num_ctx` it loaded the
model with, which is what it truncates a prompt to, not the model's maximum) and `POST
/api/show` (the model's own `<arch>.context_length`, and a Modelfile's `num_ctx`), and vLLM's
`GET /v1/models` (`max_model_len`). A hosted model says nothing: its name, looked up in a small
table, is the last resort. llama-cpp-python's server answers none of these: `find_window` then
says so, and the service learns the size from the first refusal (`kioku.service.oversize`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from kioku.client import api_root
from kioku.tls import tls_context

__all__ = ["Found", "find_window", "server_root"]

PROBE_TIMEOUT_S = 5.0
# Ollama loads a model with the smallest context any of its versions defaults to when nothing
# else is set; a model it has not loaded yet is assumed to get it
OLLAMA_DEFAULT_CTX = 2048
# the last resort: hosted models whose servers do not say their window (prefix → tokens)
KNOWN_MODELS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude", 200_000),
    ("gemini", 1_048_576),
)


@dataclass(frozen=True)
class Found:
    """What the upstream said: `size` in tokens (None when nothing told), `source` where it
    came from (or why nothing did), and a `warning` worth the operator's attention."""

    size: int | None
    source: str
    warning: str = ""
    # the most the model takes (a table's word, not the server's): a profile keeps to its own
    # window below it, so a hosted model is not sent 10x the prompts it was before
    bound: bool = False

    def line(self) -> str:
        """The start-up line."""
        if self.size is None:
            return (
                f"window unknown ({self.source}); kioku asks again while it serves and learns "
                "it from the first refusal for size: pass --window N with the server's context "
                "size to start right"
            )
        return f"window {self.size} from {self.source}"

    def within(self, window: int) -> Found:
        """A bound kept to a profile's own `window` where that is smaller."""
        if not self.bound or self.size is None or self.size <= window:
            return self
        return Found(
            window,
            f"the profile ({self.source} takes up to {self.size}; pass --window N for more)",
            self.warning,
        )


def server_root(base_url: str) -> str:
    """`http://host:8080/v1` → `http://host:8080`: where the servers' own routes live."""
    root = api_root(base_url)
    return re.sub(r"/v1$", "", root)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def find_window(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> Found:
    """The upstream's context window and where it came from; never raises."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(
        transport=transport, headers=headers, timeout=timeout_s, verify=tls_context()
    ) as http:
        probe = _Probe(http, server_root(base_url), api_root(base_url), model)
        try:
            for ask in probe.order():
                found = ask()
                if found is not None:
                    return found
        except httpx.TransportError as e:
            return Found(None, f"the upstream did not answer: {type(e).__name__}")
        return probe.by_name()


class _Probe:
    def __init__(self, http: httpx.Client, root: str, api: str, model: str | None) -> None:
        self.http = http
        self.root = root
        self.api = api
        self.model = model
        self.models: list[dict[str, Any]] | None = None

    def order(self) -> list[Callable[[], Found | None]]:
        return [
            self.llama_cpp,
            self.koboldcpp,
            self.lm_studio_v1,
            self.lm_studio,
            self.ollama,
            self.vllm,
        ]

    def get(self, url: str) -> Any:
        """The JSON of a GET, None for anything else (a 404, HTML, a refusal)."""
        r = self.http.get(url)
        if r.status_code != 200:
            return None
        try:
            return r.json()
        except ValueError:
            return None

    def llama_cpp(self) -> Found | None:
        props = self.get(f"{self.root}/props")
        if not isinstance(props, dict):
            return None
        settings = props.get("default_generation_settings")
        slot = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
        total = _int(props.get("n_ctx"))
        # the slot's n_ctx is what one request gets (the total is shared by --parallel slots)
        sizes = [n for n in (slot, total) if n]
        return Found(min(sizes), "llama.cpp /props") if sizes else None

    def koboldcpp(self) -> Found | None:
        said = self.get(f"{self.root}/api/extra/true_max_context_length")
        size = _int(said.get("value")) if isinstance(said, dict) else None
        return Found(size, "KoboldCpp /api/extra/true_max_context_length") if size else None

    def lm_studio_v1(self) -> Found | None:
        """LM Studio 0.4's REST API: each model's loaded instances with their context."""
        said = self.get(f"{self.root}/api/v1/models")
        models = said.get("models") if isinstance(said, dict) else None
        if not isinstance(models, list):
            return None
        for m in models:
            if not isinstance(m, dict) or m.get("type") == "embedding":
                continue
            instances = [i for i in m.get("loaded_instances") or () if isinstance(i, dict)]
            names = {m.get("key"), *(i.get("id") for i in instances)}
            if self.model and self.model not in names:
                continue
            for i in instances:
                config = i.get("config")
                size = _int(config.get("context_length")) if isinstance(config, dict) else None
                if size:
                    return Found(size, f"LM Studio /api/v1/models ({i.get('id')}, loaded)")
        return None

    def lm_studio(self) -> Found | None:
        said = self.get(f"{self.root}/api/v0/models")
        data = said.get("data") if isinstance(said, dict) else None
        if not isinstance(data, list):
            return None
        models = [m for m in data if isinstance(m, dict) and m.get("type") != "embeddings"]
        loaded = [m for m in models if m.get("state") == "loaded"]
        for m in self._named(loaded) + self._named(models):
            size = _int(m.get("loaded_context_length"))
            if size:
                return Found(size, f"LM Studio /api/v0/models ({m.get('id')}, loaded)")
            size = _int(m.get("max_context_length"))
            if size:
                return Found(
                    size,
                    f"LM Studio /api/v0/models ({m.get('id')}, its maximum)",
                    "LM Studio did not say the loaded context: if it loaded the model with less, "
                    "pass --window N",
                )
        return None

    def _named(self, models: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The model kioku sends (`--model`) first, when it is listed."""
        if self.model:
            named = [m for m in models if m.get("id") == self.model]
            return named or models
        return models

    def ollama(self) -> Found | None:
        ps = self.get(f"{self.root}/api/ps")
        if not isinstance(ps, dict) or not isinstance(ps.get("models"), list):
            return None
        running = [m for m in ps["models"] if isinstance(m, dict)]
        name = self.model or next((str(m.get("model") or m.get("name")) for m in running), None)
        if name is None:
            return Found(
                OLLAMA_DEFAULT_CTX,
                "Ollama (no model loaded: its smallest default num_ctx)",
                "Ollama has no model loaded: pass --model NAME, or --window N with its num_ctx",
            )
        shown = self._ollama_show(name)
        model_max, num_ctx = _model_context(shown), _num_ctx(shown)
        loaded = next(
            (
                _int(m.get("context_length"))
                for m in running
                if name in (m.get("model"), m.get("name"))
            ),
            None,
        )
        if loaded:
            size, source = loaded, f"Ollama /api/ps ({name})"
        elif num_ctx:
            size, source = num_ctx, f"Ollama /api/show num_ctx ({name})"
        else:
            size = min(OLLAMA_DEFAULT_CTX, model_max or OLLAMA_DEFAULT_CTX)
            running_names = {n for m in running for n in (m.get("model"), m.get("name"))}
            why = "its num_ctx not said" if name in running_names else "not loaded yet"
            source = f"Ollama ({name} {why}: its smallest default num_ctx)"
        warning = ""
        if model_max and size < model_max:
            warning = (
                f"Ollama runs {name} with num_ctx {size}, less than the model's own "
                f"{model_max}, and silently cuts longer prompts: kioku keeps prompts within "
                f"{size}; for more, start Ollama with OLLAMA_CONTEXT_LENGTH={model_max} (or set "
                "num_ctx in a Modelfile) and restart kioku"
            )
        return Found(size, source, warning)

    def _ollama_show(self, name: str) -> dict[str, Any]:
        r = self.http.post(f"{self.root}/api/show", json={"model": name, "name": name})
        if r.status_code != 200:
            return {}
        try:
            shown = r.json()
        except ValueError:
            return {}
        return shown if isinstance(shown, dict) else {}

    def vllm(self) -> Found | None:
        for m in self._named(self._models()):
            size = _int(m.get("max_model_len"))
            if size:
                return Found(size, f"vLLM /v1/models max_model_len ({m.get('id')})")
        return None

    def _models(self) -> list[dict[str, Any]]:
        if self.models is None:
            said = self.get(f"{self.api}/models")
            data = said.get("data") if isinstance(said, dict) else None
            self.models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        return self.models

    def by_name(self) -> Found:
        try:
            ids = [str(m.get("id")) for m in self._models()]
        except httpx.TransportError:
            ids = []
        # the model kioku sends, or the one model the server lists (a hosted API lists many,
        # and the client names its own)
        names = [self.model] if self.model else ids if len(ids) == 1 else []
        for name in names:
            low = name.lower().rsplit("/", 1)[-1]
            for prefix, size in KNOWN_MODELS:
                if low.startswith(prefix):
                    source = f"the model name {name!r} (a table of known models)"
                    return Found(size, source, bound=True)
        return Found(None, "the upstream does not say its context size")


def _model_context(shown: dict[str, Any]) -> int | None:
    info = shown.get("model_info")
    if not isinstance(info, dict):
        return None
    arch = info.get("general.architecture")
    size = _int(info.get(f"{arch}.context_length")) if arch else None
    if size:
        return size
    return next((_int(v) for k, v in info.items() if k.endswith(".context_length")), None)


def _num_ctx(shown: dict[str, Any]) -> int | None:
    params = shown.get("parameters")
    if not isinstance(params, str):
        return None
    m = re.search(r"^\s*num_ctx\s+(\d+)", params, re.MULTILINE)
    return int(m.group(1)) if m else None
