"""Relative dates resolved: "yesterday" said on 8 May 2023 is written "yesterday (7 May 2023)".

Memory outlives the day a thing was said. A chapter line or a note that says "yesterday" is
wrong a week later, and a question about "when" can only be answered from a date. So wherever
kioku writes memory from a dated message (the extractive chronicler, the notes, and the
transcript an LLM chronicler reads) each relative expression gets the absolute date it means
beside it, in the conversation's language. The words stay: what was said is kept, the date is
added. English, Japanese (昨日, 先週, 3日前, 先週の金曜日…) and Chinese (昨天, 上周, 上个月…).

Only expressions that name a definite day, week, month or year are resolved; vague ones ("a
few days ago", "recently") and ones that are ambiguous without more context ("on Friday",
"this weekend") are left as they are. A span that runs up to now names when it began: "I've
had them for 3 years now" → "(since 2020)"; Japanese and Chinese say that with "ago" (3年前から,
三年前开始), which the rules for "ago" read. Applying `resolve` twice changes nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from kioku.dates import day_text, month_text, year_text
from kioku.lang import EN, JA, ZH

Resolver = Callable[[re.Match[str], date], str | None]


def _months(d: date, n: int) -> date:
    m = d.month - 1 + n
    return date(d.year + m // 12, m % 12 + 1, 1)


def _monday(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _week(d: date, lang: str) -> str:
    w = day_text(_monday(d), lang)
    return {"en": f"the week of {w}", "ja": f"{w}の週", "zh": f"{w}那一周"}[lang]


def _weekend(saturday: date, lang: str) -> str:
    w = day_text(saturday, lang)
    return {"en": f"the weekend of {w}", "ja": f"{w}の週末", "zh": f"{w}的周末"}[lang]


def _around(d: date, lang: str) -> str:
    w = day_text(d, lang)
    return {"en": f"around {w}", "ja": f"{w}ごろ", "zh": f"{w}前后"}[lang]


_EN_NUM = EN.counts  # number and day words are each language's (`kioku.lang`)
_CJK_NUM = {**JA.numerals, **ZH.numerals}
_EN_DAYS = tuple(d.lower() for d in EN.weekdays)
_CJK_DAYS = JA.weekday_numbers
_ZH_DAYS = ZH.weekday_numbers


def _number(token: str) -> int | None:
    t = token.strip().lower()
    if t.isdigit():
        return int(t)
    if t in _EN_NUM:
        return _EN_NUM[t]
    if t and all(c in _CJK_NUM for c in t):
        if t == "十":
            return 10
        if t.startswith("十"):
            return 10 + _CJK_NUM[t[1]]
        if len(t) == 2 and t[1] == "十":
            return _CJK_NUM[t[0]] * 10
        if len(t) == 3 and t[1] == "十":
            return _CJK_NUM[t[0]] * 10 + _CJK_NUM[t[2]]
        if len(t) == 1:
            return _CJK_NUM[t]
    return None


def _ago(n: int, unit: str, d: date, lang: str) -> str | None:
    if n <= 0 or n > 100:
        return None
    if unit == "day":
        return day_text(d - timedelta(days=n), lang)
    if unit == "week":
        return _around(d - timedelta(weeks=n), lang)
    if unit == "month":
        return month_text(_months(d, -n), lang)
    return year_text(d.year - n, lang)


# a perfect tense before "for two years" in the same sentence: a span that runs up to now
_PERFECT = re.compile(
    r"(?:'ve|'s|\bhave|\bhas)\s+(?:been|had|known|lived|worked|played|done|owned|taught|studied|"
    r"used)\b[^.!?;]*$",
    re.IGNORECASE,
)


def _since(m: re.Match[str], d: date, lang: str) -> str | None:
    """ "I've had them for 3 years now" said in 2023 → "(since 2020)": a duration that runs
    up to the day it is said names the day it began. Only with "now" or a perfect tense;
    "I lived there for two years" ends who knows when."""
    if not m.group(3) and not _PERFECT.search(m.string[: m.start()]):
        return None
    value = _ago(_number(m.group(1)) or 0, _unit_en(m.group(2)), d, lang)
    return f"since {value}" if value else None


def _offset(days: int, lang: str) -> Resolver:
    return lambda _m, d: day_text(d + timedelta(days=days), lang)


def _last_weekday(target: int, d: date) -> date:
    back = (d.weekday() - target) % 7 or 7
    return d - timedelta(days=back)


def _next_weekday(target: int, d: date) -> date:
    ahead = (target - d.weekday()) % 7 or 7
    return d + timedelta(days=ahead)


def _unit_en(word: str) -> str:
    return word.lower().rstrip("s")


_UNIT_CJK = {
    "日": "day",
    "天": "day",
    "週間": "week",
    "周": "week",
    "个星期": "week",
    "ヶ月": "month",
    "か月": "month",
    "カ月": "month",
    "ヵ月": "month",
    "个月": "month",
    "年": "year",
}


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    resolve: Resolver


def _en() -> list[Rule]:
    lang = "en"
    num = r"(\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|a couple of)"
    days = "|".join(_EN_DAYS)
    i = re.IGNORECASE
    return [
        Rule(re.compile(r"\bthe day before yesterday\b", i), _offset(-2, lang)),
        Rule(re.compile(r"\bthe day after tomorrow\b", i), _offset(2, lang)),
        Rule(re.compile(r"\b(?:yesterday|last night)(?:'s)?\b", i), _offset(-1, lang)),
        Rule(re.compile(r"\btomorrow(?:'s)?\b", i), _offset(1, lang)),
        Rule(
            re.compile(rf"\b{num}\s+(days?|weeks?|months?|years?)\s+ago\b", i),
            lambda m, d: _ago(_number(m.group(1)) or 0, _unit_en(m.group(2)), d, lang),
        ),
        Rule(
            re.compile(rf"\bfor {num}\s+(days?|weeks?|months?|years?)\b(\s+now\b)?", i),
            lambda m, d: _since(m, d, lang),
        ),
        Rule(
            re.compile(r"(?<!\bthe )\blast (week|month|year|weekend)\b", i),
            lambda m, d: {
                "week": lambda: _week(d - timedelta(weeks=1), lang),
                "month": lambda: month_text(_months(d, -1), lang),
                "year": lambda: year_text(d.year - 1, lang),
                "weekend": lambda: _weekend(_monday(d) - timedelta(days=2), lang),
            }[m.group(1).lower()](),
        ),
        Rule(
            re.compile(r"(?<!\bthe )\bnext (week|month|year)\b", i),
            lambda m, d: {
                "week": lambda: _week(d + timedelta(weeks=1), lang),
                "month": lambda: month_text(_months(d, 1), lang),
                "year": lambda: year_text(d.year + 1, lang),
            }[m.group(1).lower()](),
        ),
        Rule(
            re.compile(rf"\blast ({days})\b", i),
            lambda m, d: day_text(_last_weekday(_EN_DAYS.index(m.group(1).lower()), d), lang),
        ),
        Rule(
            re.compile(rf"\bnext ({days})\b", i),
            lambda m, d: day_text(_next_weekday(_EN_DAYS.index(m.group(1).lower()), d), lang),
        ),
    ]


def _ja() -> list[Rule]:
    lang = "ja"
    n = r"(\d{1,3}|[一二三四五六七八九十]{1,3})"
    wd = r"([月火水木金土日])曜日?"

    def in_week(weeks: int) -> Resolver:
        return lambda m, d: day_text(
            _monday(d) + timedelta(weeks=weeks, days=_CJK_DAYS[m.group(1)]), lang
        )

    return [
        Rule(re.compile(r"一昨日|おととい"), _offset(-2, lang)),
        Rule(re.compile(r"昨日(?!今日)|きのう|昨夜|昨晩|ゆうべ"), _offset(-1, lang)),
        Rule(re.compile(r"明後日|あさって"), _offset(2, lang)),
        Rule(re.compile(r"明日(?!香)|あした"), _offset(1, lang)),
        Rule(re.compile(rf"先週の?{wd}"), in_week(-1)),
        Rule(re.compile(rf"来週の?{wd}"), in_week(1)),
        Rule(re.compile(r"先週末"), lambda _m, d: _weekend(_monday(d) - timedelta(days=2), lang)),
        Rule(re.compile(r"先週"), lambda _m, d: _week(d - timedelta(weeks=1), lang)),
        Rule(re.compile(r"来週"), lambda _m, d: _week(d + timedelta(weeks=1), lang)),
        Rule(re.compile(r"先月"), lambda _m, d: month_text(_months(d, -1), lang)),
        Rule(re.compile(r"来月"), lambda _m, d: month_text(_months(d, 1), lang)),
        Rule(re.compile(r"一昨年|おととし"), lambda _m, d: year_text(d.year - 2, lang)),
        Rule(re.compile(r"去年|昨年"), lambda _m, d: year_text(d.year - 1, lang)),
        Rule(re.compile(r"来年"), lambda _m, d: year_text(d.year + 1, lang)),
        Rule(re.compile(r"今年"), lambda _m, d: year_text(d.year, lang)),
        Rule(
            re.compile(rf"{n}(日|週間|ヶ月|か月|カ月|ヵ月|年)前"),
            lambda m, d: _ago(_number(m.group(1)) or 0, _UNIT_CJK[m.group(2)], d, lang),
        ),
    ]


def _zh() -> list[Rule]:
    lang = "zh"
    n = r"(\d{1,3}|[一二三四五六七八九十两]{1,3})"
    wd = r"([一二三四五六日天])"

    def in_week(weeks: int) -> Resolver:
        return lambda m, d: day_text(
            _monday(d) + timedelta(weeks=weeks, days=_ZH_DAYS[m.group(1)]), lang
        )

    return [
        Rule(re.compile(r"前天"), _offset(-2, lang)),
        Rule(re.compile(r"昨天|昨晚"), _offset(-1, lang)),
        Rule(re.compile(r"后天"), _offset(2, lang)),
        Rule(re.compile(r"明天"), _offset(1, lang)),
        Rule(re.compile(rf"(?:上周|上个?星期|上礼拜){wd}"), in_week(-1)),
        Rule(re.compile(rf"(?:下周|下个?星期|下礼拜){wd}"), in_week(1)),
        Rule(
            re.compile(r"上个?周末"),
            lambda _m, d: _weekend(_monday(d) - timedelta(days=2), lang),
        ),
        Rule(
            re.compile(r"上周|上个?星期|上礼拜"),
            lambda _m, d: _week(d - timedelta(weeks=1), lang),
        ),
        Rule(
            re.compile(r"下周|下个?星期|下礼拜"),
            lambda _m, d: _week(d + timedelta(weeks=1), lang),
        ),
        Rule(re.compile(r"上个月"), lambda _m, d: month_text(_months(d, -1), lang)),
        Rule(re.compile(r"下个月"), lambda _m, d: month_text(_months(d, 1), lang)),
        Rule(re.compile(r"前年"), lambda _m, d: year_text(d.year - 2, lang)),
        Rule(re.compile(r"去年"), lambda _m, d: year_text(d.year - 1, lang)),
        Rule(re.compile(r"明年"), lambda _m, d: year_text(d.year + 1, lang)),
        Rule(re.compile(r"今年"), lambda _m, d: year_text(d.year, lang)),
        Rule(
            re.compile(rf"{n}(天|周|个星期|个月|年)前"),
            lambda m, d: _ago(_number(m.group(1)) or 0, _UNIT_CJK[m.group(2)], d, lang),
        ),
    ]


_RULES: dict[str, list[Rule]] = {}
_CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
# an annotation already there: "(7 May 2023)", "(2023年5月7日)"
_ANNOTATED = re.compile(r"\s?\((?:[^()]{0,40}\d{4}[^()]{0,12})\)")


def _rules(lang: str) -> list[Rule]:
    if lang not in _RULES:
        _RULES[lang] = {"en": _en, "ja": _ja, "zh": _zh}[lang]()
    return _RULES[lang]


def _cjk_lang(text: str, lang: str) -> str:
    if lang in ("ja", "zh"):
        return lang
    return "ja" if _KANA.search(text) else "zh"


def resolve(text: str, at: datetime | date | None, lang: str = "en") -> str:
    """`text` with every definite relative date followed by the date it means, as of `at`.
    Unchanged when `at` is None."""
    if at is None or not text:
        return text
    day = at.date() if isinstance(at, datetime) else at
    rule_sets = [_rules("en")]
    if _CJK.search(text):
        rule_sets.insert(0, _rules(_cjk_lang(text, lang)))
    found: list[tuple[int, int, str]] = []
    taken: list[tuple[int, int]] = []
    for rules in rule_sets:
        for rule in rules:
            for m in rule.pattern.finditer(text):
                s, e = m.span()
                if any(s < te and ts < e for ts, te in taken):
                    continue
                if _ANNOTATED.match(text, e):
                    taken.append((s, e))
                    continue
                try:
                    value = rule.resolve(m, day)
                except (ValueError, OverflowError):
                    value = None
                if value:
                    found.append((s, e, value))
                    taken.append((s, e))
    if not found:
        return text
    out: list[str] = []
    pos = 0
    for s, e, value in sorted(found):
        sep = " " if _CJK.search(text[s:e]) is None else ""
        out.append(text[pos:e] + f"{sep}({value})")
        pos = e
    out.append(text[pos:])
    return "".join(out)


def unresolve(text: str) -> str:
    """`text` without the dates `resolve` added (to compare a memory line with its source)."""
    out = text
    for rules in (_rules("en"), _rules("ja"), _rules("zh")):
        for rule in rules:
            out = re.sub(
                rf"({rule.pattern.pattern})\s?\((?:[^()]{{0,40}}\d{{4}}[^()]{{0,12}})\)",
                r"\1",
                out,
                flags=rule.pattern.flags,
            )
    return out
