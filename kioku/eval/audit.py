"""`kioku eval audit`: read the memory against the conversation it came from.

Seed 000 §4: 44 of 57 production chapters said "established fact" about what a lying character
had only claimed; resolved threads stayed open (10 → 11 after a prompt fix). A recall number does
not show either, so the audit counts them, per memory item, against the item's source range —
and says "n/a" where the memory has nothing of the kind to judge, never a clean zero:

- claims written as facts, on an LLM chapter's structured data: claims without a speaker, and
  events that restate a character's speech line without attribution (and without narration or a
  thought that bears it out). Memory written without a model quotes lines instead of stating
  claims; its lines are checked as quotes: each must be "[seq] Speaker: text", the text must be
  in message `seq`, and the speaker must be the one who said it (speech shown as narration is a
  claim turned into fact).
- resolved threads left open: a thread some item resolved (a later chapter, even one folded away
  since) that the memory as rendered still shows open; and, without a model, questions and
  promises quoted in memory whose answer or keeping the log has and memory lost
  (`kioku.eval.threads`).
- notes: each note in force, checked for questions, fragments, lost referents, unclear owners,
  crowding and its source (`kioku.eval.notecheck`).
- verbal tics in memory: phrases `kioku.tics.detect_tics` finds across the source replies, then
  searched in the memory text. Dataset markup in brackets (LoCoMo's "[shares a photo: a …]") is
  not the character's voice and is left out of both.
- memory worth its tokens: lines memory holds twice (their text folded alike,
  `kioku.worth.said_key`), and habits in memory, lines the conversation says word for word
  `kioku.worth.HABIT_TIMES` times or more (`worth`).
- attribution phrases ("said", "told", "claimed", 「と言った」「と語った」「主張」…) and fact phrases
  ("established fact", 「確定した事実」…), counted in the memory text.
- grounding: every line of an LLM item read against the messages it cites by the same check
  the chronicler runs before storing (`kioku.grounding`): the share grounded, the lines that
  are not and why (a name not in the conversation, the wrong author, content the message does
  not hold), and an item mostly ungrounded counted as invented (`invented_items`). Memory a
  small model invented scores as invented here, whatever its claims look like.

With a model, each chapter is also read by the model against its source (`qa.audit_item`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kioku.errors import KiokuError, ModelError, NotFound
from kioku.memory import HEADERS, Memory, MemoryItem, render_memory
from kioku.messages import LogEntry
from kioku.models import ChatModel
from kioku.store import Store
from kioku.structure import is_structured
from kioku.summarizer import attributed_lines, parse_lines, stored_lines
from kioku.tics import detect_tics
from kioku.transcript import render_transcript
from kioku.worth import HABIT_TIMES, said_key, usage_of

from . import qa
from .notecheck import check_notes
from .report import pins
from .threads import check_threads

KIND = "kioku.eval.audit/1"
TIC_WINDOW = 20
ATTRIBUTION = re.compile(
    r"\b(?:said|says|told|tells|claimed|claims|insisted|admitted|according to|asked|replied)\b"
    r"|と言った|と言って|と語った|と話した|主張|によると|と答えた|と打ち明けた|说|声称|表示",
    re.IGNORECASE,
)
FACT_PHRASES = re.compile(
    r"established fact|confirmed fact|it is a fact|確定した事実|確定事項|事実として|已确认的事实",
    re.IGNORECASE,
)
NA = "n/a"  # nothing of the kind in memory to judge
_MARKUP = re.compile(r"\[[^\]]*\]")  # dataset markup: "[shares a photo: a …]"
_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]+|\d+")
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]+")
RESOLVED = frozenset(["resolved", "closed", "done", "settled"])
_STOP = frozenset(
    [
        "the",
        "a",
        "an",
        "and",
        "or",
        "but",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "with",
        "is",
        "was",
        "are",
        "were",
        "be",
        "been",
        "it",
        "this",
        "that",
        "i",
        "you",
        "he",
        "she",
        "we",
        "they",
        "my",
        "your",
        "his",
        "her",
        "our",
        "their",
        "me",
        "him",
        "them",
        "so",
        "not",
        "no",
        "yes",
        "just",
    ]
)


def content_terms(text: str) -> set[str]:
    """Words (Latin) and character bigrams (CJK) that carry content."""
    terms = {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP}
    for run in _CJK_RUN.findall(text):
        terms.update(run[i : i + 2] for i in range(len(run) - 1))
    return terms


def _restates(event: str, line: str) -> bool:
    ev, sp = content_terms(event), content_terms(line)
    if len(sp) < 3:
        return False
    shared = ev & sp
    return len(shared) >= 3 and len(shared) >= 0.6 * len(sp)


def check_extractive(item: MemoryItem, entries: Sequence[LogEntry]) -> dict[str, Any]:
    truth = attributed_lines(entries)
    by_seq: dict[int, list[tuple[str, str]]] = {}
    for ln in truth:
        by_seq.setdefault(ln.seq, []).append((ln.speaker, ln.text))
    lines = [x for x in item.text.splitlines() if x.strip()]
    parsed = parse_lines(item.text)
    out = {
        "lines": len(lines),
        "unattributed_lines": len(lines) - len(parsed),
        "misattributed": 0,
        "not_in_source": 0,
        "narrated_speech": 0,
    }
    for ln in parsed:
        cands = by_seq.get(ln.seq, [])
        text = ln.text.rstrip("…")
        match = [sp for sp, t in cands if t == ln.text or (text and t.startswith(text))]
        if not match:
            out["not_in_source"] += 1
        elif ln.speaker not in match:
            out["misattributed"] += 1
            if ln.speaker == "narration" or ln.speaker.endswith("(thought)"):
                out["narrated_speech"] += 1  # speech shown as what happened
    return out


def _rows(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    rows = data.get(key) or []
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def check_structured(item: MemoryItem, entries: Sequence[LogEntry], user: str) -> dict[str, Any]:
    """Read the stored data as it is (not through `record_from_data`, which would refuse the
    very defects the audit counts, such as a claim with no speaker)."""
    claims = _rows(item.data, "claims")
    events = [str(e.get("text", "")) for e in _rows(item.data, "events")]
    speech: list[tuple[str, str]] = []
    support: list[str] = []
    for e in entries:
        for p in e.message.parts:
            who = p.speaker or e.message.author
            if p.kind == "speech" and e.role != "user" and who != user:
                speech.append((who, p.text))
            elif p.kind in ("narration", "thought"):
                support.append(p.text)
    unattributed = [c for c in claims if not str(c.get("speaker") or "").strip()]
    restating = []
    for ev in events:
        for who, line in speech:
            if not _restates(ev, line):
                continue
            if ATTRIBUTION.search(ev):
                continue  # attributed in the sentence itself
            if any(_restates(ev, s) for s in support):
                continue  # narration or a thought bears it out
            restating.append({"event": ev, "speaker": who, "speech": line})
            break
    return {
        "claims": len(claims),
        "claims_unattributed": len(unattributed),
        "claims_unsupported": sum(1 for c in claims if c.get("supported_by", "none") == "none"),
        "events": len(events),
        "events_restating_speech": len(restating),
        "restating": restating,
        "claims_as_fact": len(unattributed) + len(restating),
    }


def check_grounding(
    item: MemoryItem,
    entries: Sequence[LogEntry],
    *,
    lang: str,
    user: str,
    character: str,
    before: str = "",
) -> dict[str, Any]:
    """The chronicler's own grounding check (`kioku.grounding`), run on what is stored: how
    many of the item's lines the messages they cite bear out, and why the others fail. Names
    are known from the item's range and the conversation before it (`before`), never from
    other memory (an invented name copied from chapter to chapter is still invented). An item
    with less than `grounded.MIN_SHARE` of its lines grounded is counted as invented."""
    from kioku.grounding.evidence import evidence_for
    from kioku.grounding.records import MIN_SHARE, ground_record
    from kioku.structure import record_from_data

    ev = evidence_for(entries, lang=lang, user_name=user, character=character, memory_text=before)
    try:
        record = record_from_data(item.data)
    except (KiokuError, ValueError, TypeError, KeyError):
        return {"grounding": None, "invented": None}
    _, g = ground_record(record, ev)
    return {
        "grounding": g.to_json(),
        "ungrounded_lines": len([d for d in g.dropped if d.reason != "empty"]),
        "ungrounded": [
            {"where": d.where, "text": d.text, "reason": d.reason, "detail": d.detail}
            for d in g.dropped
            if d.reason != "empty"
        ],
        "invented": g.share < MIN_SHARE,
    }


def tic_phrases(replies: Sequence[str], window: int = TIC_WINDOW) -> list[str]:
    """Every phrase the tic guard would have flagged at some point of the conversation."""
    found: dict[str, None] = {}
    step = max(1, window // 2)
    for end in range(window, len(replies) + step, step):
        for a in detect_tics(replies[max(0, end - window) : end], window=window):
            found.setdefault(a.phrase, None)
    return list(found)


def _core(phrase: str) -> str:
    return re.sub(r"^[\W_]+|[\W_]+$", "", phrase.casefold())


def count_phrases(text: str, phrases: Iterable[str]) -> dict[str, int]:
    folded = text.casefold()
    out = {}
    for p in phrases:
        core = _core(p)
        if core:
            out[p] = folded.count(core)
    return out


def audit_store(
    store: Store,
    conversation_id: str,
    *,
    model: ChatModel | None = None,
    tenant: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    info = store.conversation(conversation_id, tenant=tenant)
    items = store.items(conversation_id, "active", "retired", "ready")
    if not items:
        raise NotFound(f"conversation {conversation_id!r} has no memory yet: nothing to audit")
    active = [i for i in items if i.status == "active"]
    synopsis = next((i for i in active if i.kind == "synopsis"), None)
    memory = Memory(
        synopsis=synopsis,
        chapters=tuple(i for i in active if i.kind == "chapter"),
        notes=store.notes_snapshot(conversation_id),
    )
    lang = _lang(store, conversation_id)
    try:
        memory_text = render_memory(memory, lang)[0] if not memory.is_empty() else ""
    except (KiokuError, ValueError):  # data the renderer refuses: audit the texts as stored
        memory_text = "\n\n".join(i.text for i in memory.items)
    # the header's own caveat ("records of what they said") is not attribution by the chronicler
    header = HEADERS.get(lang, HEADERS["en"])
    for k in ("intro", "caveat"):
        memory_text = memory_text.replace(header[k], "")
    user = _user_name(store, conversation_id)

    rows = []
    for item in sorted(items, key=lambda i: (i.first_seq, i.kind != "synopsis", i.id or 0)):
        entries = store.entries(conversation_id, item.first_seq, item.last_seq)
        row: dict[str, Any] = {
            "id": item.id,
            "kind": item.kind,
            "status": item.status,
            "first_seq": item.first_seq,
            "last_seq": item.last_seq,
            "source": item.source,
            "tokens": item.tokens,
            "chars": len(item.text),
            "attribution_phrases": len(ATTRIBUTION.findall(item.text)),
            "fact_phrases": len(FACT_PHRASES.findall(item.text)),
        }
        if is_structured(item.data):
            row.update(check_structured(item, entries, user))
            before = "\n".join(
                e.text for e in store.entries(conversation_id, 0, item.first_seq - 1)
            )
            row.update(
                check_grounding(
                    item, entries, lang=lang, user=user, character=info.character, before=before
                )
            )
        else:
            row.update(check_extractive(item, entries))
            bad = row["not_in_source"] + row["misattributed"]
            row["ungrounded_lines"] = bad
            row["invented"] = False
            row["grounding"] = {
                "lines": row["lines"],
                "grounded": row["lines"] - bad,
                "share": round(1 - bad / row["lines"], 3) if row["lines"] else 1.0,
            }
        if model is not None and item.kind == "chapter":
            try:
                asked = qa.audit_item(
                    model,
                    render_transcript(entries, lang),
                    item.text,
                    first=item.first_seq,
                    last=item.last_seq,
                    user=user,
                    character=info.character,
                )
                row["llm"] = asked.value
            except ModelError as e:
                row["llm_error"] = f"{type(e).__name__}: {e}"
                if log:
                    log(f"item {item.id}: {row['llm_error']}")
        rows.append(row)

    threads = _threads(items, active)
    log_entries = store.entries(conversation_id)
    loose = check_threads(log_entries, memory_text, content_terms)
    by_seq = {e.seq: e for e in log_entries}
    notes = check_notes(_notes_in_force(store, conversation_id), by_seq.get, content_terms)
    replies = [_MARKUP.sub(" ", e.text) for e in log_entries if e.role == "assistant"]
    # a reply opening on the speaker's name ("Mina wiped the counter") is narration, not a tic
    names = {_core(e.message.author) for e in log_entries if e.message.author}
    phrases = [p for p in tic_phrases(replies) if _core(p) not in names]
    in_memory = count_phrases(_MARKUP.sub(" ", memory_text), phrases)
    current = [r for r in rows if r["status"] == "active"]
    worth = worth_in_memory([i for i in active if i.kind in ("synopsis", "chapter")], log_entries)
    totals: dict[str, Any] = {
        "items": len(rows),
        "active_items": len(current),
        **_claims(rows, current),
        **_grounded(rows, current),
        "resolved_left_open": len(threads["resolved_left_open"]) if threads["tracked"] else NA,
        "quoted_threads": loose["judged"] or NA,
        "quoted_threads_resolved_left_open": loose["resolved_left_open"] if loose["judged"] else NA,
        **notes["totals"],
        "tic_phrases_found": len(phrases),
        "tic_phrases_in_memory": sum(1 for v in in_memory.values() if v),
        "tic_occurrences_in_memory": sum(in_memory.values()),
        **{k: len(v) for k, v in worth.items()},
        "attribution_phrases_in_memory": len(ATTRIBUTION.findall(memory_text)),
        "fact_phrases_in_memory": len(FACT_PHRASES.findall(memory_text)),
    }
    if model is not None:
        totals["llm_claims_as_fact"] = sum(
            len(r.get("llm", {}).get("claims_as_fact", [])) for r in rows
        )
        totals["llm_resolved_left_open"] = sum(
            len(r.get("llm", {}).get("resolved_left_open", [])) for r in rows
        )
        totals["llm_errors"] = sum(1 for r in rows if "llm_error" in r)
    return {
        "kind": KIND,
        "conversation": conversation_id,
        "messages": info.next_seq,
        "memory_tokens": memory.tokens,
        "memory_chars": len(memory_text),
        "items": rows,
        "threads": threads,
        "quoted_threads": loose,
        "notes": notes["notes"],
        "notes_crowding": notes["crowding"],
        "tics": {"phrases": phrases, "in_memory": in_memory},
        "worth": worth,
        "totals": totals,
        "pins": pins(models={"audit": qa.model_name(model) if model else None}),
    }


def worth_in_memory(items: Sequence[MemoryItem], entries: Sequence[LogEntry]) -> dict[str, list]:
    """The lines of `items` memory holds more than once, and those the conversation says word
    for word `HABIT_TIMES` times or more: each costs tokens and tells nothing new."""
    usage = usage_of(entries)
    texts = [ln.text for item in items for ln in stored_lines(item)]
    held = Counter(k for k in map(said_key, texts) if k)
    return {
        # one text per line, however it was written each time
        "lines_in_memory_twice": sorted(
            {said_key(t): t for t in texts if held[said_key(t)] > 1}.values()
        ),
        "habit_lines_in_memory": sorted({t for t in texts if usage.times(t) >= HABIT_TIMES}),
    }


def _claims(rows: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> dict:
    """Claims as fact where there are claims (structured items); quote checks where memory
    quotes lines (extractive items); "n/a" for a kind the memory does not have."""
    structured = [r for r in rows if "claims" in r]
    quoted = [r for r in rows if "lines" in r]
    out: dict[str, Any] = {}
    if structured:
        out["claims_as_fact"] = sum(r["claims_as_fact"] for r in structured)
        out["claims_as_fact_in_memory"] = sum(r["claims_as_fact"] for r in current if "claims" in r)
    else:
        out["claims_as_fact"] = out["claims_as_fact_in_memory"] = NA
    for key, field in (
        ("quotes_unattributed", "unattributed_lines"),
        ("quotes_misattributed", "misattributed"),
        ("quotes_narrated_speech", "narrated_speech"),
        ("quotes_not_in_source", "not_in_source"),
    ):
        out[key] = sum(r[field] for r in quoted) if quoted else NA
    return out


def _grounded(rows: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> dict:
    """Lines the messages they cite bear out, over every item and over memory as shown."""

    def share(rs: Sequence[Mapping[str, Any]]) -> float | str:
        lines = sum((r.get("grounding") or {}).get("lines", 0) for r in rs)
        kept = sum((r.get("grounding") or {}).get("grounded", 0) for r in rs)
        return round(kept / lines, 3) if lines else NA

    reasons: Counter[str] = Counter()
    for r in rows:
        reasons.update(u["reason"] for u in r.get("ungrounded", ()))
    return {
        "grounded_share": share(rows),
        "grounded_share_in_memory": share(current),
        "ungrounded_lines": sum(r.get("ungrounded_lines", 0) for r in rows),
        "ungrounded_by_reason": dict(reasons),
        "invented_items": sum(1 for r in rows if r.get("invented")),
        "invented_items_in_memory": sum(1 for r in current if r.get("invented")),
    }


def _notes_in_force(store: Store, conversation_id: str) -> list[Any]:
    from kioku.notes import notes

    return notes(store, conversation_id)


def _notes(item: MemoryItem) -> list[tuple[str, str, str, int]]:
    """(id, title, status, seq) of an item's thread notes, read leniently from its data."""
    out = []
    for t in _rows(item.data, "threads"):
        tid = str(t.get("id") or "").strip()
        status = "resolved" if str(t.get("status", "")).lower() in RESOLVED else "open"
        seq = t.get("seq")
        if tid:
            out.append(
                (
                    tid,
                    str(t.get("title") or tid),
                    status,
                    seq if isinstance(seq, int) else item.last_seq,
                )
            )
    return out


def merged_threads(items: Iterable[MemoryItem]) -> dict[str, tuple[str, str, int]]:
    """The threads' state across items, as `structure.merge_threads` decides it: the later seq
    wins, and at the same seq "resolved" wins. id -> (title, status, seq)."""
    state: dict[str, tuple[str, str, int]] = {}
    for item in items:
        for tid, title, status, seq in _notes(item):
            cur = state.get(tid)
            if cur is None or seq > cur[2] or (seq == cur[2] and cur[1] != "resolved"):
                state[tid] = (cur[0] if cur else title, status, seq)
    return state


def _threads(items: Sequence[MemoryItem], active: Sequence[MemoryItem]) -> dict[str, Any]:
    if not any(is_structured(i.data) for i in items):
        return {"tracked": False, "open": 0, "resolved": 0, "resolved_left_open": []}
    ordered = sorted(items, key=lambda i: (i.last_seq, i.first_seq))
    ever = merged_threads(ordered)
    shown = merged_threads(sorted(active, key=lambda i: (i.last_seq, i.first_seq)))
    left = [
        {"id": tid, "title": title, "resolved_at": ever[tid][2]}
        for tid, (title, status, _) in shown.items()
        if status == "open" and ever[tid][1] == "resolved"
    ]
    return {
        "tracked": True,
        "open": sum(1 for _, st, _ in shown.values() if st == "open"),
        "resolved": sum(1 for _, st, _ in shown.values() if st == "resolved"),
        "resolved_left_open": left,
    }


def _lang(store: Store, conversation_id: str) -> str:
    from kioku.lang import detect_lang

    sample = [e.text for e in store.entries(conversation_id, 0, 30)]
    return detect_lang(sample) if sample else "en"


def _user_name(store: Store, conversation_id: str) -> str:
    first = next((e for e in store.entries(conversation_id, 0, 50) if e.role == "user"), None)
    return first.message.author if first and first.message.author else "user"
