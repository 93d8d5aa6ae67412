"""Facts a reader would keep, found in messages without a model: the ledger's extractor.

Names, relations, anniversaries, promises, preferences, habits, where someone lives or works,
numbers and dated events — each attributed (who said it, whom it is about) and dated (the
message's date, or the day a relative date in it resolves to). When no model writes the notes
this is what fills the ledger, and the extractive chronicler keeps the lines it finds facts in,
so a cut made under pressure keeps what the ledger would have kept.

Precision over recall: a note is shown in every prompt until it is superseded, so a wrong or
meaningless note costs more than a missed one. An object must be a noun phrase that means
something out of context: not a question ("what do you like"), not a fragment, not a reaction
to what the other person said ("I love that you chose pottery"), not a pronoun. "You" becomes
the person spoken to, so a note keeps its referent. Japanese goes through the morphological
analyzer (`kioku.facts_ja`); English is matched here.

A fact may fill a `slot` (a name, a residence, a sister's name, the weather one likes): a newer
fact in the same slot supersedes the older, so memory never holds "likes the rain" beside
"likes the fog" beside "likes the heat".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime

from kioku.fact import Fact, Speech, slot_for_object
from kioku.messages import LogEntry
from kioku.relative_dates import resolve
from kioku.salience import content_words
from kioku.sensitive import opened_by_earlier, withheld

# English ------------------------------------------------------------------------------------

_NAME = r"([A-Z][a-z'\-]+(?: [A-Z][a-z'\-]+)?)"
_REL = (
    r"(sister|brother|mother|mom|mum|father|dad|wife|husband|girlfriend|boyfriend|partner|"
    r"fianc[ée]e?|best friend|friend|son|daughter|grandma|grandmother|grandpa|grandfather|"
    r"aunt|uncle|cousin|niece|nephew|dog|cat|puppy|kitten|boss|roommate)"
)
_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)"
)
_DAY = rf"((?:{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}))"
_END = r"(?=\s*(?:[.!?;,]| [-–—] |\band\b|\bbut\b|\bbecause\b|\bso\b|\bsince\b|$))"
_CLAUSE = r"([^.!?;\n–—]{3,90}?)"
_COUNT = r"(\d+|two|three|four|five|six|seven|eight|nine|ten|a|an|one)"
_PLURALS = r"(kids|children|sons|daughters|dogs|cats|pets|brothers|sisters|grandchildren)"

# an object that is a reaction to the other person, or a pointer, not a preference
_NOT_OBJECT = re.compile(
    r"^(?:that|how|when|what|where|why|who|it|this|these|those|them|him|her|you|your|yours|us|both|"
    r"me|mine|myself|the way|hearing|seeing|reading that|knowing|being able|having you|talking|"
    r"chatting|to hear|to see|to know|to chat|to talk|spending time with you|every|the idea|"
    r"the thought)\b",
    re.IGNORECASE,
)
_POINTER_END = re.compile(r"\b(?:it|that|this|them|those|there|too|so much|a lot)\s*$", re.I)
_POINTER = re.compile(r"\b(?:it|that|there|them|those)\b|\bthis\b(?!\s+[a-z]{3,})", re.I)
_THIRD = re.compile(r"\b(?:he|him|his|she|her|hers|they|them|their)\b", re.IGNORECASE)


def _you(text: str, addressee: str) -> str:
    """Second person → the person spoken to, so the note keeps its referent."""
    if not addressee:
        return text
    for you, verb in (("you are", "is"), ("you're", "is"), ("you were", "was"), ("you've", "has")):
        text = re.sub(rf"\b{you}\b", f"{addressee} {verb}", text, flags=re.IGNORECASE)
    text = re.sub(r"\byour(?:s)?\b", f"{addressee}'s", text, flags=re.IGNORECASE)
    text = re.sub(r"\byourself\b", addressee, text, flags=re.IGNORECASE)
    return re.sub(r"\byou\b", addressee, text, flags=re.IGNORECASE)


def _me(text: str, speaker: str) -> str:
    """First person → the speaker, in a note worded about them ("likes camping with my
    family" → "likes camping with Mina's family"; "expressing myself" → "expressing
    oneself"): a note is read under another speaker's voice, where "my" means someone else."""
    text = re.sub(r"\b(?:my|mine)\b", f"{speaker}'s", text, flags=re.IGNORECASE)
    return re.sub(r"\bmyself\b", "oneself", text, flags=re.IGNORECASE)


def _third(text: str, referent: str) -> str:
    if not referent:
        return text
    text = re.sub(
        r"\bhis\b|\bher\b(?= (?!(?:a|an|the|some|to|and|up|out|back|home)\b)[a-z])",
        f"{referent}'s",
        text,
    )
    return re.sub(r"\b(?:she|he|her|him)\b", referent, text)


def _object_ok(obj: str) -> bool:
    o = obj.strip()
    if not o or _NOT_OBJECT.match(o) or _POINTER_END.search(o):
        return False
    if len(o.split()) > 8 or re.search(r"\byou\b|\byour\b", o, re.IGNORECASE):
        return False
    if re.search(r"\bI\b|\bI'[a-z]+\b|\bme\b", o):
        return False  # a clause of the speaker's own ("the friends I have"), not a thing
    return bool(content_words(o))


# "a job I enjoy", "the things I love": a noun phrase right before "I" makes the clause
# relative, so what follows the verb is not what is liked
_RELATIVE = re.compile(
    r"\b(?:the|a|an|my|this|that|these|those|some|any|every|all|one)\s+(?:[\w'][\w'-]*\s+){0,2}$",
    re.IGNORECASE,
)
_AND = re.compile(r"\b(?:and|or)\s+$", re.IGNORECASE)  # "my partner and I": the speaker too


def _relative(text: str, start: int) -> bool:
    before = text[:start]
    return bool(_RELATIVE.search(before)) and not _AND.search(before)


def _unaddressed(obj: str, addressee: str) -> str:
    """Drop a trailing vocative: "the blue one, Ren" → "the blue one"."""
    if not addressee:
        return obj
    return re.sub(rf",?\s+{re.escape(addressee)}$", "", obj)


def _fact(kind: str, subject: str, text: str, s: Speech, slot: str = "") -> Fact:
    text = resolve(re.sub(r"\s+", " ", text).strip(" ,"), s.at, "en")
    on = s.at.date() if s.at else None
    return Fact(kind, subject, text, s.speaker, s.seq, on, slot)


_MARKUP = re.compile(r"\s*\[[^\]\n]*\]")  # dataset markup: [shares a photo: …]


def _english(s: Speech) -> list[Fact]:
    text, me = _MARKUP.sub("", s.text), s.speaker
    out: list[Fact] = []
    referent = ""
    for m in re.finditer(rf"\b[Mm]y {_REL}(?:'s name)?(?: is|,)? (?:called |named )?{_NAME}", text):
        rel, name = m.group(1).lower(), m.group(2).removesuffix("'s")
        if name.split()[0] in ("I", "The", "A", "So", "And", "But", "Is"):
            continue
        if re.match(r"\s+and\b", text[m.end() :]):
            continue  # "my girlfriend, Toby and I": a list, not a name
        referent = name
        out.append(_fact("relation", me, f"{rel} is {name}", s, f"relation:{rel}:{name.lower()}"))
    for m in re.finditer(rf"\b(?i:my name is|call me) {_NAME}", text):
        out.append(_fact("name", me, f"is called {m.group(1)}", s, "name"))
    for m in re.finditer(
        rf"\b([Mm]y|[Hh]er|[Hh]is|[Oo]ur) (?:{_REL}'s )?birthday is (?:on )?{_DAY}", text
    ):
        whose, rel, day = m.group(1).lower(), m.group(2), m.group(3)
        subject = me if whose in ("my", "our") else referent
        if rel:
            subject = referent or f"{me}'s {rel.lower()}"
        if subject:
            out.append(_fact("anniversary", subject, f"birthday is {day}", s, "birthday"))
    for m in re.finditer(rf"\b[Oo]ur (?:wedding )?anniversary is (?:on )?{_DAY}", text):
        out.append(_fact("anniversary", me, f"anniversary is {m.group(1)}", s, "anniversary"))
    for m in re.finditer(rf"\bI (?:promise|swear) (?:to |that |you )?{_CLAUSE}(?=[.!?;]|$)", text):
        clause = _third(_you(m.group(1), s.addressee), referent)
        pointer = _POINTER_END.search(clause) or _POINTER.search(clause)
        if content_words(clause) and not _THIRD.search(clause) and not pointer:
            out.append(_fact("promise", me, f"promised: {_me(clause, me)}", s))
    like = r"\bI (?:really |truly |absolutely |just |also )?(like|love|enjoy|adore|hate|dislike|can't stand|don't like|do not like)"
    for m in re.finditer(rf"{like} {_CLAUSE}{_END}", text):
        verb, obj = m.group(1).lower(), _unaddressed(m.group(2).strip(), s.addressee)
        if not _object_ok(obj) or _THIRD.search(obj) or _relative(text, m.start()):
            continue
        obj = _me(obj, me)
        likes = verb in ("like", "love", "enjoy", "adore")
        out.append(
            _fact(
                "preference",
                me,
                f"{'likes' if likes else 'dislikes'} {obj}",
                s,
                slot_for_object(obj),
            )
        )
    for m in re.finditer(
        rf"\b[Mm]y (?:all-time )?favou?rite ([a-z ]{{2,30}}?) is {_CLAUSE}{_END}", text
    ):
        what, obj = m.group(1).strip(), _unaddressed(m.group(2).strip(), s.addressee)
        if _object_ok(obj):
            obj = _me(obj, me)
            out.append(_fact("preference", me, f"favourite {what}: {obj}", s, f"favourite:{what}"))
    for m in re.finditer(
        rf"\bI'm (?:a (?:big |huge )?fan of|really into|into) {_CLAUSE}{_END}", text
    ):
        obj = _unaddressed(m.group(1).strip(), s.addressee)
        if _object_ok(obj) and not _THIRD.search(obj):
            obj = _me(obj, me)
            out.append(_fact("preference", me, f"likes {obj}", s, slot_for_object(obj)))
    for m in re.finditer(rf"\bI (?:always|usually|often|regularly) {_CLAUSE}{_END}", text):
        clause = _you(_unaddressed(m.group(1), s.addressee), s.addressee)
        if _object_ok(clause) and not _THIRD.search(clause) and not _relative(text, m.start()):
            out.append(_fact("habit", me, f"usually {_me(clause, me)}", s))
    place = r"((?:[A-Z][\w'\-]+)(?:,? [A-Z][\w'\-]+){0,3})"
    for m in re.finditer(rf"\bI(?:'m| am)? (?:live|living|currently live) in {place}", text):
        out.append(_fact("fact", me, f"lives in {m.group(1)}", s, "residence"))
    for m in re.finditer(rf"\bI grew up in {place}", text):
        out.append(_fact("fact", me, f"grew up in {m.group(1)}", s, "origin"))
    for m in re.finditer(rf"\bI(?:'m| am) (?:originally )?from {place}", text):
        out.append(_fact("fact", me, f"is from {m.group(1)}", s, "origin"))
    for m in re.finditer(rf"\bI moved (?:here )?(from|to) {place}{_CLAUSE}?{_END}", text):
        tail = _me((m.group(3) or "").strip(), me)
        out.append(_fact("fact", me, f"moved {m.group(1)} {m.group(2)} {tail}", s))
    for m in re.finditer(rf"\bI(?: work|'m working| am working) (as|at|for) {_CLAUSE}{_END}", text):
        if _object_ok(m.group(2)):
            out.append(_fact("fact", me, f"works {m.group(1)} {_me(m.group(2), me)}", s, "job"))
    for m in re.finditer(rf"\b[Mm]y job is {_CLAUSE}{_END}", text):
        if _object_ok(m.group(1)):
            out.append(_fact("fact", me, f"job: {_me(m.group(1), me)}", s, "job"))
    for m in re.finditer(r"\bI(?:'m| am) (\d{1,3}) years old", text):
        out.append(_fact("fact", me, f"is {m.group(1)} years old", s, "age"))
    for m in re.finditer(rf"\bI(?:'ve| have) {_COUNT} {_PLURALS}\b", text):
        out.append(
            _fact("relation", me, f"has {m.group(1)} {m.group(2)}", s, f"count:{m.group(2)}")
        )
    for m in re.finditer(
        rf"\bI(?:'ve| have) been ([a-z]+ing\b[^.!?;]{{0,40}}?) for {_COUNT} (years|months)", text
    ):
        what = _you(m.group(1), s.addressee)
        if _object_ok(what):
            what = _me(what, me)
            out.append(_fact("habit", me, f"has been {what} for {m.group(2)} {m.group(3)}", s))
    if not out:
        for sent in sentences(text):
            out.extend(_dated_event(Speech(sent, s.speaker, s.addressee, s.at, s.seq)))
    return out


_EVENT = re.compile(
    r"\b(?:I|We|I've|We've|I just|we just)\b[^.!?]{0,12}?\b(?:went|visited|started|joined|adopted|"
    r"bought|got|ran|attended|finished|took|moved|signed up|made|painted|met|won|lost|"
    r"celebrated|traveled|travelled|hiked|performed|gave|had|saw|watched|read|wrote|built|"
    r"baked|cooked|planted|graduated|opened|launched|received|tried|learned|camped|volunteered)\b",
    re.IGNORECASE,
)


_CLAUSE_BREAK = re.compile(
    r"\s*(?:[,;:!]| [-–—] )\s*|\s+(?=(?:and it|and that|and we|which|but|so|because)\b)"
)
_LEAD = re.compile(r"^(?:yeah|yes|oh|wow|well|actually|so|and|also|btw|by the way|hey)\b\W*", re.I)


def _event_clause(sentence: str, at: datetime) -> str | None:
    """The clause of a sentence that holds the event and its date: "Yeah, I went to a
    support group yesterday and it was so powerful" → "went to a support group yesterday
    (7 May 2023)"."""
    clauses = [c.strip() for c in _CLAUSE_BREAK.split(sentence) if c and c.strip()]
    for i, c in enumerate(clauses):
        if resolve(c, at, "en") == c:
            continue
        if not _EVENT.search(c) and i > 0 and _EVENT.search(clauses[i - 1]):
            c = f"{clauses[i - 1]}, {c}"
        if not _EVENT.search(c):
            return None
        c = _LEAD.sub("", c)
        m = re.match(r"^(?:I|I've|I just|I'd)\s+", c)
        return c[m.end() :] if m and c.startswith("I") else c
    return None


def _dated_event(s: Speech) -> list[Fact]:
    """A first-person event with a date that resolves ("I went to a support group yesterday")."""
    if not s.at or not _EVENT.search(s.text) or "?" in s.text:
        return []
    if len(s.text.split()) > 40:
        return []
    clause = _event_clause(s.text.strip(), s.at)
    if clause is None or len(content_words(clause)) < 3 or len(clause.split()) > 20:
        return []
    clause = _you(clause, s.addressee)
    if _THIRD.search(clause) or _POINTED.search(clause):
        return []
    return [_fact("fact", s.speaker, clause, s)]


_POINTED = re.compile(
    r"\b(?:made|painted|bought|got|took|did|saw|read|wrote|built) (?:it|them|this|these)\b"
)


# every language -------------------------------------------------------------------------------

_SENTENCE = re.compile(r"(?<=[。！？!?])|(?<=[.])\s+|\n+")
_KANA_OR_HAN = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


def sentences(text: str) -> list[str]:
    return [p.strip() for p in _SENTENCE.split(text) if p and len(p.strip()) >= 2]


def facts_in_speech(s: Speech, lang: str = "en") -> list[Fact]:
    """The facts of one sentence (or message), in the language its script says."""
    if _KANA_OR_HAN.search(s.text):
        from kioku.facts_ja import japanese

        return japanese(s) if lang != "zh" else []
    return _english(s)


def addressees(entries: Sequence[LogEntry]) -> list[str]:
    """Whom each message speaks to: the last other author before it, else the next one."""
    authors = [e.message.author or e.message.role for e in entries]
    out = [""] * len(entries)
    last: dict[str, str] = {}
    previous = ""
    for i, a in enumerate(authors):
        out[i] = previous if previous and previous != a else last.get(a, "")
        if previous and previous != a:
            last[a] = previous
        previous = a
    following = ""
    for i in range(len(authors) - 1, -1, -1):
        if not out[i] and following and following != authors[i]:
            out[i] = following
        following = authors[i] if authors[i] != following else following
    return out


def facts_in(entries: Iterable[LogEntry], lang: str = "en") -> list[Fact]:
    """Every fact in these messages, each once per message, in message order."""
    es = [e for e in entries if e.message.role in ("user", "assistant")]
    out: list[Fact] = []
    opened = opened_by_earlier([(e.message.role, e.message.text) for e in es])
    for e, to, value in zip(es, addressees(es), opened, strict=True):
        who = (e.message.author or e.message.role).replace(":", " ")
        seen: set[tuple[str, str, str]] = set()
        # a secret is never a fact (`kioku.sensitive`)
        text = withheld(e.message.text, "", opened=value)
        # English patterns stop at punctuation themselves and follow "her" across sentences
        pieces = sentences(text) if _KANA_OR_HAN.search(text) else [text]
        for sent in pieces:
            for f in facts_in_speech(Speech(sent, who, to, e.message.at, e.seq), lang):
                key = (f.kind, f.subject.casefold(), f.text.casefold())
                if key not in seen:
                    seen.add(key)
                    out.append(f)
    return out
