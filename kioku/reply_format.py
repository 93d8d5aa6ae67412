"""The chronicler's reply format: plain lines a model writes reliably.

Measured on a local model (docs/chronicler.md): asked for the five-key JSON record or for
"#<seq> <writer>: <what it says>" lines, the model copied the transcript message by
message until max_tokens cut it; asked for facts citing "(#<seq>)" from a numbered transcript,
it wrote one line per number whatever that message said. Shown no numbers and asked for the
most important facts, one short sentence each, starting with the person it is about, it wrote
facts. So the reply is

    - <name> <fact>
    OPEN <thread-id>: <what is still open>
    DONE <thread-id>: <how it was settled>

and every other shape a model falls into is read too: "#<seq> <writer>: <text>" (the writer
named), a person's name as a heading over their facts, "QUOTE #<seq> <speaker>: <words>", a
citation anywhere in a line, a paragraph of sentences (each one a line). A line without a
citation is grounded where one message of the span bears it out, and cites it from then on
(`kioku.grounding`). Code, not the model, decides what each grounded line is
(`kioku.grounding.records`): a line borne out by narration is an event, a character's words
a claim (confirmed only when narration or a thought says so too), what the user said
about themself a user fact. Lines are read leniently about their wrapping (bullets, bold, a
code fence, "#12-#13", "(user)" after a name), once each (a looping model repeats them), and
strictly about their shape: a line that is none of these is counted as dropped ("format"),
never guessed at. A reply in the JSON record shape is still read (`structure.parse_record`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kioku.errors import BadSummary
from kioku.structure import TIC_WORDS

_WRAP = re.compile(r"^\s*(?:[-*•・>]+\s*|\d+[.)]\s+)?(?:\*\*)?")
_SEQS = r"#\s*(\d+)((?:\s*(?:[-–~〜,、]|and|&)\s*#?\s*\d+)*)"
_LINE = re.compile(rf"^{_SEQS}\s*(?:[·:：.\-–]\s*)?(.*)$")
_STAMP = re.compile(
    r"^(?:·\s*)?(?:\d{4}-\d{1,2}-\d{1,2}\s*(?:\([^)]*\)\s*)?)?(?:\d{1,2}:\d{2}\s*)?·\s*"
)
_NAME_TEXT = re.compile(r"^([^:：\n]{1,48}?)\s*[:：]\s*(.+)$")
_THREAD = re.compile(
    rf"^(OPEN|DONE|RESOLVED|CLOSED|SETTLED)\s+([\w\-]+)\s*(?:[(（]?{_SEQS}[)）]?)?\s*[:：]\s*"
    rf"(.+?)\s*(?:[(（]?{_SEQS}[)）]?)?\s*[.。]?$",
    re.IGNORECASE,
)
# a thread's keyword in front of a citation instead of a short id: the line is a fact
_NUMBERED_THREAD = re.compile(r"^(?:OPEN|DONE|RESOLVED|CLOSED|SETTLED)\s+(#\s*\d.*)$", re.I)
# a keyword, the format's own word or a bare number for an id ("DONE OPEN: …", "OPEN thread:
# 3段腹", "OPEN 1: …", as models write): a thread of no name, which memory would show
# as "[open] thread" or "[open] 1"
_NAMELESS_THREAD = re.compile(
    r"^(?:OPEN|DONE|RESOLVED|CLOSED|SETTLED)\s+(?:OPEN|DONE|thread(?:-id)?|id)?\d*\s*[:：]", re.I
)
_QUOTE = re.compile(
    rf"^(?:QUOTE|KEY)\s*[:：]?\s*{_SEQS}\s+([^:：\n]{{1,48}}?)\s*[:：]\s*(.+)$", re.I
)
_SIDE = re.compile(r"\s*[(（](?:user|character|ユーザー|キャラクター|用户|角色)[)）]\s*$", re.I)
_QUOTES = "\"'「」『』“”‘’"
_BULLET = re.compile(r"^\s*(?:[-*•・]|\d+[.)])\s*")
_CITED = re.compile(rf"\s*[(（\[]?\s*{_SEQS}\s*[)）\]]?\s*[.。]?\s*$")
_HEADING = re.compile(r"^\**([^:：#\n]{1,32}?)\**\s*[:：]\s*$")
# a line whose "writer" is the narration names no one: what happened, not what someone said
NARRATION_NAMES = frozenset(["narration", "narrator", "地の文", "ナレーション", "旁白"])


@dataclass(frozen=True)
class ReplyLine:
    seqs: tuple[int, ...]
    name: str  # who wrote the message, as the line says ("" when it names nobody)
    text: str
    raw: str
    about: str = ""  # whom the line is about, when a heading says so


@dataclass(frozen=True)
class ThreadLine:
    id: str
    status: str  # open | resolved
    seq: int | None
    title: str
    raw: str


@dataclass(frozen=True)
class QuoteLine:
    seq: int
    speaker: str
    text: str
    raw: str


@dataclass(frozen=True)
class LineReply:
    lines: tuple[ReplyLine, ...]
    threads: tuple[ThreadLine, ...]
    quotes: tuple[QuoteLine, ...]
    unread: tuple[str, ...]  # lines that are none of the shapes: counted as dropped ("format")

    @property
    def written(self) -> int:
        return len(self.lines) + len(self.threads) + len(self.quotes) + len(self.unread)


def _seqs(first: str, more: str | None) -> tuple[int, ...]:
    out = [int(first)]
    nums = [int(n) for n in re.findall(r"\d+", more or "")]
    if more and re.match(r"\s*[-–~〜]", more) and nums and nums[0] >= out[0]:
        out.extend(range(out[0] + 1, min(nums[0], out[0] + 4) + 1))  # "#12-#14": a short run
        nums = nums[1:]
    out.extend(nums)
    return tuple(dict.fromkeys(out))


def _clean(s: str) -> str:
    s = s.strip().rstrip("*").strip()
    return s.removeprefix("**").strip()


_CITATION_ONLY = re.compile(rf"[(（\[]?\s*{_SEQS}\s*[)）\]]?[.。]?")
_RUN_ON = re.compile(r"(?<=[.!?。！？])\s+(?=#\s*\d+\s)")


def _pieces(text: str) -> list[str]:
    """The reply's lines, a run-on line of several "#n …" lines split at each of them, each
    line once: a model that loops writes the same lines again and again (a whole block of
    lines over and over), and a repeated line is no truer."""
    pieces = [p for line in text.splitlines() for p in _RUN_ON.split(line)]
    seen: set[str] = set()
    out = []
    for p in pieces:
        key = " ".join(p.split())
        if key and key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+(?=\S)|(?<=[。！？])(?=\S)")


def _sentences(s: str) -> list[str]:
    """A paragraph's sentences, when it holds two or more of three words or more (a small
    model, asked for lines, sometimes wrote its facts as one paragraph); [] otherwise."""
    parts = [p.strip() for p in _SENTENCE_END.split(s) if p.strip()]
    if len(parts) < 2:
        return []
    return [p for p in parts if len(p.split()) >= 3 or (len(p) >= 8 and not p.isascii())]


def parse_lines(text: str) -> LineReply:
    """The lines of a reply, by shape. Raises `BadSummary` when nothing in it is a line."""
    lines: list[ReplyLine] = []
    threads: list[ThreadLine] = []
    quotes: list[QuoteLine] = []
    unread: list[str] = []
    about = ""  # the person a heading ("Mika:") puts the next lines under
    for raw in _pieces(text):
        s = raw.strip()
        if not s or s.startswith("```") or set(s) <= set("-=*_ "):
            continue  # blank, a fence, a rule
        if (alone := _CITATION_ONLY.fullmatch(s)) and lines and not lines[-1].seqs:
            lines[-1] = replace(lines[-1], seqs=_seqs(alone.group(1), alone.group(2)))
            continue  # the previous line's citation, on a line of its own
        if alone:
            continue
        if h := _HEADING.match(_clean(s)):
            name = _SIDE.sub("", h.group(1)).strip()
            about = name if len(name.split()) <= 3 and not name[0].islower() else ""
            continue  # a heading: a person's name, or "Here are the facts:"
        bullet = bool(_BULLET.match(s))
        if not bullet:
            about = ""  # a heading's facts are the bullets under it
        s = _clean(_WRAP.sub("", s, count=1))
        if m := _NUMBERED_THREAD.match(s):  # "DONE #123: Mika went …": a cited line
            s = m.group(1)
        if _NAMELESS_THREAD.match(s):
            unread.append(raw.strip())
            continue
        if not s.startswith("#") and (said := _inline(s)):
            lines += [ReplyLine(q, "", body, raw, who) for who, body, q in said]
            continue
        if m := _THREAD.match(s):
            status = "open" if m.group(1).upper() == "OPEN" else "resolved"
            seq = m.group(3) or m.group(6)
            title = m.group(5).strip().strip(_QUOTES).strip()
            threads.append(
                ThreadLine(m.group(2).lower(), status, int(seq) if seq else None, title, raw)
            )
            continue
        if m := _QUOTE.match(s):
            speaker = _SIDE.sub("", m.group(3)).strip()
            words = m.group(4).strip().strip(_QUOTES).strip()
            quotes.append(QuoteLine(int(m.group(1)), speaker, words, raw))
            continue
        if m := _LINE.match(s):
            seqs = _seqs(m.group(1), m.group(2))
            rest = m.group(3).strip()
            rest = _STAMP.sub("", rest)  # a transcript header copied: "· 13:56 · Mika (user):"
            nt = _NAME_TEXT.match(rest)
            if nt and len(nt.group(1).split()) <= 4:
                name, body = _SIDE.sub("", nt.group(1)).strip().strip("*").strip(), nt.group(2)
            else:
                name, body = "", rest
            if name.casefold() in NARRATION_NAMES:
                name = ""
            body = body.strip().strip("*").strip()
            if body:
                lines.append(ReplyLine(seqs, name, body, raw, about))
                continue
        if bullet or about or _CITED.search(s) or _CITATION.search(s):
            body, seqs = _citations(s)
            body = body.strip().strip(_QUOTES + "*").strip()
            if body and not _PLACEHOLDER_ONLY.fullmatch(body):
                lines.append(ReplyLine(seqs, "", body, raw, about))
                continue
        if sentences := _sentences(s):  # a paragraph of facts: each sentence a line
            for sentence in sentences:
                body, seqs = _citations(sentence)
                lines.append(ReplyLine(seqs, "", body, raw, about))
            continue
        unread.append(raw.strip())
    if not (lines or threads or quotes):
        raise BadSummary("unparseable: write one fact a line, each line starting with - ", text)
    return LineReply(tuple(lines), tuple(threads), tuple(quotes), tuple(unread))


_PERSON_SAYS = re.compile(
    r"(?:^|(?<=[.!?。！？]))\s*([A-Z][\w'\-]{0,20}|[^\x00-\x7f\s:：]{1,8})[:：]\s*"
)


def _inline(s: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """ "Mika: went to a support group. Samantha: painted a lake sunrise." → one line about
    each person ([] when the line is not of that shape)."""
    marks = list(_PERSON_SAYS.finditer(s))
    if not marks or marks[0].start() != 0 or s[: marks[0].end()].count(" ") > 2:
        return []
    out = []
    for i, m in enumerate(marks):
        body, seqs = _citations(s[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(s)])
        if body:
            out.append((m.group(1), body, seqs))
    return out


_CITATION = re.compile(rf"\s*[(（\[]\s*{_SEQS}\s*[)）\]]")


def _citations(s: str) -> tuple[str, tuple[int, ...]]:
    """A line without its citations, wherever the model put them ("Mika (#2) went …",
    "… group (#2).", "… group #2"), and the seqs they cite."""
    seqs: list[int] = []
    for m in _CITATION.finditer(s):
        seqs += _seqs(m.group(1), m.group(2))
    body = _CITATION.sub("", s)
    if not seqs and (tail := _CITED.search(body)):
        seqs += _seqs(tail.group(1), tail.group(2))
        body = body[: tail.start()]
    return re.sub(r"\s{2,}", " ", body).strip(), tuple(dict.fromkeys(seqs))


_PLACEHOLDER_ONLY = re.compile(r"[<＜].*[>＞]")  # a form copied back unfilled: dropped as format


def looks_like_json(text: str) -> bool:
    """A reply in the JSON record shape (an older prompt, or a model that prefers it)."""
    t = text.strip()
    return t.startswith("{") or "```json" in t.lower() or bool(re.search(r'^\s*\{\s*"', t, re.M))


def without_phrases(reply: LineReply, phrases: Sequence[str]) -> tuple[LineReply, int]:
    """Verbal tics out of the lines before they are grounded (a true line with a tic tacked on
    stays, without the tic): a line about a speech habit ("often says") goes, a quotation
    holding a tic goes (its words cannot be edited), the phrase is cut from any other line."""
    pats = [re.compile(re.escape(p.strip()), re.IGNORECASE) for p in phrases if p.strip()]
    touched = 0

    def clean(s: str) -> str:
        for p in pats:
            s = p.sub("", s)
        return re.sub(r"\s{2,}", " ", s).strip(" ,、。")

    lines: list[ReplyLine] = []
    for ln in reply.lines:
        tic = any(p.search(ln.text) for p in pats)
        if TIC_WORDS.search(ln.text) or (tic and not re.search(r"\w", clean(ln.text))):
            touched += 1
            continue
        if tic:
            touched += 1
            ln = replace(ln, text=clean(ln.text))
        lines.append(ln)
    quotes = [q for q in reply.quotes if not any(p.search(q.text) for p in pats)]
    touched += len(reply.quotes) - len(quotes)
    return replace(reply, lines=tuple(lines), quotes=tuple(quotes)), touched
