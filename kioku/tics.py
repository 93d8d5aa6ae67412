"""The verbal-tic guard: find a phrase the character keeps repeating, and keep it out of memory.

Seed 003: a few days in, one short ending was in 11 of the last 20 replies, and the summarizer had
written "she often uses that expression" into memory, closing a loop: the raw window taught the
model the tic, memory made it permanent. An instruction in the system prompt did little ("a
dozen live examples beat one abstract rule"); what worked was data: cut the tic out of memory,
tell the summarizer to keep speech patterns out, keep an anti-repetition line in the request,
and offer a *cut* when the window is saturated.

Everything here is pure. `detect_tics` counts, over the last 20 assistant messages, sentence
endings, message openers and repeated internal phrases, each at most once per message, on
"atoms" (a word of a spaced script, or one CJK character), so it works for English and Japanese
alike. It reports maximal phrases only, and ignores punctuation and function-word scraps.

A phrase that declines ("I don't remember", 覚えてない, 不记得: each language's `declining`) is
never alerted. A character asked about what was never said answers so as often as the
questions call for it, and a model told not to say it does not know says something else:
it invents. Honesty outranks style here.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from bm25s.stopwords import STOPWORDS_EN_PLUS

from kioku.inert import one_line
from kioku.lang import WORDS

DEFAULT_WINDOW = 20  # the seed counted over the last 20 replies
DEFAULT_THRESHOLD = 8  # the seed's tic was in 11 of 20; 8 leaves room to act before that
MAX_ENDING_ATOMS = 10
MIN_PHRASE_ATOMS = 3
# Inside a reply, shorter repeats are mostly the topic ("the new job", 「新しい仕事」), not a tic.
MIN_PHRASE_WORDS = 4
MIN_PHRASE_CJK = 6
MAX_PHRASE_ATOMS = 24
MAX_ALERTS = 5

TicKind = Literal["ending", "opener", "phrase"]


@dataclass(frozen=True)
class TicAlert:
    phrase: str
    count: int  # messages (of the last `window`) that contain it
    window: int
    kind: TicKind = "phrase"


# atoms ---------------------------------------------------------------------------------------

_CJK = "\u3005\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_ATOM = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])[^\W_])+(?:['\u2019](?:(?![{_CJK}])[^\W_])+)*|\S")
_SENTENCE = re.compile(r"[^.!?。！？\n…♪]*(?:[.!?。！？…♪~〜]+[」』）)\"'”’]*|\n|$)")
_HIRAGANA = re.compile(r"^[\u3040-\u309f]+$")
_STOP = frozenset(STOPWORDS_EN_PLUS)
# every language's: a reply may decline in another language than the conversation's
_DECLINING = re.compile(
    "|".join(f"(?:{x.declining})" for x in WORDS.values() if x.declining), re.IGNORECASE
)
# Japanese/Chinese endings and fillers so common in ordinary prose that repeating them is no tic
_FUNCTION_CJK = frozenset(
    [
        "です",
        "ます",
        "でした",
        "ました",
        "ません",
        "ですね",
        "ますね",
        "ですよ",
        "ますよ",
        "でしょう",
        "ましょう",
        "だね",
        "だよ",
        "よね",
        "ている",
        "ています",
        "ていた",
        "ない",
        "なかった",
        "ください",
        "と思います",
        "と思う",
        "かもしれません",
        "ありがとう",
        "的",
        "了",
        "吗",
        "呢",
        "吧",
        "是的",
        "我们",
        "你们",
        "他们",
        "这个",
        "那个",
        "什么",
        "没有",
        "可以",
        "我的",
        "你的",
    ]
)


@dataclass(frozen=True)
class _Atom:
    key: str  # casefolded
    start: int
    end: int


@lru_cache(maxsize=512)  # the last replies, again each turn
def _normalize(text: str) -> str:
    return re.sub(r"[ \t\u3000]+", " ", unicodedata.normalize("NFKC", text)).strip()


def _atoms(text: str, offset: int = 0) -> list[_Atom]:
    return [
        _Atom(m.group().casefold(), m.start() + offset, m.end() + offset)
        for m in _ATOM.finditer(text)
    ]


def _is_cjk(key: str) -> bool:
    return len(key) == 1 and re.match(f"[{_CJK}]", key) is not None


def _is_word(key: str) -> bool:
    return key[0].isalnum() and not _is_cjk(key)


def _is_symbol(key: str) -> bool:
    # ♪, ★, emoji: a decoration at the end of every reply is a tic too
    return len(key) == 1 and unicodedata.category(key) == "So"


@lru_cache(maxsize=8192)  # the same edges and phrases come back turn after turn
def _substantial(keys: tuple[str, ...], kind: TicKind) -> bool:
    """False for punctuation, stop words and common CJK function strings."""
    words = [k for k in keys if _is_word(k)]
    cjk = "".join(k for k in keys if _is_cjk(k))
    content = [w for w in words if w not in _STOP and len(w) > 1 and not w.isdigit()]
    symbols = [k for k in keys if _is_symbol(k)]
    if kind == "phrase":
        if words and not cjk:
            return len(words) >= MIN_PHRASE_WORDS and bool(content)
        return len(cjk) >= MIN_PHRASE_CJK and cjk not in _FUNCTION_CJK and not _HIRAGANA.match(cjk)
    if content or symbols:
        return True
    return len(cjk) >= 2 and cjk not in _FUNCTION_CJK


# detection -------------------------------------------------------------------------------------


def _sentence_atoms(text: str) -> list[list[_Atom]]:
    return [a for m in _SENTENCE.finditer(text) if (a := _atoms(m.group(), m.start()))]


# A turn looks at the last replies again, of which only the newest is new: each reply is parsed
# once (the results are read, never changed).
@lru_cache(maxsize=512)
def _parsed(text: str) -> _Parsed:
    sentences = _sentence_atoms(text)
    return _Parsed(sentences, _candidates(text, sentences), _shortest_grams(sentences))


def _shortest_grams(sentences: list[list[_Atom]]) -> dict[tuple[str, ...], list[tuple[int, int]]]:
    """Every n-gram of MIN_PHRASE_ATOMS atoms within a sentence → where it starts (sentence,
    atom): the first level of `_frequent_phrases`, the costly one, done once per reply."""
    n = MIN_PHRASE_ATOMS
    out: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    for j, sent in enumerate(sentences):
        keys = [a.key for a in sent]
        for i in range(len(keys) - n + 1):
            out.setdefault(tuple(keys[i : i + n]), []).append((j, i))
    return out


@dataclass(frozen=True)
class _Parsed:
    sentences: list[list[_Atom]]
    edges: tuple[dict[tuple[str, ...], str], dict[tuple[str, ...], str]]  # endings, openers
    grams: dict[tuple[str, ...], list[tuple[int, int]]]  # `_shortest_grams`


def _candidates(
    text: str, sentences: list[list[_Atom]]
) -> tuple[dict[tuple[str, ...], str], dict[tuple[str, ...], str]]:
    """(endings, openers) of one message: how its last sentence ends and its first begins,
    atom keys → their text as found. Only the message's edges: sentence endings inside a
    long reply repeat by chance far more often."""
    endings: dict[tuple[str, ...], str] = {}
    openers: dict[tuple[str, ...], str] = {}
    if not sentences:
        return endings, openers
    first, last = sentences[0], sentences[-1]
    for n in range(1, MAX_ENDING_ATOMS + 1):
        if n <= len(last):
            tail = last[-n:]
            endings[tuple(a.key for a in tail)] = text[tail[0].start : tail[-1].end]
        if n <= len(first):
            head = first[:n]
            openers[tuple(a.key for a in head)] = text[head[0].start : head[-1].end]
    return endings, openers


def _frequent_phrases(
    parsed: Sequence[_Parsed], texts: Sequence[str], threshold: int
) -> tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], str]]:
    """Atom n-grams within one sentence, in ≥ threshold documents, grown level by level: an
    (n+1)-gram can only be frequent where its n-gram prefix is, so each level looks at few
    positions. The first level comes counted with each reply (`_Parsed.grams`)."""
    counts: dict[tuple[str, ...], int] = {}
    shown: dict[tuple[str, ...], str] = {}
    docs = [p.sentences for p in parsed]
    df: Counter[tuple[str, ...]] = Counter()
    for p in parsed:
        df.update(p.grams.keys())
    frequent = {g for g, c in df.items() if c >= threshold}
    # per document, the start positions (sentence, atom) still worth extending → their n-gram
    grams = [
        dict(sorted((pos, g) for g in frequent.intersection(p.grams) for pos in p.grams[g]))
        for p in parsed
    ]
    n = MIN_PHRASE_ATOMS
    while frequent:
        counts.update({g: df[g] for g in frequent})
        for d, text, at in zip(docs, texts, grams, strict=True):
            for (j, i), g in at.items():
                if g not in shown:
                    shown[g] = text[d[j][i].start : d[j][i + n - 1].end]
        n += 1
        if n > MAX_PHRASE_ATOMS:
            break
        grams = [
            {(j, i): g + (d[j][i + n - 1].key,) for (j, i), g in at.items() if i + n <= len(d[j])}
            for d, at in zip(docs, grams, strict=True)
        ]
        df = Counter()
        for at in grams:
            df.update(set(at.values()))
        frequent = {g for g, c in df.items() if c >= threshold}
        grams = [{pos: g for pos, g in at.items() if g in frequent} for at in grams]
    return counts, shown


def detect_tics(
    replies: Sequence[str],
    threshold: int = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
) -> list[TicAlert]:
    """Phrases in at least `threshold` of the last `window` replies (assistant messages, oldest
    first), most widespread first. A phrase contained in a longer reported one is dropped unless
    it is in more messages than that one."""
    recent = [_normalize(t) for t in replies[-window:]]
    if threshold < 1 or len(recent) < threshold:
        return []
    seen: dict[tuple[str, ...], tuple[int, TicKind, str]] = {}

    def note(g: tuple[str, ...], count: int, kind: TicKind, text: str) -> None:
        if count >= threshold and _substantial(g, kind) and g not in seen:
            seen[g] = (count, kind, text)

    parsed = [_parsed(t) for t in recent]
    per_msg = [p.edges for p in parsed]
    passes: tuple[tuple[TicKind, int], ...] = (("ending", 0), ("opener", 1))
    for kind, pick in passes:
        df: Counter[tuple[str, ...]] = Counter()
        shown: dict[tuple[str, ...], str] = {}
        for cands in per_msg:
            df.update(cands[pick].keys())
            for g, text in cands[pick].items():
                shown.setdefault(g, text)
        for g, c in df.items():
            note(g, c, kind, shown[g])
    counts, shown_p = _frequent_phrases(parsed, recent, threshold)
    for g, c in counts.items():
        note(g, c, "phrase", shown_p[g])
    dominated: set[tuple[str, ...]] = set()
    for g, (c, _, _) in seen.items():
        for i in range(len(g)):
            for j in range(i + 1, len(g) + 1):
                sub = g[i:j]
                if sub != g and sub in seen and seen[sub][0] <= c:
                    dominated.add(sub)
    # a phrase that declines ("I don't remember") is an answer the questions called for: told
    # to avoid it, a model invents one instead. Its parts stay dominated: none of it is a tic
    alerts = [
        TicAlert(text, c, len(recent), kind)
        for g, (c, kind, text) in seen.items()
        if g not in dominated and not _DECLINING.search(text)
    ]
    alerts.sort(key=lambda a: (-a.count, -len(a.phrase), a.phrase))
    return alerts[:MAX_ALERTS]


# the generation-side guard -------------------------------------------------------------------

_LINES = {
    "en": (
        "Style note for this reply only: recent replies kept repeating {phrases}. Do not use "
        "these phrases or close variants in this reply; vary how sentences begin and end."
    ),
    "ja": (
        "この返信についての文体の注意：直近の返信で{phrases}が繰り返されています。"
        "この返信ではこれらの表現や似た言い回しを使わず、文の始まりと語尾に変化をつけてください。"
    ),
    "zh": "本条回复的文体提示：最近的回复反复使用了{phrases}。本条回复请不要使用这些表达或类似说法，变换句子的开头和结尾。",
}


def _quote(phrase: str, lang: str) -> str:
    return f"「{phrase}」" if lang in ("ja", "zh") else f'"{phrase}"'


def anti_repetition_line(alerts: Sequence[TicAlert], lang: str = "en") -> str:
    """One instruction for the END of the generation request (after the user message), never
    the system prompt: that stays byte-identical so the prefix cache survives. Empty when no
    alert."""
    if not alerts:
        return ""
    sep = "、" if lang in ("ja", "zh") else ", "
    # the phrases are the replies' words: inert, so a reply cannot write kioku's instruction
    phrases = sep.join(_quote(one_line(a.phrase), lang) for a in alerts)
    return _LINES.get(lang, _LINES["en"]).format(phrases=phrases)


# keeping tics out of memory ------------------------------------------------------------------

# Words that describe a way of speaking. Strong ones make a sentence about speech habits by
# themselves; weak ones ("often says") only with the tic phrase in the same sentence.
_STRONG_CUES = re.compile(
    r"catch ?phrase|verbal tic|pet phrase|speech habit|signature (?:phrase|line|ending)|"
    r"(?:that|this|the same|favou?rite) (?:expression|phrase)|口癖|口ぐせ|くちぐせ|決まり文句|"
    r"その表現|この表現|同じ表現|語尾|口头禅|口頭禪|那个表达|这个表达",
    re.IGNORECASE,
)
_WEAK_CUES = re.compile(
    r"\b(?:often|always|usually|keeps?|tends? to|habit|likes? to)\b|\bends?\b.*\bwith\b|"
    r"よく|いつも|たびたび|しばしば|癖|经常|总是|常常",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"「([^」]*)」|『([^』]*)』|\"([^\"]*)\"|“([^”]*)”")
_MEMORY_SENTENCE = re.compile(r"[^.!?。！？\n]*(?:[.!?。！？]+[」』）)\"'”’]*\s*|\n|$)")


def _fold(text: str) -> str:
    return _normalize(text).casefold()


def _core(phrase: str) -> str:
    """The phrase without its surrounding punctuation, for matching inside memory text."""
    return re.sub(r"^[\W_]+|[\W_]+$", "", _fold(phrase)) or _fold(phrase)


def _about_tic(sentence: str, cores: Sequence[str]) -> bool:
    if _STRONG_CUES.search(sentence):
        return True
    folded = _fold(sentence)
    for m in _QUOTED.finditer(folded):  # half a tic or more, quoted as a specimen
        inner = _core(next(g for g in m.groups() if g is not None))
        if any(inner in c and len(inner) * 2 >= len(c) for c in cores if inner):
            return True
    present = [c for c in cores if c and c in folded]
    if not present:
        return False
    return bool(_WEAK_CUES.search(sentence))


def _memory_sentences(line: str) -> list[str]:
    return [m.group() for m in _MEMORY_SENTENCE.finditer(line) if m.group()]


def strip_tics(memory_text: str, phrases: Iterable[str]) -> str:
    """Memory text without the sentences that describe a speech habit or quote a tic phrase.
    Facts stay: a sentence that merely contains the phrase in running text is kept."""
    cores = [_core(p) for p in phrases if p.strip()]
    out: list[str] = []
    for line in memory_text.splitlines(keepends=True):
        body = line.rstrip("\n")
        sentences = _memory_sentences(body)
        kept = [x for x in sentences if not _about_tic(x, cores)]
        if len(kept) == len(sentences):
            out.append(line)
        elif "".join(kept).strip():  # a line whose every sentence went is dropped whole
            out.append("".join(kept).rstrip() + line[len(body) :])
    return "".join(out)


def mentions_tic(summary_text: str, phrases: Iterable[str]) -> bool:
    """True when the text describes a speech habit or quotes a tic phrase (`strip_tics` would
    remove a sentence): a summary guard can reject such a summary and retry."""
    cores = [_core(p) for p in phrases if p.strip()]
    return any(
        _about_tic(x, cores) for line in summary_text.splitlines() for x in _memory_sentences(line)
    )
