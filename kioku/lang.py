"""Which language a conversation is in, from its script mix: ja, zh or en.

Prompts, memory headers and length targets differ per language; the script mix is a reliable
enough signal for the three the chronicler has templates for.
"""

from __future__ import annotations

from collections.abc import Iterable

LANGS = ("en", "ja", "zh")


def detect_lang(texts: Iterable[str] | str) -> str:
    if isinstance(texts, str):
        texts = [texts]
    kana = han = latin = 0
    for t in texts:
        for ch in t:
            o = ord(ch)
            if 0x3040 <= o <= 0x30FF:
                kana += 1
            elif 0x4E00 <= o <= 0x9FFF:
                han += 1
            elif ch.isascii() and ch.isalpha():
                latin += 1
    if kana and kana * 10 >= han:
        return "ja"
    if han > latin / 4 and han:
        return "ja" if kana else "zh"
    return "en"
