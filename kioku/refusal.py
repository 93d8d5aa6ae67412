"""A refusal is not a summary: short, and holding a stock phrase (seed 000: 101 chars against 519
for the shortest real summary; 2 of 18 calls). Stored, it would sit in every prompt after it, so
the chronicler asks again, then falls back (`kioku.chronicler`)."""

from __future__ import annotations

DEFAULT_REFUSAL_CHARS = 400  # seed: refusal 101 chars, shortest real summary 519

# Stock refusal phrases, all languages at once: a model may refuse in English in a Japanese
# conversation. Matched case-insensitively, only in short replies.
REFUSAL_PHRASES: tuple[str, ...] = (
    "i can't",
    "i cannot",
    "i can not",
    "i'm sorry",
    "i am sorry",
    "i'm unable",
    "i am unable",
    "i won't",
    "i will not",
    "as an ai",
    "can't help with",
    "cannot help with",
    "can't assist",
    "cannot assist",
    "can't comply",
    "cannot comply",
    "できません",
    "申し訳ありません",
    "申し訳ございません",
    "お手伝いでき",
    "お答えでき",
    "控えさせていただ",
    "我不能",
    "无法",
    "抱歉",
    "对不起",
    "作为一个人工智能",
    "作为ai",
    "不能提供",
)


def is_refusal(text: str, max_chars: int = DEFAULT_REFUSAL_CHARS) -> bool:
    t = text.strip().replace("’", "'").lower()
    return len(t) < max_chars and any(p in t for p in REFUSAL_PHRASES)
