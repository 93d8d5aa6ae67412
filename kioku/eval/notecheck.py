"""Auditing notes: would a reader keep this line as a fact?

Notes are the layer meant to hold what must not drift (names, relations, dates, preferences,
promises), and a review found about half of the Japanese notes unusable: questions
(`CP: なにが好き`), fragments (`CP: のが好き`), a preference given to the wrong owner
(`AI: つ鍋が子供が好き`, from もつ鍋, the child's preference), English notes that lost their
referent ("likes that you chose pottery"), and one subject crowded by contradicting lines ("Mina
likes the clouds / heat / fog / rain …"). Each note in force is checked, without a model, for:

- `question`: a question mark or an interrogative word (なに, 何, どこ, who, what…);
- `fragment`: the fact starts with a particle or has too little left to say anything;
- `deictic`: the fact is a pointing word (アレ, それ, it, that…) with nothing it points to, or
  "the one that…" (…たのが好き, …やつ, …ほう) whose noun was in another sentence;
- `owner_unclear`: a Japanese preference with two subjects (…が…が好き);
- `not_in_source`: fewer than half of its content terms are in the message it cites.

A note with none of these flags is counted as keepable; `keep_share` is their share. With no
notes there is nothing to judge and the totals say "n/a". Beside the flags, `crowding` names
the subjects with the most notes of one kind and verb: eight lines of "Mina likes the clouds /
heat / fog / rain" contradict each other, while many likes of a talkative person do not, and
only a reader can tell which it is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kioku.messages import LogEntry
from kioku.notes import Note

CROWDING_SHOWN = 5
# interrogatives, not their indefinite forms (なぜか "somehow", なにか "something")
_QUESTION = re.compile(r"[?？]|(?:なに|何|どこ|だれ|誰|いつ|どう|どんな|なぜ|どちら|どれ)(?!か)")
_EN_QUESTION = re.compile(r"^(?:who|what|where|why|which|do|does|are|is)\b.*\?*$", re.I)
_PARTICLE_START = re.compile(r"^[のがをにはでともへやかねんっゃゅょ]")
_JA_THE_ONE = re.compile(r"(?:[たっだい]の|やつ|ほう|ほくの)$")  # "the one that…", noun elsewhere
_SAYS = re.compile(r"[\u3400-\u9fff\u30a0-\u30ff]|[\u3040-\u309f]{3}|[A-Za-z]{3}|\d")
_DEICTIC = re.compile(
    r"(?:アレ|あれ|それ|これ|そこ|あそこ|あの|その)(?:が|を|は|に|$)"
    r"|\b(?:that|it|this|those|these|there)\b(?!\s+\w{3,})",
    re.IGNORECASE,
)
_LEAD_POINTER = re.compile(r"^(?:that|it|this|to|you|them|him|her|when|how)\b", re.IGNORECASE)
_EN_VERB = re.compile(r"^(likes|dislikes|usually|promised:|is called|wants to be called)\s+", re.I)
_JA_PREF = re.compile(r"^(.*?)が(?:大)?(?:好き|嫌い)$")
FLAGS = ("question", "fragment", "deictic", "owner_unclear", "not_in_source")


def _object(text: str) -> str:
    """What the note says about its subject, without the template's verb."""
    m = _JA_PREF.match(text)
    if m:
        return m.group(1)
    return _EN_VERB.sub("", text).strip()


def _verb(text: str) -> str:
    m = _EN_VERB.match(text)
    if m:
        return m.group(1).lower()
    return "好き" if text.endswith("好き") else "嫌い" if text.endswith("嫌い") else ""


def note_flags(note: Note, source: LogEntry | None, terms: Callable[[str], set[str]]) -> list[str]:
    flags = []
    obj = _object(note.text)
    if _QUESTION.search(note.text) or _EN_QUESTION.match(note.text):
        flags.append("question")
    if _PARTICLE_START.match(obj) or _LEAD_POINTER.match(obj) or not _SAYS.search(obj):
        flags.append("fragment")
    if (_DEICTIC.search(obj) and len(terms(obj)) <= 1) or _JA_THE_ONE.search(obj):
        flags.append("deictic")
    if _JA_PREF.match(note.text) and "が" in obj:
        flags.append("owner_unclear")
    if source is not None:
        mine = terms(note.text) - terms(note.subject)
        if mine and len(mine & terms(source.text)) < len(mine) / 2:
            flags.append("not_in_source")
    return flags


def check_notes(
    notes: Sequence[Note],
    source: Callable[[int], LogEntry | None],
    terms: Callable[[str], set[str]],
) -> dict[str, Any]:
    """Every note in force, flagged; totals and the share a reader would keep."""
    groups = Counter((n.subject, n.kind, _verb(n.text)) for n in notes)
    rows: list[dict[str, Any]] = []
    for n in notes:
        src = source(n.source_seq) if n.source_seq is not None else None
        flags = note_flags(n, src, terms)
        rows.append({"line": n.line(), "source_seq": n.source_seq, "flags": flags})
    flagged = sum(1 for r in rows if r["flags"])
    totals: dict[str, Any] = {"notes": len(rows)}
    if rows:
        totals["notes_flagged"] = flagged
        totals["notes_keep_share"] = round(1 - flagged / len(rows), 4)
        for f in FLAGS:
            totals[f"notes_{f}"] = sum(1 for r in rows if f in list(r["flags"]))
    else:
        totals["notes_flagged"] = "n/a"
        totals["notes_keep_share"] = "n/a"
    crowding = [
        {"subject": subj, "kind": kind, "verb": verb, "notes": k}
        for (subj, kind, verb), k in groups.most_common(CROWDING_SHOWN)
    ]
    return {"totals": totals, "notes": rows, "crowding": crowding}
