"""Gold answers against contexts and replies: normalization, the three matches, LoCoMo's F1.

The LLM-free proxy asks of a context whether the gold answer is in it. Three answers to that
question are reported side by side, strictest first:

- **strict** (`answer_in_context` in the results): the normalized gold answer occurs in the
  normalized context as a contiguous phrase, on word boundaries. A multi-hop answer (LoCoMo
  category 1) is a list, split on commas as LoCoMo's own scorer splits it: every item must occur
  as a phrase (in any order). An open-domain answer (category 3) is its first alternative
  (before ";"), as in that scorer. A verdict ("yes", "likely no") is not something a context
  can be searched for — "yes" is in nearly every conversation — so an answer made only of
  verdict words is never found by the strict match or the F1 (it still counts as a question).
- **f1**: token F1 between the answer and the best-matching window of the context, the window as
  long as the answer (so precision and recall are both the share of the answer's tokens found
  together there, in any order); a list answer averages its items. 1.0 when strict holds.
- **bag_of_words**: every normalized token of the whole answer occurs *anywhere* in the context,
  the match used before the strict one. A context made of nothing but a conversation's
  vocabulary passes it about as often as the full conversation does, so it is kept only as a
  secondary column, to compare with older figures.

Normalization follows the SQuAD/LoCoMo scorers (NFKC, lowercase, punctuation and the articles
a/an/the out) and writes every date the same way ("2023-05-08", "May 8th, 2023" and
"8 May, 2023" all read "8 may 2023"), so that the match does not depend on which date format a
strategy's prompt uses. A token in a CJK script has no spaces around it in running text: a CJK
phrase is searched with the spaces taken out, and a Latin token (a number, a name) next to CJK
characters is on a word boundary ("18" is in "18歳", not in "118歳"). F1 counts each CJK
character as a token.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from kioku import dates

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_POSSESSIVE = re.compile(r"(\w)['\u2019]s\b")
_ARTICLES_AND = re.compile(r"\b(?:a|an|the|and)\b")
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff66-\uff9f"
_CJK = re.compile(f"[{_CJK_CHARS}]")
_CJK_RUN = re.compile(f"([{_CJK_CHARS}])")
_LIST_LEAD = re.compile(r"^(?:and|or)\s+")

MONTHS = tuple(m.lower() for m in dates.MONTHS)  # after normalization, lowercase
_MONTH_OF = {m: m for m in MONTHS} | {m[:3]: m for m in MONTHS} | {"sept": "september"}
_MONTH = rf"({'|'.join(sorted(_MONTH_OF, key=len, reverse=True))})\.?"
_ORD = r"(?:st|nd|rd|th)?"
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})(?:[t ]\d{1,2}:\d{2}(?::\d{2})?)?\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH} (\d{{1,2}}){_ORD},? (\d{{4}})\b")
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}}){_ORD} (?:of )?{_MONTH},? (\d{{4}})\b")

VERDICT_WORDS = frozenset(
    ["yes", "no", "not", "likely", "unlikely", "maybe", "probably", "possibly", "somewhat"]
)
MULTI_HOP = 1
OPEN_DOMAIN = 3


def _strip_punct(text: str) -> str:
    return "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)


def _day_month(day: str, month: str, year: str) -> str:
    return f"{int(day)} {_MONTH_OF[month]} {year}"


def canonical_dates(text: str) -> str:
    """Every full date in lowercase `text` as "d month yyyy" (invalid ISO dates stay)."""

    def iso(m: re.Match[str]) -> str:
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return m.group(0)
        return f"{d} {MONTHS[mo - 1]} {y}"

    text = _ISO_DATE.sub(iso, text)
    text = _MONTH_DAY_YEAR.sub(lambda m: _day_month(m.group(2), m.group(1), m.group(3)), text)
    return _DAY_MONTH_YEAR.sub(lambda m: _day_month(m.group(1), m.group(2), m.group(3)), text)


def normalize(text: object) -> str:
    """Lowercase, NFKC, dates in one form, punctuation and symbols out, articles out, single
    spaces."""
    s = unicodedata.normalize("NFKC", str(text)).lower()
    s = canonical_dates(s)
    s = _POSSESSIVE.sub(r"\1", s)
    s = _strip_punct(s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(answer: object) -> list[str]:
    return normalize(answer).split()


def f1_tokens(normalized: str) -> list[str]:
    """Tokens for the window F1: words, and each CJK character on its own."""
    return _CJK_RUN.sub(r" \1 ", normalized).split()


def answer_items(answer: object, category: int | None = None) -> list[str]:
    """The phrases a strict match must find, normalized: one, or a multi-hop list's items."""
    text = str(answer)
    if category == OPEN_DOMAIN:
        text = text.split(";")[0]
    parts = text.split(",") if category == MULTI_HOP else [text]
    items = [_LIST_LEAD.sub("", normalize(p)) for p in parts]
    return [i for i in items if i]


def is_verdict(item: str) -> bool:
    """A normalized answer made only of words like "yes", "likely", "no"."""
    return bool(item) and set(item.split()) <= VERDICT_WORDS


@dataclass(frozen=True)
class Match:
    """How well one gold answer is found in one context."""

    strict: bool
    f1: float
    bag_of_words: bool
    where: tuple[int, int] | None = None  # the strict (or best F1) window, in F1 tokens


class ContextIndex:
    """A context, normalized once, that many answers are looked up in."""

    def __init__(self, text: str) -> None:
        self.text = normalize(text)
        self.words = frozenset(self.text.split())
        self.cjk = bool(_CJK.search(self.text))

    # bag of words (the old match) -------------------------------------------------------------

    def has(self, token: str) -> bool:
        if _CJK.search(token):
            return token in self.text
        if token in self.words:
            return True
        # in CJK running text a number or a Latin word has no spaces around it ("18歳")
        return self.cjk and f" {token} " in self._latin

    @cached_property
    def _latin(self) -> str:
        """The text with CJK characters as word boundaries, padded with spaces."""
        return " " + " ".join(_CJK.sub(" ", self.text).split()) + " "

    def contains(self, answer: object) -> bool:
        """Bag of words: every normalized token of `answer` anywhere in the context (False for
        an empty answer: nothing to find is not a hit)."""
        toks = answer_tokens(answer)
        return bool(toks) and all(self.has(t) for t in toks)

    def missing(self, answer: object) -> list[str]:
        return [t for t in answer_tokens(answer) if not self.has(t)]

    # strict -----------------------------------------------------------------------------------

    @cached_property
    def _padded(self) -> str:
        return f" {self.text} "

    @cached_property
    def _compact(self) -> str:
        return self.text.replace(" ", "")

    def phrase(self, phrase: str) -> bool:
        """`phrase` (normalized) as a contiguous run of whole words of the context."""
        if not phrase:
            return False
        if _CJK.search(phrase):
            compact = phrase.replace(" ", "")
            pattern = re.escape(compact)
            if not _CJK.match(compact[0]):
                pattern = r"(?<![0-9a-z])" + pattern
            if not _CJK.match(compact[-1]):
                pattern += r"(?![0-9a-z])"
            return re.search(pattern, self._compact) is not None
        return f" {phrase} " in self._padded or (self.cjk and f" {phrase} " in self._latin)

    # window F1 --------------------------------------------------------------------------------

    @cached_property
    def _ids(self) -> tuple[dict[str, int], np.ndarray]:
        vocab: dict[str, int] = {}
        ids = [vocab.setdefault(t, len(vocab)) for t in f1_tokens(self.text)]
        return vocab, np.asarray(ids, dtype=np.int32)

    def window_f1(self, phrase: str) -> tuple[float, tuple[int, int] | None]:
        """The best F1 of a window as long as `phrase` (normalized), and where it starts/ends."""
        want = Counter(f1_tokens(phrase))
        n = sum(want.values())
        vocab, ids = self._ids
        present = [(vocab[t], c) for t, c in want.items() if t in vocab]
        if not n or not present or not len(ids):
            return 0.0, None
        width = min(n, len(ids))
        overlap = np.zeros(len(ids) - width + 1, dtype=np.int32)
        for vid, count in present:
            seen = np.concatenate(([0], np.cumsum(ids == vid, dtype=np.int32)))
            overlap += np.minimum(seen[width:] - seen[:-width], count)
        start = int(overlap.argmax())
        best = int(overlap[start])
        if best == 0:
            return 0.0, None
        return 2 * best / (width + n), (start, start + width)

    def token_span(self, span: tuple[int, int], around: int = 12) -> str:
        """The context's F1 tokens around a window, for a person to read."""
        toks = f1_tokens(self.text)
        lo, hi = max(0, span[0] - around), min(len(toks), span[1] + around)
        return " ".join(toks[lo:hi])

    def match(self, answer: object, category: int | None = None) -> Match:
        items = answer_items(answer, category)
        if not items or any(is_verdict(i) for i in items):
            return Match(False, 0.0, self.contains(answer))
        scored = [self.window_f1(i) for i in items]
        strict = all(self.phrase(i) for i in items)
        f1 = 1.0 if strict else sum(s for s, _ in scored) / len(scored)
        return Match(strict, round(f1, 4), self.contains(answer), scored[0][1])


@lru_cache(maxsize=64)
def index_of(text: str) -> ContextIndex:
    """Contexts repeat (the memory and raw window are the same for every question at the end
    of a conversation): normalize each once."""
    return ContextIndex(text)


def match(answer: object, context: str, category: int | None = None) -> Match:
    return index_of(context).match(answer, category)


def answer_in_context(answer: object, context: str, category: int | None = None) -> bool:
    """The strict match: `answer` as a contiguous normalized phrase of `context`."""
    return match(answer, context, category).strict


def bag_of_words(answer: object, *contexts: str) -> bool:
    """Every token of `answer` somewhere in the union of `contexts` (the old, lenient match)."""
    toks = answer_tokens(answer)
    if not toks:
        return False
    indexes = [index_of(c) for c in contexts if c]
    return all(any(ix.has(t) for ix in indexes) for t in toks)


# LoCoMo's F1 (of a model's answer, not of a context) -------------------------------------------
# As LoCoMo's own scorer (task_eval/evaluation.py) computes it: commas out, lowercase, ASCII
# punctuation out, the words a/an/the/and out, Porter stems; per category, multi-hop (1) splits
# gold and reply on commas and averages each gold item's best F1, open-domain (3) scores the
# gold's first alternative (before ";"), adversarial (5) is right when the reply says the
# conversation does not tell, temporal (2) and single-hop (4) are plain token F1.

ADVERSARIAL = 5
# the phrases LoCoMo's scorer reads as "not known" in an adversarial reply (lowercased)
NOT_KNOWN = ("no information available", "not mentioned")
_ASCII_PUNCT = frozenset(string.punctuation)


@lru_cache(maxsize=1)
def _stemmer() -> tuple[str, Callable[[list[str]], list[str]]]:
    """NLTK's PorterStemmer, the one LoCoMo's scorer uses, where NLTK is installed; else the
    original Porter algorithm (PyStemmer), which differs on a few words (NLTK's extensions:
    "dying", "sky", "emotionally"). `stemmer_name()` says which one scored a run."""
    try:
        from nltk.stem import PorterStemmer

        ps = PorterStemmer()
        return "nltk-porter", lambda words: [ps.stem(w) for w in words]
    except ImportError:
        import Stemmer  # PyStemmer

        st = Stemmer.Stemmer("porter")
        return "pystemmer-porter", lambda words: list(st.stemWords(words))


def stemmer_name() -> str:
    return _stemmer()[0]


def _f1_tokens(text: object) -> list[str]:
    s = str(text).replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _ASCII_PUNCT)
    s = _ARTICLES_AND.sub(" ", s)
    return _stemmer()[1](s.split())


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


def says_not_known(reply: str) -> bool:
    """The reply says the conversation does not tell (LoCoMo's adversarial rule)."""
    low = str(reply).lower()
    return any(p in low for p in NOT_KNOWN)


def locomo_f1(prediction: str, gold: object, category: int) -> float:
    """The LoCoMo paper's QA score of a reply: multi-hop (1) split on commas; open-domain (3)
    takes the gold answer's first alternative; adversarial (5) is 1 when the reply says it is
    not known, else 0; temporal (2) and single-hop (4) plain token F1."""
    g = str(gold)
    if category == ADVERSARIAL:
        return 1.0 if says_not_known(prediction) else 0.0
    if category == MULTI_HOP:
        return f1_multi(prediction, g)
    if category == OPEN_DOMAIN:
        g = g.split(";")[0].strip()
    return f1_score(prediction, g)


def reply_strict(reply: str, gold: object, category: int) -> bool:
    """The strict match of the gold answer in a model's reply (the phrase rule of `match`); an
    adversarial question's reply is right when it says the answer is not known."""
    if category == ADVERSARIAL:
        return says_not_known(reply)
    # unlike a context, a reply that says "yes" answers a verdict: every item counts here
    items = answer_items(gold, category)
    return bool(items) and all(index_of(reply).phrase(i) for i in items)


def mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return round(sum(v) / len(v), 4) if v else None
