"""Languages: which one a conversation is in (`detect_lang`), and what kioku knows of each, as
data (`Language`: one module per language, `en.py`, `ja.py`, `zh.py`, `ko.py`).

Prompts, memory headers and length targets differ per language; the script mix is a reliable
enough signal to tell the languages kioku knows apart (`detect_lang` reads each one's letters
from its value). The chronicler has templates for three (`LANGS`); a conversation in another
(Korean) is read with its own words and written about with English templates
(`kioku.prompts.resolve_lang`). The checks that read a
message by its words (recall's cues, grounding's terms, salience's fillers) read them from
`WORDS`, and try every language's words where a message may mix them.
"""

from __future__ import annotations

import re
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


def _letters(lang: Language) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in lang.letters) + "]")


_LETTERS = {code: _letters(x) for code, x in WORDS.items() if x.letters}


def detect_lang(texts: Iterable[str] | str) -> str:
    """The language whose letters weigh most in `texts` (each language's `letters`, at its
    `letter_weight`; a language's `borrows` count for it where its own letters are there), or
    English. A tie goes to the language listed first."""
    text = texts if isinstance(texts, str) else "\n".join(texts)
    own = {code: len(p.findall(text)) for code, p in _LETTERS.items()}
    weight = {code: n * WORDS[code].letter_weight for code, n in own.items()}
    score = {
        code: w + (sum(weight.get(b, 0.0) for b in WORDS[code].borrows) if own[code] else 0.0)
        for code, w in weight.items()
    }
    best = max(score, key=lambda code: score[code], default="en")
    return best if score.get(best) else "en"
