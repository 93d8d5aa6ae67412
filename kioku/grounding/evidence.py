"""What grounding checks lines against (`check.Evidence`), built from what a task has.

A chapter or a cut is read against its own messages, each part as the chronicler's transcript
showed it (a relative date followed by the date it means), with the names memory already holds
and the prompt's own words. A synopsis restates memory and may add nothing: it is read against
the records it folds, seq by seq (their events, claims, user facts, key lines and extractive
lines, with who said each where the record knows). Notes are read against the messages they
were extracted from (`kioku.notes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kioku.chronicle_prompt import context_items, instructions
from kioku.grounding.check import (
    USER_WORDS,
    WORD_READER,
    Evidence,
    Judge,
    Piece,
    Source,
    same_person,
)
from kioku.grounding.terms import EMPTY_PROMPT, PromptText, name_key
from kioku.memory import MemoryItem
from kioku.messages import LogEntry
from kioku.prompts import resolve_lang
from kioku.relative_dates import resolve
from kioku.structure import merge_threads
from kioku.summarizer import SummaryTask


def sources_of(entries: Iterable[LogEntry], lang: str = "en") -> dict[int, Source]:
    """The evidence each message gives: its parts as the chronicler read them, with a
    relative date followed by the date it means (the transcript shows it so)."""
    out: dict[int, Source] = {}
    for e in entries:
        m = e.message
        author = m.author or m.role
        pieces = []
        for p in m.parts:
            if p.kind in ("image", "attachment"):
                pieces.append(Piece("image", author, p.name or ""))
                continue
            if not p.text.strip():
                continue
            kind = "tool" if p.kind in ("tool_call", "tool_result") else p.kind
            speaker = p.speaker or (author if kind != "narration" else "")
            dated = resolve(p.text, m.at, lang)
            pieces.append(Piece(kind, speaker, dated, p.text if dated != p.text else ""))
        day = m.at.date() if m.at else None
        out[e.seq] = Source(e.seq, author, m.role, tuple(pieces), day)
    return out


def evidence_for(
    entries: Sequence[LogEntry],
    *,
    lang: str = "en",
    user_name: str = "",
    character: str = "",
    memory_text: str = "",
    prompt: str = "",
    judge: Judge = WORD_READER,
) -> Evidence:
    """The evidence of a chapter or cut: the span's messages, the names memory holds, and the
    prompt's own text (whatever of it the conversation does not also say)."""
    sources = sources_of(entries, lang)
    users = tuple(
        n for n in {user_name, *(s.author for s in sources.values() if s.role == "user")} if n
    )
    chars = tuple(
        n for n in {character, *(s.author for s in sources.values() if s.role == "assistant")} if n
    )
    texts = [s.text for s in sources.values()]
    pt = (
        PromptText.of(prompt, texts + [memory_text], names=[*users, *chars])
        if prompt
        else EMPTY_PROMPT
    )
    return Evidence(sources, lang, users, chars, memory_text, pt, judge=judge)


def _role_of(name: str, users: Sequence[str]) -> str:
    k = name_key(name)
    return (
        "user"
        if k in USER_WORDS or any(same_person(k, name_key(u)) for u in users)
        else "assistant"
    )


def sources_of_items(
    items: Iterable[MemoryItem], user_names: Sequence[str] = ()
) -> dict[int, Source]:
    """The evidence a synopsis has: what the records it folds say at each seq (their lines,
    with who said them where the record knows). A synopsis may restate memory, never add."""
    from kioku.structure import is_structured, record_from_data
    from kioku.summarizer import Line

    at: dict[int, list[tuple[Piece, str, str]]] = {}  # seq -> (piece, author, role)

    def put(seq: int | None, piece: Piece, author: str = "", role: str = "memory") -> None:
        if seq is not None:
            at.setdefault(seq, []).append((piece, author, role))

    for item in items:
        data = item.data or {}
        if is_structured(data):
            r = record_from_data(data)
            for e in r.events:
                who = re.sub(r"\s*\([^)]*\)$", "", e.by)
                put(
                    e.seq,
                    Piece("narration", who, e.text),
                    who,
                    _role_of(who, user_names) if who else "memory",
                )
            for c in r.claims:
                put(
                    c.seq,
                    Piece("speech", c.speaker, c.claim),
                    c.speaker,
                    _role_of(c.speaker, user_names),
                )
                if c.actual:
                    put(c.seq, Piece("thought", c.speaker, c.actual))
            for f in r.user_facts:
                put(f.seq, Piece("text", f.by, f.fact), f.by, "user")
            for k in r.key_lines:
                put(
                    k.seq,
                    Piece("speech", k.speaker, k.text),
                    k.speaker,
                    _role_of(k.speaker, user_names),
                )
            continue
        rows = data.get("lines")
        lines = [Line.from_json(x) for x in rows] if isinstance(rows, list) else []
        if not lines:
            from kioku.summarizer import parse_lines as parse_extractive

            lines = parse_extractive(item.text)
        for ln in lines:
            sp = ln.speaker
            who = re.sub(r"\s*\([^)]*\)$", "", sp)
            kind = (
                "narration"
                if sp == "narration"
                else "thought"
                if sp.endswith("(thought)")
                else "speech"
            )
            author = "" if sp == "narration" else who
            put(
                ln.seq,
                Piece(kind, author, ln.text),
                author,
                _role_of(author, user_names) if author else "memory",
            )
    out: dict[int, Source] = {}
    for seq, rows in sorted(at.items()):
        authors = [a for _, a, _ in rows if a]
        roles = [r for _, _, r in rows if r != "memory"]
        out[seq] = Source(
            seq,
            authors[0] if authors else "",
            roles[0] if roles else "memory",
            tuple(p for p, _, _ in rows),
        )
    return out


def task_evidence(task: SummaryTask, judge: Judge = WORD_READER) -> Evidence:
    """What the task's lines are checked against: its messages (a chapter, a cut) or the
    records it folds (a synopsis), the names memory holds, and the prompt's own words; `judge`
    reads whether a line's content stands in them (`check.Judge`)."""
    lang = resolve_lang(task.lang)
    if task.kind != "synopsis":
        memory = "\n".join(i.text for i in context_items(task))
        return evidence_for(
            task.entries,
            lang=lang,
            user_name=task.user_name,
            character=task.character,
            memory_text=memory,
            prompt=instructions(task),
            judge=judge,
        )
    sources = sources_of_items(context_items(task), [task.user_name])
    sources.update(sources_of(task.entries, lang))
    users = (task.user_name,) if task.user_name else ()
    chars = (task.character,) if task.character else ()
    texts = [s.text for s in sources.values()]
    pt = PromptText.of(instructions(task), texts, names=[*users, *chars])
    return Evidence(sources, lang, users, chars, prompt=pt, span=task.span, judge=judge)


def known_threads(task: SummaryTask) -> dict[str, str]:
    return {t.id: t.title for t in merge_threads(context_items(task))}
