"""Languages: which one a conversation is in (`detect_lang`), and what kioku knows of each, as
data (`Language`: one module per language, `en.py`, `ja.py`, `zh.py`, `ko.py`).

Prompts, memory headers and length targets differ per language; the script mix is a reliable
enough signal for the three the chronicler has templates for (`LANGS`). The checks that read a
message by its words (recall's cues, grounding's terms, salience's fillers) read them from
`WORDS`, and try every language's words where a message may mix them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kioku.lang.en import EN
from kioku.lang.ja import JA
from kioku.lang.ko import KO
from kioku.lang.words import Language, wordset
from kioku.lang.zh import ZH

LANGS = ("en", "ja", "zh")
# every language kioku reads words of, its prompt languages first
WORDS: Mapping[str, Language] = {x.code: x for x in (EN, JA, ZH, KO)}

__all__ = ["EN", "JA", "KO", "LANGS", "WORDS", "ZH", "Language", "detect_lang", "words", "wordset"]


def words(code: str) -> Language:
    """The words of language `code`; English's for one kioku has none of."""
    return WORDS.get(code, EN)


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
