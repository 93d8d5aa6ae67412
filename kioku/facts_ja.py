"""Japanese facts, read from words and their parts of speech (`kioku.morph`), not from regexes.

A regex over kana cannot see where a word starts: it cut もつ鍋 to "つ鍋", kept questions
("なにが好き") and fragments ("のが好き"), and gave the speaker a preference that was their
child's. Here the object of 好き/嫌い/苦手 is the noun phrase before its particle (or a
nominalized verb: 泳ぐのが好き → 泳ぐこと), the owner is the person the clause is about
(子供がもつ鍋が好き → the speaker's child), and a sentence that asks, guesses, negates a guess,
reports the past or echoes the other person ("お好きなんですね") gives nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kioku import morph
from kioku.fact import Fact, Speech, slot_for_object
from kioku.lang import JA
from kioku.morph import Word, wordset
from kioku.relative_dates import resolve
from kioku.salience import is_question

# the words a fact is told by: who (people, pets, the writer, whom they speak to) and questions
PERSON = JA.people
PETS = JA.pets
FIRST = JA.first_person_words
SECOND = JA.second_person_words
INTERROGATIVE = JA.interrogatives
FORMAL_HEAD = wordset("やつ 奴 もの 物 こと 事 ところ 所 感じ の ん 方 ほう 系統 辺 あたり")
VAGUE_PLACE = wordset("近く 近所 そば 辺り 周り 隣 ここ そこ あそこ 外 家 うち 田舎 都会")
LIKES = {"好き": "好き", "大好き": "大好き", "嫌い": "嫌い", "大嫌い": "大嫌い", "苦手": "苦手"}
_INTENSIFIERS = wordset(
    "本当に ほんとに 一番 とても すごく 特に 結構 割と わりと 昔から 案外 意外と"
)
_NOT_ASSERTED = wordset(
    "なら たら だったら ければ そう かも らしい みたい かな っけ でしょう だろう"
)
_NOT_TOPIC = wordset("あと 後 うち 個人的 基本 普段 実 他 ほか それ以外 以外")
_CASE = wordset("を に で へ と とか も")
# nouns that say nothing as the object of a preference: 実は "actually", 今 "now", 人, 話
GENERIC = wordset("実 今 昔 最近 時間 人 子 話 方 物 事 時 全部 全て 両方 普段 本当 気 他 ほか")
# verbs that need more than an object to mean something: 気になる, ところがある, 辛すぎる
LIGHT_VERBS = wordset("なる 成る ある 有る いる 居る できる 出来る すぎる 過ぎる しまう おく 思う")


def _noun(w: Word) -> bool:
    return w.major == "名詞" or w.is_("接頭辞") or w.is_("接尾辞") or w.surface in ("・", "ー")


def _np_before(ws: Sequence[Word], end: int) -> tuple[int, str] | None:
    """The noun phrase ending at `end` (nouns, affixes, A の B), as (start, text)."""
    i = end
    taken: list[Word] = []
    while i >= 0 and len(taken) < 8:
        w = ws[i]
        if (
            _noun(w)
            and w.major != "代名詞"
            or (
                w.surface == "の"
                and w.is_("助詞", "格助詞")
                and taken
                and i > 0
                and _noun(ws[i - 1])
                and ws[i - 1].major != "代名詞"
            )
        ):
            taken.insert(0, w)
        else:
            break
        i -= 1
    while taken and (taken[0].surface == "の" or taken[0].is_("接尾辞")):
        taken.pop(0)
    # 今関西, 昔京都: a time word in front is not part of the name
    while len(taken) > 1 and taken[0].pos[2:3] == ("副詞可能",) and taken[1].surface != "の":
        taken.pop(0)
    if not taken:
        return None
    start = end - len(taken) + 1
    text = "".join(w.surface for w in taken)
    if start > 0 and _modifies(ws[start - 1]):
        # one word in front may stay with the noun (回るお寿司, 活発な子); a longer clause
        # (スパイで乗り込む話, 人が少ない島) holds the noun's meaning elsewhere
        k = start - 1
        mod = ws[k].surface
        if ws[k].surface == "な" and k > 0 and ws[k - 1].major == "形状詞":
            k -= 1
            mod = ws[k].surface + "な"
        elif ws[k].major not in ("動詞", "形容詞"):
            return None
        if ws[k].surface in LIKES:
            return None  # 好きな人は好き: says nothing
        if k > 0 and not (ws[k - 1].is_("補助記号") or ws[k - 1].surface in ("も", "は")):
            return None
        return k, mod + text
    return start, text


def _modifies(w: Word) -> bool:
    """A word that ends a relative clause in front of a noun."""
    if w.major in ("動詞", "形容詞") and "連体形" in w.pos[5]:
        return True
    return w.major == "助動詞" and w.surface in ("な", "た", "だ", "ない")


def _meaningful(text: str, words: Sequence[Word]) -> bool:
    if not text or any(w.surface in INTERROGATIVE or w.base in INTERROGATIVE for w in words):
        return False
    if all(w.is_("名詞", "数詞") or w.is_("接尾辞") for w in words):
        return False
    head = words[-1]
    if head.surface in FORMAL_HEAD or head.base in FORMAL_HEAD:
        return False
    if text in GENERIC:
        return False
    return len(text) >= 2 or "\u4e00" <= text <= "\u9fff"


def _object(ws: Sequence[Word], end: int) -> tuple[int, str] | None:
    """What is liked, ending at `end`: a noun phrase, or a nominalized verb or adjective."""
    if end < 0:
        return None
    w = ws[end]
    if w.is_("助詞", "準体助詞") and end > 0:
        p = ws[end - 1]
        if p.major == "動詞" and "連体形" in p.pos[5]:
            return _activity(ws, end - 1)
        if p.major == "形容詞" and "連体形" in p.pos[5]:
            if p.base in ("寒い", "暑い"):
                return end - 1, f"{p.base[:-1]}さ"  # 寒いのが苦手: the cold, not cold things
            return end - 1, f"{p.base}もの"
        if p.surface == "な" and end > 1 and ws[end - 2].major == "形状詞":
            return end - 2, f"{ws[end - 2].surface}なもの"
        return None
    if w.surface in ("ほう", "方") and end > 1 and ws[end - 1].surface == "の":
        return _object(ws, end - 2)
    np = _np_before(ws, end)
    if np is None or not _meaningful(np[1], ws[np[0] : end + 1]):
        return None
    return np


def _activity(ws: Sequence[Word], v: int) -> tuple[int, str] | None:
    """A verb phrase ending at the verb `v`, as "…こと": 泳ぐこと, 運動すること,
    大型犬を動画で見ること. None when the verb means nothing without what it hangs on."""
    verb = ws[v]
    start, text = v, verb.base
    if verb.base == "する" and v > 0 and ws[v - 1].is_("名詞"):
        start, text = v - 1, ws[v - 1].surface + "する"  # 運動する: the noun is the activity
    elif verb.base in LIGHT_VERBS:
        return None
    args = 0
    while args < 2 and start >= 2 and ws[start - 1].surface in _CASE and ws[start - 1].is_("助詞"):
        np = _np_before(ws, start - 2)
        if np is None or not _meaningful(np[1], ws[np[0] : start - 1]):
            break
        start, text = np[0], np[1] + ws[start - 1].surface + text
        args += 1
    joined = start > 0 and ws[start - 1].is_("助詞", "接続助詞") and ws[start - 1].surface in "てで"
    if joined or (start > 0 and _modifies(ws[start - 1])):
        return None  # 練乳をかけて食べる: a chain whose first part carries the meaning
    if start > 0 and ws[start - 1].is_("助詞", "格助詞"):
        return None  # an argument that was not a plain noun phrase
    return start, f"{text}こと"


def _person(ws: Sequence[Word], np: tuple[int, str], end: int) -> bool:
    span = ws[np[0] : end + 1]
    return bool(span) and (span[-1].surface in PERSON or span[-1].is_("名詞", "固有名詞", "人名"))


def _owner(ws: Sequence[Word], before: int, speaker: str, addressee: str) -> str | None:
    """Whom the clause before `before` is about: a person marked by は/が/も, else the speaker.
    None: it is about the person spoken to (the note would be a guess or an echo)."""
    i = before - 1
    while i > 0:
        w = ws[i]
        if w.is_("助詞") and w.surface in ("は", "が", "も", "って"):
            p = ws[i - 1]
            if p.surface in FIRST or p.base in FIRST:
                return speaker
            if p.surface in SECOND or p.base in SECOND:
                return None
            if p.surface in PERSON:
                return f"{speaker}の{p.surface}"
            if i > 2 and ws[i - 2].surface == "の" and ws[i - 3].surface in PERSON:
                return f"{speaker}の{ws[i - 3].surface}"  # 妹の名前は…、誕生日は…
            if p.is_("名詞", "固有名詞", "人名") or (
                p.surface in ("さん", "ちゃん", "くん") and i > 1 and ws[i - 2].is_("名詞")
            ):
                name = ws[i - 2].surface if p.surface in ("さん", "ちゃん", "くん") else p.surface
                return name if name != addressee else None
        i -= 1
    return speaker


def _topic(ws: Sequence[Word], before: int) -> str:
    """A thing the sentence is about, in front of the object: カレーはね、(甘口より)中辛が好き →
    "カレーは". Empty when the topic is a person or there is none."""
    i = before - 1
    while i > 0 and before - i <= 8:
        w = ws[i]
        if w.major in ("動詞", "形容詞") or w.is_("助動詞"):
            return ""
        if w.surface == "は" and w.is_("助詞", "係助詞"):
            np = _np_before(ws, i - 1)
            if np is None or not _meaningful(np[1], ws[np[0] : i]):
                return ""
            head = ws[i - 1]
            if (
                head.surface in PERSON
                or head.surface in FIRST
                or head.is_("名詞", "固有名詞", "人名")
                or np[1] in _NOT_TOPIC
                or head.pos[2:3] == ("副詞可能",)
            ):
                return ""
            return f"{np[1]}は"
        i -= 1
    return ""


def _explicit_first(ws: Sequence[Word], before: int) -> bool:
    return any(
        (w.surface in FIRST or w.base in FIRST)
        and i + 1 < before
        and ws[i + 1].surface in ("は", "も")
        for i, w in enumerate(ws[:before])
    )


def _after(ws: Sequence[Word], i: int) -> list[Word]:
    """The rest of the clause after word `i` (up to punctuation or a clause-joining が/ので…)."""
    out = []
    for w in ws[i + 1 :]:
        if w.is_("補助記号") or (w.is_("助詞", "接続助詞") and w.surface not in ("て", "で")):
            break
        out.append(w)
    return out


def _asserted(after: Sequence[Word]) -> bool:
    """Not a guess, a condition, the past, a wish or an echo of the other person."""
    surfaces = [w.surface for w in after]
    if surfaces[:1] in (["って"], ["と"], ["という"], ["とか"], ["か"], ["に"]):
        return False  # quoted, wondered about or an adverb: 好きって素敵, 好きかも, 好きにできる
    if any(s in _NOT_ASSERTED for s in surfaces) or any(w.base == "たい" for w in after):
        return False
    pairs = list(zip(surfaces, surfaces[1:], strict=False))
    if ("か", "も") in pairs or ("て", "も") in pairs or ("で", "も") in pairs:
        return False  # かも "maybe", ても "even if"
    if any(w.surface == "た" and w.major == "助動詞" for w in after):
        return False
    # "好きなんですね": confirming what the other person said
    return not (surfaces[-1:] in (["ね"], ["よね"]) and any(s in ("ん", "の") for s in surfaces))


def _negated(after: Sequence[Word]) -> bool:
    return any(w.base in ("ない", "ぬ") or w.surface in ("ません", "ない") for w in after)


def _preferences(ws: Sequence[Word], s: Speech) -> list[Fact]:
    out = []
    for i, w in enumerate(ws):
        label = LIKES.get(w.surface) if w.major in ("形状詞", "名詞") else None
        if label is None:
            continue
        if i > 0 and ws[i - 1].surface in ("お", "御"):
            continue  # お好き: the other person's, an echo
        after = _after(ws, i)
        if after and after[0].surface == "な" and len(after) > 1 and after[1].major == "名詞":
            out.extend(_favourite(ws, i, s))
            continue
        if not _asserted(after):
            continue
        j = i - 1
        while j >= 0:
            if ws[j].major == "副詞" or ws[j].surface in _INTENSIFIERS:
                j -= 1
            elif j > 0 and ws[j].surface == "は" and ws[j - 1].surface == "実":
                j -= 2  # 実は "actually"
            else:
                break
        if j < 1 or not (ws[j].is_("助詞") and ws[j].surface in ("が", "は", "も", "って")):
            continue
        obj = _object(ws, j - 1)
        if obj is None:
            continue
        owner: str | None
        if _person(ws, obj, j - 1) and obj[0] >= 2 and ws[obj[0] - 1].surface in ("が", "は"):
            # もつ鍋が子供が好き: the person likes, the other phrase is liked
            person = obj
            other = _object(ws, obj[0] - 2)
            if other is None:
                continue
            owner = f"{s.speaker}の{person[1]}" if person[1] in PERSON else person[1]
            obj = other
        else:
            owner = _owner(ws, obj[0], s.speaker, s.addressee)
            if ws[j - 1].surface in PERSON - PETS and not _explicit_first(ws, obj[0]):
                continue  # 親戚が好きで…: the relatives like it, or like them? unclear
        if owner is None:
            continue
        topic = _topic(ws, obj[0])
        text = f"{topic}{obj[1]}が{label}" + ("ではない" if _negated(after) else "")
        out.append(_fact("preference", owner, text, s, slot_for_object(obj[1])))
    return out


def _forward_np(ws: Sequence[Word], start: int) -> tuple[int, str] | None:
    """A noun phrase starting at `start` and ending before です/だ/punctuation."""
    end = start
    while end < len(ws) and end - start < 8 and (_noun(ws[end]) or ws[end].surface == "の"):
        end += 1
    if end == start or ws[end - 1].surface == "の":
        return None
    if end < len(ws) and not (
        ws[end].is_("助動詞")
        or ws[end].is_("補助記号")
        or ws[end].surface in ("とか", "で", "です")
    ):
        return None
    text = "".join(w.surface for w in ws[start:end])
    return (end, text) if _meaningful(text, ws[start:end]) else None


def _favourite(ws: Sequence[Word], i: int, s: Speech) -> list[Fact]:
    """好きな X は Y: Y is the favourite X."""
    cat = _forward_np(ws, i + 2)
    if cat is None:
        k = i + 2
        while k < len(ws) and _noun(ws[k]):
            k += 1
        if k == i + 2 or k >= len(ws) or ws[k].surface not in ("は", "って"):
            return []
        what = "".join(w.surface for w in ws[i + 2 : k])
        val = _forward_np(ws, k + 1)
        if val is None or ws[i].surface not in ("好き", "大好き"):
            return []
        owner = _owner(ws, i, s.speaker, s.addressee)
        if owner is None:
            return []
        return [_fact("preference", owner, f"好きな{what}は{val[1]}", s, f"favourite:{what}")]
    return []


def _topic_fact(ws: Sequence[Word], s: Speech, noun: str, kind: str, slot: str) -> list[Fact]:
    """<noun> は <noun phrase>: 趣味は水泳, 仕事は看護師, 誕生日は3月3日, 名前は花子."""
    out = []
    for i, w in enumerate(ws[:-2]):
        if w.surface != noun or ws[i + 1].surface not in ("は", "って"):
            continue
        val = _forward_np(ws, i + 2)
        if val is None:
            continue
        if noun == "誕生日" and not any(x.is_("名詞", "数詞") for x in ws[i + 2 : val[0]]):
            continue
        owner: str | None = s.speaker
        if i >= 2 and ws[i - 1].surface == "の":
            p = ws[i - 2]
            if p.surface in PERSON:
                owner = f"{s.speaker}の{p.surface}"
            elif p.surface in SECOND or p.base in SECOND:
                owner = None
            elif p.surface not in FIRST and not p.is_("名詞", "固有名詞", "人名"):
                continue  # 映画の名前は…: not about a person
            elif p.is_("名詞", "固有名詞", "人名"):
                owner = p.surface
        else:
            owner = _owner(ws, i, s.speaker, s.addressee)
        if owner is None or not _asserted(_after(ws, val[0] - 1)):
            continue
        text = f"{noun}は{val[1]}"
        if noun == "名前" and owner != s.speaker:
            kind_, slot_ = "relation", f"relation:{owner}"
        else:
            kind_, slot_ = kind, slot.format(val[1])
        out.append(_fact(kind_, owner, text, s, slot_))
    return out


def _places(ws: Sequence[Word], s: Speech) -> list[Fact]:
    out = []
    for i, w in enumerate(ws):
        if w.base == "住む" and i >= 2 and ws[i - 1].surface == "に":
            np = _object(ws, i - 2)
            after = _after(ws, i)
            if np is None or np[1] in VAGUE_PLACE or not _asserted_place(after):
                continue
            owner = _owner(ws, np[0], s.speaker, s.addressee)
            if owner is None:
                continue
            if any(x.surface == "た" and x.major == "助動詞" for x in after):
                out.append(_fact("fact", owner, f"以前{np[1]}に住んでいた", s))
            else:
                out.append(_fact("fact", owner, f"{np[1]}に住んでいる", s, "residence"))
        elif w.surface in ("在住", "出身") and i >= 1:
            np = _np_before(ws, i - 1)
            if np is None or not _meaningful(np[1], ws[np[0] : i]) or np[1] in VAGUE_PLACE:
                continue
            if not any(x.is_("名詞", "固有名詞") for x in ws[np[0] : i]):
                continue
            if i + 1 < len(ws) and ws[i + 1].surface == "の":
                continue  # 九州出身の人: someone else
            owner = _owner(ws, np[0], s.speaker, s.addressee)
            if owner is not None and _asserted(_after(ws, i)):
                slot = "residence" if w.surface == "在住" else "origin"
                out.append(_fact("fact", owner, f"{np[1]}{w.surface}", s, slot))
    return out


def _asserted_place(after: Sequence[Word]) -> bool:
    """Living there, or having lived there: not a wish (住んでみたい) or a supposition (住んでても)."""
    if any(w.base in ("たい", "みる") or w.surface in _NOT_ASSERTED for w in after):
        return False
    surfaces = [w.surface for w in after]
    return ("て", "も") not in zip(surfaces, surfaces[1:], strict=False) and "ても" not in surfaces


def _work(ws: Sequence[Word], s: Speech) -> list[Fact]:
    out = []
    for i, w in enumerate(ws):
        if w.base != "働く" or i < 2:
            continue
        after = _after(ws, i)
        if not _asserted(after):
            continue
        if (
            ws[i - 1].surface == "て"
            and i >= 4
            and ws[i - 2].base == "する"
            and ws[i - 3].surface == "と"
        ):
            np, how = _object(ws, i - 4), "として"
        elif ws[i - 1].surface == "で":
            np, how = _object(ws, i - 2), "で"
        else:
            continue
        if np is None or np[1] in VAGUE_PLACE:
            continue
        owner = _owner(ws, np[0], s.speaker, s.addressee)
        if owner is not None:
            out.append(_fact("fact", owner, f"{np[1]}{how}働いている", s, "job"))
    return out


def _counts(ws: Sequence[Word], s: Speech) -> list[Fact]:
    """子供が2人いる, 猫が3匹いる."""
    out = []
    for i, w in enumerate(ws):
        if w.surface not in PERSON or i + 3 >= len(ws) or ws[i + 1].surface not in ("が", "は"):
            continue
        n = ws[i + 2]
        k = i + 3
        count = n.surface
        if n.is_("名詞", "数詞") and k < len(ws) and ws[k].is_("接尾辞"):
            count += ws[k].surface
            k += 1
        elif not (n.major == "名詞" and any(c.isdigit() for c in n.surface)) and not (
            n.surface[:1] in "一二三四五六七八九十" and n.surface[-1:] in "人匹頭羽"
        ):
            continue
        if k < len(ws) and ws[k].base in ("いる", "居る", "おる") and _asserted(_after(ws, k)):
            out.append(
                _fact("relation", s.speaker, f"{w.surface}が{count}いる", s, f"count:{w.surface}")
            )
    return out


def _habits(ws: Sequence[Word], s: Speech) -> list[Fact]:
    """毎朝コーヒーを飲む: a routine with an object, said as the speaker's own, in the present."""
    out = []
    for i, w in enumerate(ws):
        if not (
            w.surface in ("毎日", "毎朝", "毎晩", "毎週", "毎月", "毎年") and w.major == "名詞"
        ):
            continue
        if i > 0 and not (ws[i - 1].is_("補助記号") or ws[i - 1].surface in ("は", "も", "、")):
            continue  # 200円なら毎日…: a condition in front
        for k in range(i + 1, min(len(ws), i + 9)):
            v = ws[k]
            if v.is_("補助記号") or v.major == "代名詞" or v.surface in INTERROGATIVE:
                break
            if v.is_("助詞") and v.surface in ("が", "は", "なら", "ても"):
                break  # 花火が上がる: something else does it
            if v.major == "動詞" and v.is_("動詞", "一般"):
                after = _after(ws, k)
                span = ws[i + 1 : k]
                if (
                    not any(x.surface == "を" for x in span)
                    or not _asserted(after)
                    or _negated(after)
                    or any(x.surface in ("の", "ん") for x in after)
                ):
                    break
                body = "".join(x.surface for x in ws[i:k]) + v.base
                owner = _owner(ws, i, s.speaker, s.addressee)
                if owner is not None:
                    out.append(_fact("habit", owner, body, s))
                break
    return out


def _promises(ws: Sequence[Word], s: Speech) -> list[Fact]:
    """…って約束した / …と約束します: what was promised (made or making, both are facts)."""
    out = []
    for i, w in enumerate(ws):
        if w.surface != "約束" or i < 2 or ws[i - 1].surface not in ("と", "って"):
            continue
        after = _after(ws, i)
        if any(x.surface in ("なら", "たら", "れば", "かも") for x in after):
            continue
        start = i - 2
        while start > 0 and not ws[start - 1].is_("補助記号"):
            start -= 1
        clause = ws[start : i - 1]
        if any(x.major == "代名詞" or x.surface in INTERROGATIVE for x in clause):
            continue
        body = "".join(x.surface for x in clause)
        if len(body) >= 4 and any(morph.is_content(x) for x in clause):
            out.append(_fact("promise", s.speaker, f"約束: {body}", s))
    return out


def _fact(kind: str, subject: str, text: str, s: Speech, slot: str = "") -> Fact:
    return Fact(
        kind,
        subject,
        resolve(text, s.at, "ja"),
        s.speaker,
        s.seq,
        s.at.date() if s.at else None,
        slot,
    )


def japanese(s: Speech) -> list[Fact]:
    """The facts of one Japanese sentence (none from a question)."""
    if is_question(s.text):
        return []
    ws = morph.words(s.text)
    if any(w.surface in INTERROGATIVE and w.major == "代名詞" for w in ws):
        return []
    out = _preferences(ws, s)
    out += _topic_fact(ws, s, "趣味", "preference", "hobby:{}")
    out += _topic_fact(ws, s, "仕事", "fact", "job")
    out += _topic_fact(ws, s, "職業", "fact", "job")
    out += _topic_fact(ws, s, "誕生日", "anniversary", "birthday")
    out += _topic_fact(ws, s, "名前", "name", "name")
    out += _places(ws, s) + _work(ws, s) + _counts(ws, s) + _habits(ws, s) + _promises(ws, s)
    return out
