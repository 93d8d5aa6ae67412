"""The words a line of memory rests on: content terms, names, numbers and negation, per language.

Grounding (`check`) asks whether a line a model wrote is supported by the messages it
cites. That needs the same reading of both sides: the terms that carry the line's content (a
stemmed English word with its irregular forms folded, "went" → "go"; a Japanese dictionary form
from SudachiPy, 行った → 行く; Chinese character bigrams), the names it uses (capitalized words,
katakana words and Sudachi's proper nouns), its numbers ("five" and "5" are one number) and
whether it negates (a line that says "not" where its source does not has turned it around).

Words that only frame a line ("said", "told", "asked", "the user", 話す, 尋ねる) and light verbs
("got", "made", "felt") are not content: a faithful paraphrase uses them freely, an invention
does not need them.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from kioku import morph
from kioku.morph import wordset
from kioku.sentences import SENTENCE_END

_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019][A-Za-z]+)?")
_CAPITAL = re.compile(r"\b[A-Z][A-Za-z0-9'\u2019\-]*[A-Za-z0-9]\b")
_KATAKANA = re.compile(r"[\u30a1-\u30fa\u30fc]{2,}")
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")

# framing: how a line reports (who said, asked, shared), not what it reports
_FRAMING_EN = wordset(
    """
    say says said saying tell tells told telling ask asks asked asking share shares shared
    sharing mention mentions mentioned talk talks talked talking discuss discusses discussed
    express expresses expressed explain explains explained describe describes described reply
    replies replied answer answers answered respond responds responded agree agrees agreed
    thank thanks thanked wonder wonders wondered suggest suggests suggested note notes noted
    admit admits admitted claim claims claimed add adds added continue continues continued
    state states stated reveal reveals revealed confirm confirms confirmed inform informs
    informed update updates updated recall recalls recalled point points pointed encourage
    encourages encouraged praise praises praised compliment compliments complimented
    show shows showed shown reveal reveals revealed indicate indicates indicated narration
    narrator thought thoughts inner voice actually really ostensibly
    user character conversation message chat someone something also really very lot lots
    about would could should might must may can will shall whether though although yet
    however because since unless whose anyone everyone anybody everybody anything everything
    nothing another other others thing things way one ones kind sort bit part
    """
)
# light verbs and words any paraphrase may bring in
_LIGHT_EN = wordset(
    """
    go goes went gone going get gets got gotten getting make makes made making have has had
    having do does did done doing take takes took taken taking come comes came coming give
    gives gave given giving find finds found finding feel feels felt feeling think thinks
    thought thinking want wants wanted wanting seem seems seemed become becomes became keep
    keeps kept let lets put puts see sees saw seen seeing know knows knew known look looks
    looked looking plan plans planned planning try tries tried trying use uses used using
    recently lately currently now today new always still just even well much many
    """
)
_AUXILIARY = wordset("have has had having do does did done doing")
_IRREGULAR = {
    "went": "go", "gone": "go", "got": "get", "gotten": "get", "made": "make", "took": "take",
    "taken": "take", "came": "come", "gave": "give", "given": "give", "found": "find",
    "felt": "feel", "thought": "think", "became": "become", "kept": "keep", "saw": "see",
    "seen": "see", "knew": "know", "known": "know", "told": "tell", "said": "say",
    "bought": "buy", "brought": "bring", "built": "build", "caught": "catch", "chose": "choose",
    "chosen": "choose", "drew": "draw", "drawn": "draw", "drove": "drive", "driven": "drive",
    "ate": "eat", "eaten": "eat", "fell": "fall", "fallen": "fall", "flew": "fly",
    "forgot": "forget", "forgotten": "forget", "grew": "grow", "grown": "grow", "held": "hold",
    "hurt": "hurt", "left": "leave", "lost": "lose", "met": "meet", "paid": "pay", "ran": "run",
    "read": "read", "rode": "ride", "sang": "sing", "sung": "sing", "sent": "send", "sat": "sit",
    "slept": "sleep", "spent": "spend", "stood": "stand", "swam": "swim", "swum": "swim",
    "taught": "teach", "threw": "throw", "thrown": "throw", "understood": "understand",
    "woke": "wake", "won": "win", "wore": "wear", "worn": "wear", "wrote": "write",
    "written": "write", "began": "begin", "begun": "begin", "broke": "break", "broken": "break",
    "heard": "hear", "led": "lead", "lent": "lend", "mean": "mean", "meant": "mean",
    "children": "kid", "child": "kid", "kids": "kid", "mother": "mom", "mum": "mom",
    "father": "dad", "picture": "photo", "pictures": "photo", "pic": "photo", "pics": "photo",
    "image": "photo", "images": "photo", "photograph": "photo", "husband": "husband",
}  # fmt: skip
_NUMBERS = {
    "zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40",
    "fifty": "50", "hundred": "100", "twice": "2",
}  # fmt: skip
_NEGATION_EN = wordset(
    "not no never nothing nobody none neither nor without cannot can't don't doesn't didn't "
    "isn't wasn't aren't weren't won't wouldn't haven't hasn't hadn't couldn't shouldn't"
)
# capitalized words that are not names (sentence openers, pronouns, titles)
_NOT_NAMES = wordset(
    """
    I I'm I've I'll I'd The A An And But Or So Then This That These Those There Here It Its
    He She They We You His Her Their Our My Your Him Them Us Me Who What When Where Why How
    After Before While During Since Until On In At For From With Without By To Of As If
    Also Both Each Every Some Many Most All No Not Yes Later Earlier Now Today Yesterday
    Tomorrow Tonight User Users Character Message Messages Chapter OPEN DONE QUOTE Mr Mrs Ms
    Dr OK Okay
    """
)
_FRAMING_JA = wordset(
    """
    言う 話す 尋ねる 聞く 訊く 答える 伝える 述べる 語る 説明 質問 返事 回答 同意 感謝
    提案 共有 紹介 報告 確認 話 発言 会話 メッセージ ユーザー キャラクター 相手 自分 彼 彼女
    画像 写真 最近 今回 とても すごく 特に 一緒
    """
)
_NEGATION_JA = ("ない", "ぬ", "ず", "ません", "なかった", "無い")
_FRAMING_ZH = frozenset(["说过", "告诉", "问道", "回答", "用户", "角色", "分享"])


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
    # characters no Japanese text uses (simplified Chinese 长, 这): a small model writing
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
_CHINESE_WORDS = frozenset("我也是了吗你很呢吧")


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
        if w.is_("助動詞") and w.base in ("ない", "ぬ", "ず"):
            negated = True
        if w.is_("形容詞") and w.base in ("ない", "無い"):
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
        negated = negated or any(x in t for x in ("不", "没", "别"))
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


_ASKING = re.compile(
    r"\b(?:ask|asks|asked|asking|wonder|wonders|wondered|wondering|question|questions|"
    r"inquire|inquires|inquired|whether)\b|尋ね|訊|聞い|聞き|聞く|質問|問い|かどうか|问",
    re.I,
)


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


_FIRST_PERSON = re.compile(
    r"\b(?:[Ii](?:'m|'ve|'ll|'d)?|[Mm]y|me|mine|[Ww]e(?:'re|'ve)?|[Oo]ur|us)\b"
    r"|私|僕|俺|あたし|わたし|ぼく|おれ|我"
)


# Japanese drops the 私: speech shows in its polite or spoken sentence ends ("…ヤバいです。",
# "知らなかったですー!", "…思いますけどね。") and its exclamations; a summary is plain, or says
# who and that they said it ("ACは…と言っています")
_SPOKEN_JA = re.compile(
    r"(?:です|ます|でした|ました|ません|ましょう|でしょう|けど|よね|かな)[ねよなわー〜~]*(?:[。.!?…]|$)"
    r"|!"
)
_REPORTED_JA = re.compile(r"(?:と|って)(?:言|い[っいうわ]|話し|述べ|書い)|とのこと|そうです")


def first_person(text: str, speaker: str = "") -> bool:
    """The line speaks as its writer ("I'm thrilled…", 私も, "知らなかったですー!"): it gives
    itself out as their words. `speaker`: a Japanese line that names them as its subject
    ("ACは…") tells of them instead."""
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
    the 1.5B model shortened LoCoMo 0 #138's marker, and with it the only place the answer to
    "What kind of pot did Mel and her kids make?" was said."""
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
