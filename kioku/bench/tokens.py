"""`kioku bench tokens`: how close kioku's token estimates come to the serving model's tokenizer.

Budgets are only as good as the counts behind them. When the server's tokenizer is unknown, kioku
falls back to `CalibratedEstimator`, fitted from the `usage.prompt_tokens` each reply reports. This
replays conversations per language (ja: the three longest RealPersonaChat timelines, en: the ten
LoCoMo conversations, zh: kioku's own two sample chats) as a chat server would see them: one prompt per turn, the whole history so far in ChatML,
`prompt_tokens` counted by the reference tokenizer (Qwen2.5 by default). The estimator calibrates
on the first turns only; it is then measured on texts it never saw: every later message alone,
and prompts made of the character card plus a raw window of later messages only (as after a cut),
sliding once the window is full. Baselines: the uncalibrated per-script defaults and the seed's
single 1.57 chars/token.

Floor: calibrated mean absolute error ≤ 3 % of the prompt per language after 20 turns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import accumulate
from pathlib import Path
from typing import Any

from kioku.counters import QwenCounter, TiktokenCounter, counter_from_spec
from kioku.datasets import Transcript, default_path, load_locomo, load_realpersonachat
from kioku.errors import ConfigError
from kioku.tokens import (
    CachedCounter,
    CalibratedEstimator,
    FixedRatioCounter,
    ScriptEstimator,
    TokenCounter,
)

DEFAULT_CALIBRATION_TURNS = 20
# Held-out prompts hold at most this many tokens of raw window: the raw window of the smallest
# profile (local-8k). Longer prompts average per-message misses away and flatter the estimator.
DEFAULT_WINDOW_TOKENS = 4096
FLOOR_MAE = 0.03
LANGS = ("ja", "zh", "en")

# The character card every prompt starts with (byte-identical from turn to turn, as in production).
SYSTEM_CARDS = {
    "ja": (
        "あなたは「ユイ」。港町の喫茶店で働く二十四歳の店員で、穏やかだが芯が強い。"
        "ユーザーとは長い付き合いの友人として、自然な口調で短めに返事をする。"
        "過去の会話で聞いた予定や好みを覚えていて、さりげなく話題にする。"
    ),
    "zh": (
        "你是「林晚」，一家旧书店兼咖啡馆的店主，二十九岁，温柔、细心，偶尔嘴硬。"
        "你和用户是认识很久的朋友，用自然的口语回答，不要太长。"
        "记住用户提到过的计划和喜好，并在合适的时候提起。"
    ),
    "en": (
        "You are Wren, a night-shift radio host in her thirties: warm, dry-humoured, a good "
        "listener. You and the user are old friends; reply naturally and briefly, and remember "
        "the plans and people the user has mentioned before."
    ),
}


@dataclass(frozen=True)
class Chat:
    """One conversation: a name for the report and (role, text) messages, oldest first."""

    lang: str
    name: str
    messages: tuple[tuple[str, str], ...]


def load_chats(lang: str, shared: Path | None = None) -> list[Chat]:
    if lang == "zh":
        return sample_chats("zh")
    env = None if shared is None else {"KIOKU_SHARED": str(shared)}
    if lang == "ja":
        return _realpersonachat(_need(default_path("realpersonachat", env)))
    if lang == "en":
        return _locomo(_need(default_path("locomo", env)))
    raise ConfigError(f"no token benchmark data for language {lang!r}; use one of {LANGS}")


def sample_chats(lang: str) -> list[Chat]:
    """kioku's own sample chats (kioku/data/<lang>_samples.txt): one message a line, user first;
    "## name" starts a chat, other lines starting with "#" are comments."""
    text = resources.files("kioku").joinpath(f"data/{lang}_samples.txt").read_text("utf-8")
    chats: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("## "):
            chats.append((line[3:].strip(), []))
        elif line and not line.startswith("#"):
            if not chats:
                chats.append(("sample", []))
            chats[-1][1].append(line)
    return [
        Chat(lang, f"kioku-{lang}-{name}", tuple(_alternate(lines)))
        for name, lines in chats
        if lines
    ]


def _alternate(lines: Sequence[str]) -> Iterator[tuple[str, str]]:
    for i, line in enumerate(lines):
        yield ("user" if i % 2 == 0 else "assistant", line)


def _need(path: Path) -> Path:
    if not path.exists():
        raise ConfigError(
            f"benchmark data {path} is missing; set KIOKU_SHARED to the folder holding datasets/"
        )
    return path


def _realpersonachat(path: Path) -> list[Chat]:
    # One timeline per frequent speaker (their dialogues in time order, the speaker playing the
    # character, each partner the user): three chats with three styles.
    seen: dict[str, int] = {}
    for line in path.read_text("utf-8").splitlines():
        if line.strip():
            for p in json.loads(line)["interlocutors"]:
                seen[p] = seen.get(p, 0) + 1
    speakers = sorted(seen, key=lambda p: (-seen[p], p))[:3]
    return [_chat("ja", f"realpersonachat-{sp}", load_realpersonachat(path, sp)) for sp in speakers]


def _locomo(path: Path) -> list[Chat]:
    n = len(json.loads(path.read_text("utf-8")))
    chats = []
    for i in range(n):
        t = load_locomo(path, i)
        chats.append(_chat("en", f"locomo-{t.info.get('sample_id', i)}", t))
    return chats


def _chat(lang: str, name: str, t: Transcript) -> Chat:
    return Chat(lang, name, tuple((m.role, m.text) for m in t.messages if m.text))


# --- the simulation ------------------------------------------------------------------------------


def chatml_tokens(counter: TokenCounter, role: str, text: str) -> int:
    """Tokens of `<|im_start|>role\\ntext<|im_end|>\\n`: the specials cut the text, so the two
    specials count one each and the pieces between them are counted apart, exactly as a server
    tokenizing the whole prompt would."""
    return 2 + counter.count(f"{role}\n{text}") + counter.count("\n")


def generation_tokens(counter: TokenCounter) -> int:
    return 1 + counter.count("assistant\n")  # <|im_start|>assistant\n


def _mape(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean of |estimate − truth| / truth over (estimate, truth) pairs with truth > 0."""
    errs = [abs(e - t) / t for e, t in pairs if t > 0]
    return sum(errs) / len(errs) if errs else float("nan")


def _wape(pairs: Sequence[tuple[float, float]]) -> float:
    """Σ|estimate − truth| / Σ truth: the per-message error weighted by size, which a 1-token
    "はい" cannot dominate."""
    total = sum(t for _, t in pairs)
    return sum(abs(e - t) for e, t in pairs) / total if total else float("nan")


def simulate(
    chat: Chat,
    reference: TokenCounter,
    system: str,
    *,
    calibration_turns: int = DEFAULT_CALIBRATION_TURNS,
    window_tokens: int = DEFAULT_WINDOW_TOKENS,
    estimator: Callable[[], CalibratedEstimator] = CalibratedEstimator,
) -> dict[str, Any]:
    msgs = chat.messages
    # A turn is a prompt sent for an assistant reply that follows a user message.
    turns = [
        i for i in range(1, len(msgs)) if msgs[i][0] == "assistant" and msgs[i - 1][0] == "user"
    ]
    if len(turns) <= calibration_turns + 1:
        raise ConfigError(
            f"{chat.name} has {len(turns)} turns; need more than {calibration_turns + 1}"
        )
    truth_msg = [reference.count(text) for _, text in msgs]
    rendered = [chatml_tokens(reference, role, text) for role, text in msgs]
    sys_tok = chatml_tokens(reference, "system", system)
    gen_tok = generation_tokens(reference)
    prefix = [0, *accumulate(rendered)]

    est = estimator()
    for a in turns[:calibration_turns]:
        observed = sys_tok + prefix[a] + gen_tok
        est.calibrate([system, *(text for _, text in msgs[:a])], observed)
    fitted = est.current

    # Held out: everything from the reply to the last calibration turn on.
    start = turns[calibration_turns - 1]
    counters: dict[str, ScriptEstimator] = {"calibrated": fitted, "uncalibrated": ScriptEstimator()}
    fixed = FixedRatioCounter(1.57)
    held = range(start, len(msgs))
    m_est = {k: [c.estimate(msgs[i][1]) for i in held] for k, c in counters.items()}
    m_pref = {k: [0.0, *accumulate(v)] for k, v in m_est.items()}
    chars = [0, *accumulate(len(msgs[i][1]) + 1 for i in held)]  # +1: the joining newline

    prompt_pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in (*counters, "fixed")}
    sys_est = {k: c.estimate(system) for k, c in counters.items()}
    lo = start
    for a in turns[calibration_turns:]:
        while prefix[a] - prefix[lo] > window_tokens and lo < a - 1:
            lo += 1  # slide: drop the oldest message of the raw window
        truth = sys_tok + prefix[a] - prefix[lo] + gen_tok
        n = a - lo + 1  # + the card
        for k, c in counters.items():
            content = sys_est[k] + m_pref[k][a - start] - m_pref[k][lo - start]
            prompt_pairs[k].append((round(content + c.per_message * n + c.per_prompt), truth))
        n_chars = len(system) + chars[a - start] - chars[lo - start]
        prompt_pairs["fixed"].append((round(n_chars / fixed.chars_per_token), truth))

    message_pairs = {
        "calibrated": [(fitted.count(msgs[i][1]), truth_msg[i]) for i in held],
        "uncalibrated": [(counters["uncalibrated"].count(msgs[i][1]), truth_msg[i]) for i in held],
        "fixed": [(fixed.count(msgs[i][1]), truth_msg[i]) for i in held],
    }
    return {
        "chat": chat.name,
        "prompts": len(prompt_pairs["calibrated"]),
        "messages": len(held),
        "prompt_mae": {k: _mape(v) for k, v in prompt_pairs.items()},
        "message_mae": {k: _mape(v) for k, v in message_pairs.items()},
        "message_wape": {k: _wape(v) for k, v in message_pairs.items()},
        "fitted": {
            "rates": {k: round(v, 4) for k, v in fitted.rates.items()},
            "per_message": round(fitted.per_message, 3),
            "per_prompt": round(fitted.per_prompt, 3),
        },
    }


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _language(results: list[dict[str, Any]]) -> dict[str, Any]:
    def mean_of(level: str, kind: str) -> float:
        return round(_mean([r[level][kind] for r in results]), 4)

    return {
        "calibrated_mae": mean_of("prompt_mae", "calibrated"),
        "calibrated_mae_worst_chat": round(max(r["prompt_mae"]["calibrated"] for r in results), 4),
        "uncalibrated_mae": mean_of("prompt_mae", "uncalibrated"),
        "fixed_1_57_mae": mean_of("prompt_mae", "fixed"),
        "message_calibrated_mae": mean_of("message_mae", "calibrated"),
        "message_uncalibrated_mae": mean_of("message_mae", "uncalibrated"),
        "message_fixed_1_57_mae": mean_of("message_mae", "fixed"),
        "message_calibrated_wape": mean_of("message_wape", "calibrated"),
        "samples": sum(r["prompts"] for r in results),
        "message_samples": sum(r["messages"] for r in results),
        "chats": len(results),
    }


# --- speed ---------------------------------------------------------------------------------------


def _speed(counters: Mapping[str, Callable[[], TokenCounter]], texts: Sequence[str]) -> dict:
    out = {}
    for name, make in counters.items():
        counter = make()
        counter.count(texts[0])  # load outside the clock
        t0 = time.perf_counter()
        for t in texts:
            counter.count(t)
        dt = time.perf_counter() - t0
        out[name] = round(len(texts) / dt) if dt > 0 else None
    return out


def _warm_cache(
    make: Callable[[], TokenCounter], texts: Sequence[str]
) -> Callable[[], TokenCounter]:
    def build() -> TokenCounter:
        c = CachedCounter(make(), maxsize=len(texts) + 1)
        for t in texts:
            c.count(t)
        return c

    return build


def _iter_texts(chats: Sequence[Chat], limit: int) -> Iterator[str]:
    per = max(1, limit // max(1, len(chats)))
    for chat in chats:
        yield from (text for _, text in chat.messages[:per])


# --- entry point ---------------------------------------------------------------------------------


def run(
    calibration_turns: int = DEFAULT_CALIBRATION_TURNS,
    shared: Path | None = None,
    *,
    tokenizer: str = "qwen2.5",
    window_tokens: int = DEFAULT_WINDOW_TOKENS,
    langs: Sequence[str] = LANGS,
    max_chats: int | None = None,
    speed_texts: int = 3000,
) -> dict[str, Any]:
    """Replay each language's chats and report estimation errors as ratios (0.02 = 2 %)."""
    if calibration_turns < 1:
        raise ConfigError("calibration_turns must be at least 1")
    reference = counter_from_spec(tokenizer)
    languages: dict[str, Any] = {}
    all_chats: list[Chat] = []
    for lang in langs:
        chats = load_chats(lang, shared)[:max_chats]
        all_chats += chats
        results = [
            simulate(
                c,
                reference,
                SYSTEM_CARDS[lang],
                calibration_turns=calibration_turns,
                window_tokens=window_tokens,
            )
            for c in chats
        ]
        languages[lang] = _language(results)
        languages[lang]["per_chat"] = {
            r["chat"]: round(r["prompt_mae"]["calibrated"], 4) for r in results
        }
    texts = list(_iter_texts(all_chats, speed_texts))
    makers: dict[str, Callable[[], TokenCounter]] = {
        "qwen2.5": QwenCounter,
        "cl100k": TiktokenCounter,
        "estimate": ScriptEstimator,
        "calibrated": CalibratedEstimator,
        "fixed_1_57": FixedRatioCounter,
    }
    makers["cached_hit"] = _warm_cache(ScriptEstimator, texts)
    speed = _speed(makers, texts)
    return {
        "languages": languages,
        "calibration_turns": calibration_turns,
        "window_tokens": window_tokens,
        "tokenizer": tokenizer,
        "floor_mae": FLOOR_MAE,
        "ok": all(v["calibrated_mae"] <= FLOOR_MAE for v in languages.values()),
        "speed_texts_per_s": speed,
        "speed_texts": len(texts),
    }
