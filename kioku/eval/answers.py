"""Gold answers against contexts and replies: normalization, containment, LoCoMo's F1.

The LLM-free proxy asks one question of a context: is every token of the gold answer in it?
Tokens are normalized the way the LoCoMo and SQuAD scorers do (lowercase, punctuation and the
articles a/an/the removed). A token in a CJK script has no spaces around it in running text, so
it counts as present when it occurs anywhere in the normalized context; a Latin token must be a
whole word of it. F1 follows the LoCoMo paper's scorer (Porter stems; multi-hop answers are
split on commas and each part takes its best match).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_POSSESSIVE = re.compile(r"(\w)['\u2019]s\b")
_ARTICLES_AND = re.compile(r"\b(?:a|an|the|and)\b")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff66-\uff9f]")


def _strip_punct(text: str) -> str:
    return "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)


def normalize(text: object) -> str:
    """Lowercase, NFKC, punctuation and symbols out, articles out, single spaces."""
    s = unicodedata.normalize("NFKC", str(text)).lower()
    s = _POSSESSIVE.sub(r"\1", s)
    s = _strip_punct(s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(answer: object) -> list[str]:
    return normalize(answer).split()


class ContextIndex:
    """A context, normalized once, that many answers are looked up in."""

    def __init__(self, text: str) -> None:
        self.text = normalize(text)
        self.words = frozenset(self.text.split())
        self.cjk = bool(_CJK.search(self.text))

    def has(self, token: str) -> bool:
        if _CJK.search(token):
            return token in self.text
        if token in self.words:
            return True
        # in CJK running text a number or a Latin word has no spaces around it ("18歳")
        return (
            self.cjk
            and re.search(rf"(?<![^\W_]){re.escape(token)}(?![^\W_])", self._latin) is not None
        )

    @property
    def _latin(self) -> str:
        """The text with CJK characters as word boundaries."""
        cached = self.__dict__.get("_latin_text")
        if cached is None:
            cached = self.__dict__["_latin_text"] = _CJK.sub(" ", self.text)
        return cached

    def contains(self, answer: object) -> bool:
        """True when every normalized token of `answer` is in the context (False for an empty
        answer: nothing to find is not a hit)."""
        toks = answer_tokens(answer)
        return bool(toks) and all(self.has(t) for t in toks)

    def missing(self, answer: object) -> list[str]:
        return [t for t in answer_tokens(answer) if not self.has(t)]


@lru_cache(maxsize=64)
def index_of(text: str) -> ContextIndex:
    """Contexts repeat (the memory and raw window are the same for every question at the end
    of a conversation): normalize each once."""
    return ContextIndex(text)


def answer_in_context(answer: object, *contexts: str) -> bool:
    """Every token of `answer` in the union of `contexts`."""
    toks = answer_tokens(answer)
    if not toks:
        return False
    indexes = [index_of(c) for c in contexts if c]
    return all(any(ix.has(t) for ix in indexes) for t in toks)


# LoCoMo's F1 -----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _stemmer() -> object:
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("porter")


def _f1_tokens(text: object) -> list[str]:
    s = str(text).replace(",", "").lower()
    s = "".join(ch for ch in s if unicodedata.category(ch)[0] != "P")
    s = _ARTICLES_AND.sub(" ", s)
    return list(_stemmer().stemWords(s.split()))  # type: ignore[attr-defined]


def f1_score(prediction: object, gold: object) -> float:
    pred, ref = _f1_tokens(prediction), _f1_tokens(gold)
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_multi(prediction: str, gold: str) -> float:
    preds = [p.strip() for p in str(prediction).split(",")]
    golds = [g.strip() for g in str(gold).split(",")]
    return sum(max(f1_score(p, g) for p in preds) for g in golds) / len(golds)


def locomo_f1(prediction: str, gold: object, category: int) -> float:
    """The LoCoMo paper's QA score: multi-hop (1) split on commas; open-domain (3) takes the
    gold answer's first alternative; temporal (2) and single-hop (4) plain token F1."""
    g = str(gold)
    if category == 1:
        return f1_multi(prediction, g)
    if category == 3:
        g = g.split(";")[0].strip()
    return f1_score(prediction, g)


def mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return round(sum(v) / len(v), 4) if v else None
