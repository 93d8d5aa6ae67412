"""What a line carries out of context: its content words, and whether it carries anything.

Memory is read long after the moment: "はい、またー！", "Haha, yeah!", "…アレですよ、アレ！" or
"あなたは？" meant something only next to the lines around them. The extractive chronicler drops
such lines (greetings, with only names after them too: "Hey Samantha!"; fillers; questions
without content; lines whose only words point at something — あれ, that thing) and prefers
lines that bring new content words. Japanese words come from the morphological analyzer
(`kioku.morph`), Chinese from character bigrams, other scripts from words.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kioku import morph
from kioku.lang import EN, JA
from kioku.sentences import SENTENCE_END

_LATIN = re.compile(r"[A-Za-z][A-Za-z'\-]+|\d[\d,.:/]*")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
_HANGUL = re.compile(r"[\uac00-\ud7af]{2,}")
_FILLERS_EN = EN.fillers
# words that only point at something said before: kept, they carry nothing alone
DEICTIC_EN = EN.deictic
DEICTIC_JA = JA.deictic


@lru_cache(maxsize=1)
def _stop_en() -> frozenset[str]:
    # imported on first use: the store imports the notes, and bm25s (with scipy) takes a second
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(w.lower() for w in STOPWORDS_EN_PLUS) | _FILLERS_EN | DEICTIC_EN


# a greeting or thanks with only names after it ("Hey Samantha!", "Thanks, Mika"): the
# names are content words, but the line tells a later reader nothing
_GREETING = re.compile(
    rf"(?i:{EN.greetings})"
    rf"(?:[\s,!.~]+(?:[A-Z][a-z'\-]+|(?i:{EN.greeting_tails})))*[\s,!.~]*"
)
_QUESTION_END = re.compile(r"(?:[?？]|(?:か|かな|かね|っけ|の)[。!！〜~ー…\s]*)$")


def _script_lang(text: str, lang: str) -> str:
    if _KANA.search(text):
        return "ja"
    if _HAN_RUN.search(text):
        return "ja" if lang == "ja" else "zh"
    return "en"


@lru_cache(maxsize=65536)
def content_words(text: str, lang: str = "en") -> frozenset[str]:
    """The words of `text` that carry meaning out of context (lowercased, dictionary forms)."""
    stop = _stop_en()
    out = {w.lower() for w in _LATIN.findall(text) if w.lower() not in stop}
    script = _script_lang(text, lang)
    if script == "ja":
        out |= {w for w in morph.content_words(text) if w not in DEICTIC_JA}
    elif script == "zh":
        for run in _HAN_RUN.findall(text):
            out.update(run[i : i + 2] for i in range(len(run) - 1))
    for run in _HANGUL.findall(text):
        out.add(run)
    return frozenset(out)


def is_question(text: str) -> bool:
    t = text.strip()
    return "?" in t[-3:] or "？" in t[-3:] or bool(_QUESTION_END.search(t))


# what a role-play message narrates between asterisks ("*hugs Rowan*"): not what it says
_ACTION = re.compile(r"\*[^*\n]+\*")


def said_sentences(text: str) -> list[str]:
    """A message's sentences as said: without role-play narration between asterisks or the
    quotes a sentence opens on."""
    said = _ACTION.sub(" ", text).strip()
    return [x.lstrip(" \"'“”‘’)") for x in SENTENCE_END.split(said) if x.strip()]


def asks(text: str) -> bool:
    """Whether a message asks something: one of its sentences is a question, wherever it
    stands. A question is often not the last thing said: "What was my dog called? Tell me.",
    '"Remember the lake?" *she looks away*', "覚えてる？教えて。"."""
    return any(is_question(x) for x in said_sentences(text))


def carries_nothing(text: str, lang: str = "en") -> bool:
    """A greeting, a filler, a question without content, or a line whose only words point at
    something said elsewhere: nothing a later reader could use."""
    words = content_words(text, lang)
    if not words or all(w[:1].isdigit() for w in words):
        return True  # nothing, or a number with nothing it counts
    if _GREETING.fullmatch(text.strip()):
        return True
    return is_question(text) and len(words) < 2


def is_fragment(text: str) -> bool:
    """A Japanese sentence that stops on a case particle ("ただの溺れかけの人に。"): its verb
    was in another line."""
    if not _KANA.search(text):
        return False
    ws = [w for w in morph.words(text) if not w.is_("補助記号") and not w.is_("空白")]
    return bool(ws) and ws[-1].is_("助詞") and not ws[-1].is_("助詞", "終助詞")
