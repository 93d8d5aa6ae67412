"""The conversation as the chronicler reads it: every line says who wrote it and what kind it is.

The seed's summarizer was fed the character's replies joined into one string, so a lying character's
claim about herself read exactly like narration and entered memory as fact. Here the structure is
kept to the last step: each message shows its seq, its time, whether the user or the character wrote
it, and each part is marked narration, speech (with the speaker) or unspoken thought. A relative
date ("yesterday") is followed by the date it means, so the chronicler can write dates that last. Labels follow
the conversation's language, matching the words the prompt templates use.

The protocol's parts are shown as what they are, never as something a person said: a tool call is
an action of its author ("[tool use] Mika: get_weather {…}"), a tool result what the tool returned
("[tool result] get_weather: sunny"), an image something its author shared (its caption is the
message's text around it).

What a message says can never pose as this structure (`kioku.inert`): its text is inert, its
further lines are indented under its part (kioku's headers start a line, its part labels two
spaces in, a message's own lines four), a part whose text opens like a label or a header shows
that first bracket full-width, names are one line, and a line that looks like a secret
(a password, a key, a card number) is withheld (`kioku.sensitive`): it stays in the log, never
goes into memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from kioku.dates import WEEKDAYS
from kioku.inert import indented, inert, inert_start, one_line
from kioku.messages import LogEntry, Part, canonical_json
from kioku.prompts import resolve_lang
from kioku.relative_dates import resolve
from kioku.sensitive import opened_by_earlier, withheld


@dataclass(frozen=True)
class Labels:
    user: str
    character: str
    system: str
    tool: str
    narration: str
    speech: str
    thought: str
    open_quote: str
    close_quote: str
    colon: str
    tool_call: str = "[tool use]"
    tool_result: str = "[tool result]"
    image: str = "[image shared]"
    attachment: str = "[file shared]"
    lang: str = "en"


LABELS: Mapping[str, Labels] = {
    "en": Labels(
        user="user",
        character="character",
        system="system",
        tool="tool",
        narration="[narration]",
        speech="[speech]",
        thought="[thought, unspoken]",
        open_quote='"',
        close_quote='"',
        colon=": ",
    ),
    "ja": Labels(
        user="ユーザー",
        character="キャラクター",
        system="システム",
        tool="ツール",
        narration="[地の文]",
        speech="[台詞]",
        thought="[本音・口に出していない]",
        open_quote="「",
        close_quote="」",
        colon=": ",
        tool_call="[ツール使用]",
        tool_result="[ツール結果]",
        image="[画像を共有]",
        attachment="[ファイルを共有]",
        lang="ja",
    ),
    "zh": Labels(
        user="用户",
        character="角色",
        system="系统",
        tool="工具",
        narration="[旁白]",
        speech="[台词]",
        thought="[内心·未说出口]",
        open_quote="“",
        close_quote="”",
        colon=": ",
        tool_call="[使用工具]",
        tool_result="[工具结果]",
        image="[分享图片]",
        attachment="[分享文件]",
        lang="zh",
    ),
}

INDENT = "  "
DATED = ("narration", "speech", "thought", "text")  # parts whose words may say "yesterday"


def labels_for(lang: str) -> Labels:
    return LABELS[resolve_lang(lang)]


def _stamp(at: datetime | None, previous: datetime | None, lang: str = "en") -> str:
    """Full date and weekday when the day changes (or on the first message), the time alone
    otherwise: dates matter to the story (the weekday lets a reader resolve "last Friday") but
    repeating them on every line costs tokens."""
    if at is None:
        return ""
    if previous is None or previous.date() != at.date():
        weekday = WEEKDAYS.get(lang, WEEKDAYS["en"])[at.weekday()]
        return f"{at:%Y-%m-%d} ({weekday[:3] if lang == 'en' else weekday}) {at:%H:%M}"
    return at.strftime("%H:%M")


def _indent(text: str, opened: bool = False) -> str:
    return indented(withheld(text.strip(), opened=opened), INDENT + INDENT)


def render_part(part: Part, author: str, labels: Labels, opened: bool = False) -> str:
    """`opened`: the part's first line is the value of a keyword its author's previous message
    ended on (`kioku.sensitive.opened_by_earlier`)."""
    text = _indent(part.text, opened)
    author = one_line(author)
    if part.kind == "narration":
        return f"{INDENT}{labels.narration} {text}"
    if part.kind == "speech":
        who = one_line(part.speaker or "") or author
        quoted = f"{labels.open_quote}{text}{labels.close_quote}"
        return f"{INDENT}{labels.speech} {who}{labels.colon}{quoted}"
    if part.kind == "thought":
        who = one_line(part.speaker or "") or author
        return f"{INDENT}{labels.thought} {who}{labels.colon}{text}"
    if part.kind == "tool_call":
        call = f"{one_line(part.name or '')} {inert(withheld(canonical_json(part.text)))}"
        return f"{INDENT}{labels.tool_call} {author}{labels.colon}{call}"
    if part.kind == "tool_result":
        tool = one_line(part.name or "") or labels.tool
        return f"{INDENT}{labels.tool_result} {tool}{labels.colon}{text}"
    if part.kind == "image":
        return f"{INDENT}{labels.image} {author}"
    if part.kind == "attachment":
        return f"{INDENT}{labels.attachment} {author} ({one_line(part.name or '')})"
    return f"{INDENT}{inert_start(text)}"


def render_entry(
    entry: LogEntry,
    labels: Labels,
    previous: datetime | None = None,
    *,
    numbered: bool = True,
    opened: bool = False,
) -> str:
    """One message: a header line (#seq, time, author and side) and one line per part; the
    chronicler's chapters read it without the #seq (`render_transcript`)."""
    m = entry.message
    side = {
        "user": labels.user,
        "assistant": labels.character,
        "system": labels.system,
        "tool": labels.tool,
    }[m.role]
    author = one_line(m.author) or side
    head = [f"#{entry.seq}"] if numbered else []
    stamp = _stamp(m.at, previous, labels.lang)
    if stamp:
        head.append(stamp)
    labelled = one_line(m.author) and not author.endswith(f"({side})")  # "Mika (user)" is
    head.append(f"{author} ({side})" if labelled else author)
    lines = [" · ".join(head)]
    for p in m.parts:
        if p.text.strip() or p.ref:
            # "yesterday" with the date it means beside it, so the summary can say when
            dated = replace(p, text=resolve(p.text, m.at, labels.lang)) if p.kind in DATED else p
            lines.append(render_part(dated, author, labels, opened and p.kind in DATED))
            opened = opened and p.kind not in DATED  # the value is in the first part said
    return "\n".join(lines)


def render_transcript(
    entries: Iterable[LogEntry], lang: str = "en", *, numbered: bool = True
) -> str:
    """A range of the log as the chronicler reads it, messages separated by blank lines.
    Unnumbered for a chapter: shown message numbers, a model wrote one line per number
    whatever that message said (kioku/prompts/en/chapter.txt); code finds what bears a line out."""
    labels = labels_for(lang)
    out: list[str] = []
    previous: datetime | None = None
    entries = list(entries)
    opened = opened_by_earlier([(e.message.role, e.message.text) for e in entries])
    for e, value in zip(entries, opened, strict=True):
        if e.message.is_empty():
            continue
        out.append(render_entry(e, labels, previous, numbered=numbered, opened=value))
        previous = e.message.at or previous
    return "\n\n".join(out)
