"""The words a line of memory rests on: content terms, names, numbers and negation, per language.

Grounding (`check`) asks whether a line a model wrote is supported by the messages it
cites. That needs the same reading of both sides: the terms that carry the line's content (a
stemmed English word with its irregular forms folded, "went" → "go"; a Japanese dictionary form
from SudachiPy, 行った → 行く; Chinese character bigrams; a Korean word without its particle,
친구를 → 친구), the names it uses (capitalized words,
katakana words and Sudachi's proper nouns), its numbers ("five" and "5" are one number) and
whether it negates (a line that says "not" where its source does not has turned it around).

Words that only frame a line ("said", "told", "asked", "the user", 話す, 尋ねる) and light verbs
("got", "made", "felt") are not content: a faithful paraphrase uses them freely, an invention
does not need them. Each language's words are data (`kioku.lang`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from kioku import morph
from kioku.lang import EN, JA, KO, WORDS, ZH
from kioku.sentences import SENTENCE_END

_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019][A-Za-z]+)?")
_CAPITAL = re.compile(r"\b[A-Z][A-Za-z0-9'\u2019\-]*[A-Za-z0-9]\b")
_KATAKANA = re.compile(r"[\u30a1-\u30fa\u30fc]{2,}")
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")

# the words of each language a line is read by (`kioku.lang`)
_FRAMING_EN = EN.framing
_LIGHT_EN = EN.light_verbs
_AUXILIARY = EN.auxiliaries
_IRREGULAR = EN.irregular
_NUMBERS = EN.numbers
_NEGATION_EN = EN.negation
_NOT_NAMES = EN.not_names  # capitalized words that are not names
_FRAMING_JA = JA.framing
_FRAMING_ZH = ZH.framing


def _stemmer():  # type: ignore[no-untyped-def]
    try:
        import Stemmer  # PyStemmer, already kioku's (the archive's) stemmer

        return Stemmer.Stemmer("english").stemWord
    except ImportError:  # pragma: no cover - PyStemmer is a dependency
        return lambda w: w


_STEM = _stemmer()


@lru_cache(maxsize=1)
def _stop_en() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(STOPWORDS_EN_PLUS) | _FRAMING_EN | _LIGHT_EN


def fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'")


@lru_cache(maxsize=65536)
def en_term(word: str) -> str | None:
    """One English word as a content term (None: it frames or carries nothing)."""
    w = word.lower()
    if w in _NUMBERS:
        return _NUMBERS[w]
    if w.endswith("'s"):
        w = w[:-2]
    if w in _stop_en() or w in _NEGATION_EN or len(w) < 2 and not w.isdigit():
        return None  # negation is the line's polarity (`Reading.negated`), not a term
    if w.isdigit():
        return str(int(w)) if len(w) < 5 else w
    return _STEM(_IRREGULAR.get(w, w))


@dataclass(frozen=True)
class Reading:
    """What a text says, as grounding compares it."""

    terms: frozenset[str]  # content terms
    names: frozenset[str]  # names as written (capitalized words, katakana, proper nouns)
    numbers: frozenset[str]
    negated: bool
    # light verbs ("see", "got"): left out of a line's content, unless it has almost none
    # ("asked if she could see the painting" rests on "see" as much as on "painting")
    soft: frozenset[str] = frozenset()
    # Japanese predicates by dictionary form: told as done (行きました, 行ってきた) and told
    # otherwise (行きたい, 行く予定): a line that makes a plan of its message an event is false
    done: frozenset[str] = frozenset()
    undone: frozenset[str] = frozenset()
    # characters no Japanese text uses (simplified Chinese 长, 这): a model writing
    # Japanese slips into Chinese, and the line then says what no message said
    foreign: frozenset[str] = frozenset()


_CHAIN_POS = (("助動詞",), ("助詞", "接続助詞"), ("動詞", "非自立可能"), ("形容詞", "非自立可能"))


def ja_tenses(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The predicates of `text` told as done, and those told otherwise (dictionary forms).
    A predicate is done when its chain of auxiliaries holds た: 行っ-て-き-まし-た."""
    ws = morph.words(text)
    done: set[str] = set()
    undone: set[str] = set()
    i = 0
    while i < len(ws):
        w = ws[i]
        i += 1
        if w.major not in ("動詞", "形容詞"):
            continue
        past = False
        while i < len(ws) and any(ws[i].is_(*pos) for pos in _CHAIN_POS):
            past = past or (ws[i].is_("助動詞") and ws[i].base == "た")
            i += 1
        (done if past else undone).add(w.base)
    return frozenset(done), frozenset(undone)


# Chinese words a Japanese sentence has no use for standing alone (我也, 是, 很)
_CHINESE_WORDS = ZH.function_words


def foreign_han(text: str) -> frozenset[str]:
    """The Chinese in a Japanese `text`: ideographs outside what Japanese writing encodes
    (cp932: 长, 这, 们) and Chinese function words Sudachi reads as words of their own."""
    out = set()
    for ch in set(_HAN.findall(text)):
        try:
            ch.encode("cp932")
        except UnicodeEncodeError:
            out.add(ch)
    for w in morph.words(text):
        if w.surface in _CHINESE_WORDS and not w.is_("接尾辞") and not w.is_("接頭辞"):
            out.add(w.surface)
    return frozenset(out)


def _ja_terms(text: str) -> tuple[set[str], set[str], set[str], bool]:
    terms: set[str] = set()
    names: set[str] = set()
    numbers: set[str] = set()
    negated = False
    for w in morph.words(text):
        if (w.is_("助動詞") or w.is_("形容詞")) and w.base in JA.negation:
            negated = True
        if w.is_("名詞", "数詞"):
            numbers.add(unicodedata.normalize("NFKC", w.surface))
            continue
        named = w.is_("名詞", "固有名詞") or _KATAKANA.fullmatch(w.surface)
        if named and w.surface not in _FRAMING_JA and w.base not in _FRAMING_JA:
            names.add(w.surface)
        if morph.is_content(w) and w.base not in _FRAMING_JA and w.surface not in _FRAMING_JA:
            terms.add(w.base)
    return terms, names, numbers, negated


def _zh_terms(text: str) -> set[str]:
    out: set[str] = set()
    for run in _HAN_RUN.findall(text):
        out.update(run[i : i + 2] for i in range(len(run) - 1))
    return out - _FRAMING_ZH


_HANGUL_WORD = re.compile(r"[\uac00-\ud7af]+")


_PARTICLES_KO = sorted(KO.particles, key=len, reverse=True)


def ko_word(word: str) -> str:
    """A Korean word without the particle it ends on (친구를 → 친구), where two syllables or
    more are left (아이 stays 아이)."""
    for p in _PARTICLES_KO:
        if word.endswith(p) and len(word) - len(p) >= 2:
            return word[: -len(p)]
    return word


def _ko_terms(text: str) -> tuple[set[str], bool]:
    """Korean content words (what spaces part, without their particle) and whether a word
    negates."""
    terms: set[str] = set()
    negated = False
    for w in _HANGUL_WORD.findall(text):
        if w in KO.negation or any(p in w for p in KO.negation_parts):
            negated = True
            continue
        if w not in KO.particles:  # a particle after a word in another script ("Mika는")
            terms.add(ko_word(w))
    return terms, negated


_CITATION = re.compile(r"#\s*\d+")


@lru_cache(maxsize=32768)
def read(text: str, lang: str = "en") -> Reading:
    """The terms, names, numbers and negation of `text` (any script mixed in is read too).
    A citation ("#15") is where a line points, not what it says."""
    t = _CITATION.sub(" ", fold(text))
    terms: set[str] = set()
    numbers: set[str] = set()
    negated = False
    soft: set[str] = set()
    for m in _WORD.finditer(t):
        word = m.group(0)
        if word.lower() in _NEGATION_EN or word.lower().endswith("n't"):
            negated = True
        if word.lower() in _LIGHT_EN and word.lower() not in _AUXILIARY:
            soft.add(_STEM(_IRREGULAR.get(word.lower(), word.lower())))
        term = en_term(word)
        if term is None:
            continue
        if term.isdigit():
            numbers.add(term)
        terms.add(term)
    names = {m.group(0) for m in _CAPITAL.finditer(t) if m.group(0) not in _NOT_NAMES}
    names = {n.removesuffix("'s") for n in names}
    done: frozenset[str] = frozenset()
    undone: frozenset[str] = frozenset()
    foreign: frozenset[str] = frozenset()
    if _KANA.search(t) or (lang == "ja" and _CJK.search(t)):
        jt, jn, jnum, jneg = _ja_terms(t)
        terms |= jt
        names |= jn
        numbers |= jnum
        negated = negated or jneg
        done, undone = ja_tenses(t)
        foreign = foreign_han(t)
    elif _CJK.search(t):
        terms |= _zh_terms(t)
        negated = negated or any(x in t for x in ZH.negation)
    if _HANGUL_WORD.search(t):
        kt, kneg = _ko_terms(t)
        terms |= kt
        negated = negated or kneg
    return Reading(
        frozenset(terms),
        frozenset(names),
        frozenset(numbers),
        negated,
        frozenset(soft),
        done,
        undone,
        foreign,
    )


_ASKING = re.compile("|".join(x.asking for x in WORDS.values() if x.asking), re.I)


def asks(text: str) -> bool:
    """A question, or a line that says someone asked one ("asked whether", 尋ねた, 聞いた)."""
    t = fold(text)
    return "?" in t or _ASKING.search(t) is not None


_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff0-9０-９]+")
_KANJI_OR_DIGIT = re.compile(r"[\u30a1-\u30fa\u3400-\u4dbf\u4e00-\u9fff0-9]")
_PHRASE_CHARS = 4


@lru_cache(maxsize=32768)
def phrases(text: str) -> frozenset[str]:
    """The short runs of `text` a line copies when it copies words: four characters of
    Japanese or Chinese holding an ideograph, katakana or a digit ("3回通っ", "シャいい"), or
    three English words two of which carry content ("swim three times")."""
    t = fold(text)
    out: set[str] = set()
    for run in _RUN.findall(t):
        for i in range(len(run) - _PHRASE_CHARS + 1):
            gram = run[i : i + _PHRASE_CHARS]
            if _KANJI_OR_DIGIT.search(gram):
                out.add(gram)
    words = [w.lower() for w in _WORD.findall(t)]
    for i in range(len(words) - 2):
        three = words[i : i + 3]
        if sum(en_term(w) is not None for w in three) >= 2:
            out.add(" ".join(three))
    return frozenset(out)


_FIRST_PERSON = re.compile("|".join(x.first_person for x in WORDS.values() if x.first_person))


# Japanese drops the 私: speech shows in its polite or spoken sentence ends ("…ヤバいです。",
# "知らなかったですー!", "…思いますけどね。") and its exclamations; a summary is plain, or says
# who and that they said it ("ミカは…と言っています")
_SPOKEN_JA = re.compile(rf"(?:{JA.spoken_endings})[ねよなわー〜~]*(?:[。.!?…]|$)|!")
_REPORTED_JA = re.compile(JA.reported_speech)


def first_person(text: str, speaker: str = "") -> bool:
    """The line speaks as its writer ("I'm thrilled…", 私も, "知らなかったですー!"): it gives
    itself out as their words. `speaker`: a Japanese line that names them as its subject
    ("ミカは…") tells of them instead."""
    t = fold(text)
    if _FIRST_PERSON.search(t):
        return True
    if not _KANA.search(t) or _REPORTED_JA.search(t):
        return False
    if speaker and re.search(re.escape(fold(speaker)) + r"\s*[はが]", t):
        return False
    return _SPOKEN_JA.search(t) is not None


_QUOTE_TOKEN = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
MEDIA = re.compile(r"\[[^\[\]\n]*\]")  # "[shares a photo: a cup with a dog face]"


def with_captions(line: str, said: str) -> str:
    """The line with each media marker the message does not have ("[shares a photo]") put
    back as the message has it ("[shares a photo: a photo of a cup with a dog face on it]"):
    a model shortened a photo's marker, and with it the only place the answer to "What
    kind of pot did they make?" was said."""
    theirs = [m.group(0) for m in MEDIA.finditer(said)]
    rest = [x for x in theirs if x not in line]

    def caption(m: re.Match[str]) -> str:
        return m.group(0) if m.group(0) in theirs or not rest else rest.pop(0)

    return MEDIA.sub(caption, line)


def quoted_share(line: str, said: str) -> float:
    """How much of its least faithful sentence a line keeps, in order, of what was said
    (words; characters in Japanese): 1.0 for a quote or a cut of one, less for each word put
    in ("I'm doing my best to make a family" for "I'm thrilled to make a family")."""
    theirs = _QUOTE_TOKEN.findall(fold(said).casefold())
    worst = 1.0
    line = MEDIA.sub(" ", line)  # "[image shared]": the model's word for a photo, not theirs
    for sentence in SENTENCE_END.split(fold(line).casefold()):
        mine = [
            t
            for t in _QUOTE_TOKEN.findall(sentence)
            if not _FIRST_PERSON.fullmatch(t)
            and t not in _FRAMING_EN  # "said: …" is no word of theirs
        ]
        if not mine:
            continue
        blocks = SequenceMatcher(None, mine, theirs, autojunk=False).get_matching_blocks()
        worst = min(worst, sum(b.size for b in blocks) / len(mine))
    return worst


def name_key(name: str) -> str:
    return fold(name).casefold().strip()


# text of the prompt itself ------------------------------------------------------------------

_NGRAM_WORDS = 4
_NGRAM_CHARS = 6
_SPACE_PUNCT = re.compile(r"[\s\W_]+")


def _latin_ngrams(text: str, n: int = _NGRAM_WORDS) -> set[tuple[str, ...]]:
    words = [w.lower() for w in _WORD.findall(fold(text))]
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _cjk_ngrams(text: str, n: int = _NGRAM_CHARS) -> set[str]:
    out: set[str] = set()
    for run in _SPACE_PUNCT.split(fold(text)):
        if _CJK.search(run):
            out.update(run[i : i + n] for i in range(len(run) - n + 1))
    return out


@dataclass(frozen=True)
class PromptText:
    """The n-grams of the prompt's own words (instructions, placeholders) that the
    conversation itself does not use: a line holding one copied the prompt."""

    latin: frozenset[tuple[str, ...]]
    cjk: frozenset[str]

    @classmethod
    def of(cls, prompt: str, conversation: Iterable[str], names: Iterable[str] = ()) -> PromptText:
        p = prompt
        for n in sorted({x for x in names if x.strip()}, key=len, reverse=True):
            p = p.replace(n, "\x00")  # a name is the conversation's, never the prompt's
        convo = "\n".join(conversation)
        latin = _latin_ngrams(p) - _latin_ngrams(convo)
        cjk = _cjk_ngrams(p) - _cjk_ngrams(convo)
        return cls(frozenset(latin), frozenset(cjk))

    def copied(self, line: str) -> str | None:
        """The first run of the prompt's words in `line`, or None."""
        for words in sorted(_latin_ngrams(line)):
            if words in self.latin:
                return " ".join(words)
        for chars in sorted(_cjk_ngrams(line)):
            if chars in self.cjk:
                return chars
        return None


EMPTY_PROMPT = PromptText(frozenset(), frozenset())
PLACEHOLDER = re.compile(r"<[^<>\n]{1,60}>")
