"""Japanese words, from a real morphological analyzer (SudachiPy with its core dictionary).

Japanese has no spaces: a regex sees a whole sentence as one "word", so the extractive
chronicler could not tell a fact from a greeting, and the notes' patterns cut words in half
("つ鍋" from もつ鍋) or kept questions ("なにが好き"). Sudachi splits a sentence into words with
their part of speech and dictionary form, which is what both need. The dictionary loads once
per thread, on first use (Sudachi's tokenizer is not shared between threads).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kioku.lang.words import wordset

# words that carry nothing alone: light verbs, formal nouns, stock replies
_LIGHT = wordset(
    """
    する ある いる 居る なる 成る 思う 言う 云う できる 出来る いう こと 事 もの 物 よう 様 そう ところ 所 感じ 方 ほう 時 とき 中 為 ため 訳 わけ
    はず 筈 みたい 的 さん 様 くん ちゃん 達 たち 良い いい よい 無い ない 本当 ほんと 確か 大丈夫 お願い 願い 有る 居 やつ 奴 自分 私 僕 俺 分かる
    判る わかる 知る 見る 来る 行く くる いく おる 頂く いただく 下さる くださる 致す 貰う もらう あげる くれる みる しまう おく 他 ほか 色々 いろいろ 皆
    みんな 今 今日 以上 以外 全然 すごい 凄い 楽しい 嬉しい 面白い おもしろい 多い 少ない 同じ 一番 是非 ぜひ それぞれ 結構 普通
    """
)
_CONTENT_POS = ("名詞", "動詞", "形容詞", "形状詞")


@dataclass(frozen=True)
class Word:
    surface: str
    pos: tuple[
        str, ...
    ]  # Sudachi's part of speech: (品詞, 細分類1, 細分類2, 細分類3, 活用型, 活用形)
    base: str  # dictionary form

    @property
    def major(self) -> str:
        return self.pos[0]

    def is_(self, *prefix: str) -> bool:
        """Whether the part of speech starts with `prefix` (e.g. is_("名詞", "固有名詞"))."""
        return self.pos[: len(prefix)] == prefix


_local = threading.local()
_dictionary_lock = threading.Lock()


def _tokenizer() -> Any:
    tok = getattr(_local, "tokenizer", None)
    if tok is None:
        from sudachipy import Dictionary, SplitMode

        with _dictionary_lock:  # the dictionary file is opened once at a time
            d = Dictionary(dict="core")
        make = getattr(d, "tokenizer", None)
        tok = make(mode=SplitMode.C) if make is not None else d.create(mode=SplitMode.C)
        _local.tokenizer = tok
    return tok


@lru_cache(maxsize=32768)
def words(text: str) -> tuple[Word, ...]:
    """The words of `text` in order (a sentence or a few: Sudachi reads up to ~49k bytes)."""
    if not text.strip():
        return ()
    chunk = text[:12000]
    out = []
    for m in _tokenizer().tokenize(chunk):
        out.append(Word(m.surface(), tuple(m.part_of_speech()), m.dictionary_form()))
    return tuple(out)


def is_content(w: Word) -> bool:
    """A word that carries meaning out of context: a noun, verb or adjective that is not a
    pronoun, a light verb or a formal noun."""
    if w.major not in _CONTENT_POS or w.base in _LIGHT or w.surface in _LIGHT:
        return False
    if w.is_("名詞", "数詞"):
        return True
    if w.major == "動詞" and w.is_("動詞", "非自立可能"):
        return False
    return len(w.surface) > 1 or w.is_("名詞", "固有名詞") or w.major == "名詞"


def content_words(text: str) -> set[str]:
    """Dictionary forms of the content words of `text`."""
    return {w.base for w in words(text) if is_content(w)}
