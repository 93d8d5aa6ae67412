"""The chronicler's requests: the task's prompt template filled in, and a record shown as lines.

Every word the model sees lives in `kioku/prompts/<lang>/<task>.txt`; this module only fills
the placeholders (who the user and the character are, the transcript or the records, the open
threads, how many lines, the retry note). A record is shown to the model in the same line form
the model answers in (`record_lines`), so a synopsis or a compression reads lines and writes
lines. `instructions` is the prompt without the conversation in it: the words grounding refuses
to find in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kioku.corrections import apply_edits, edits_of
from kioku.generations import chunks_within
from kioku.memory import MemoryItem
from kioku.messages import LogEntry
from kioku.models import ChatMessage, ChatRequest
from kioku.profiles import Profile
from kioku.prompts import PromptTemplate, resolve_lang, template
from kioku.rendering import render_record, render_threads
from kioku.structure import Record, Thread, is_structured, merge_threads, record_from_data
from kioku.summarizer import SummaryTask
from kioku.summarizer import parse_lines as parse_extractive
from kioku.tokens import TokenCounter
from kioku.transcript import labels_for, render_entry, render_transcript

# What one fact line is given of the token target, per language (a chronicler's lines are
# ~20 tokens in English, ~28 in Japanese): a target becomes "the N most important facts", which
# a model can count. Fewer than fit: asked for more lines than its room holds, a model loops;
# asked for fewer, it writes that many (docs/chronicler.md). The room left is filled with the span's own lines.
LINE_TOKENS = {"en": 32, "ja": 40, "zh": 38}
MIN_LINES, MAX_LINES = 4, 40
UNNAMED = {"en": "(unnamed)", "ja": "(名前なし)", "zh": "(未命名)"}
QUOTES = {"en": ('"', '"', ", "), "ja": ("「", "」", "、"), "zh": ("“", "”", "、")}
NARRATION = {"en": "narration", "ja": "地の文", "zh": "旁白"}


def max_lines(target_tokens: int, lang: str) -> int:
    n = round(target_tokens / LINE_TOKENS[resolve_lang(lang)])
    return max(MIN_LINES, min(MAX_LINES, n))


def context_items(task: SummaryTask) -> list[MemoryItem]:
    """The memory the record continues: for a chapter or cut, the current synopsis and chapters
    (their open threads are offered so the model reuses the ids); for a synopsis, what it folds."""
    return ([task.previous] if task.previous else []) + list(task.chapters)


def record_lines(record: Record, lang: str, user_name: str = "user") -> list[str]:
    """A record in the reply's line form, in story order (what a compression or a synopsis
    reads, and answers in)."""
    rows: list[tuple[int, str]] = []
    for e in record.events:
        rows.append((e.seq or 0, f"#{e.seq} {e.by or NARRATION[resolve_lang(lang)]}: {e.text}"))
    for c in record.claims:
        rows.append((c.seq or 0, f"#{c.seq} {c.speaker}: {c.claim}"))
    for f in record.user_facts:
        rows.append((f.seq or 0, f"#{f.seq} {f.by or user_name}: {f.fact}"))
    opening, closing, _ = QUOTES[resolve_lang(lang)]
    for k in record.key_lines:
        rows.append((k.seq, f"QUOTE #{k.seq} {k.speaker}: {opening}{k.text}{closing}"))
    out = [text for _, text in sorted(rows, key=lambda r: r[0]) if not text.startswith("#None")]
    for t in record.threads:
        if t.status == "open":
            out.append(f"OPEN {t.id}: {t.title}")
        else:
            out.append(
                f"DONE {t.id}" + (f" #{t.seq}" if t.seq is not None else "") + f": {t.title}"
            )
    return out


def item_lines(item: MemoryItem, lang: str, user_name: str = "user") -> str:
    """One memory item as the synopsis prompt shows it: its range, then its lines."""
    if is_structured(item.data):
        record = record_from_data(item.data)
        body = "\n".join(record_lines(record, lang, user_name))
        if item.data.get("operator_edits"):
            body = apply_edits(render_record(record, lang), edits_of(item))
    else:
        body = (
            "\n".join(f"#{ln.seq} {ln.speaker}: {ln.text}" for ln in parse_extractive(item.text))
            or item.text
        )
    return f"[#{item.first_seq}–#{item.last_seq}]\n{body.strip()}"


def _phrases(phrases: Sequence[str], lang: str) -> str:
    o, c, sep = QUOTES[resolve_lang(lang)]
    return sep.join(f"{o}{p}{c}" for p in phrases if p.strip())


def _open_threads(threads: Sequence[Thread], tpl: PromptTemplate, lang: str) -> str:
    open_ = [t for t in threads if t.status == "open"]
    return render_threads(open_, lang) if open_ else tpl.render("none")


def _common(task: SummaryTask, tpl: PromptTemplate) -> dict[str, Any]:
    lang = tpl.lang
    first, last = task.span
    return {
        "user_name": task.user_name or "user",
        "character": task.character or UNNAMED[lang],
        "max_lines": max_lines(task.target_tokens, lang),
        "avoid": tpl.render("avoid", phrases=_phrases(task.avoid_phrases, lang))
        if any(p.strip() for p in task.avoid_phrases)
        else "",
        "first": first,
        "last": last,
    }


def _messages(
    tpl: PromptTemplate, values: dict[str, Any], system_role: bool
) -> tuple[ChatMessage, ...]:
    system = tpl.render("system", **values)
    user = tpl.render("user", **values)
    if system_role:
        return (ChatMessage("system", system), ChatMessage("user", user))
    return (ChatMessage("user", f"{system}\n\n{user}"),)


def _values(task: SummaryTask, tpl: PromptTemplate, retry_reason: str | None) -> dict[str, Any]:
    values = _common(task, tpl)
    values["open_threads"] = _open_threads(merge_threads(context_items(task)), tpl, tpl.lang)
    values["retry"] = tpl.render("retry", reason=retry_reason) if retry_reason else ""
    if task.kind == "synopsis":
        values["records"] = "\n\n".join(
            item_lines(i, tpl.lang, task.user_name) for i in context_items(task)
        )
        if task.entries:  # a rolling rewrite folds new messages in too
            values["records"] += "\n\n" + render_transcript(task.entries, tpl.lang)
    else:
        values["transcript"] = render_transcript(task.entries, tpl.lang, numbered=False)
    return values


def build_request(
    task: SummaryTask,
    max_tokens: int,
    *,
    temperature: float | None = None,
    system_role: bool = True,
    retry_reason: str | None = None,
) -> tuple[ChatRequest, str]:
    """The request for the task's own prompt (chapter, cut or synopsis) and its prompt version."""
    tpl = template(task.kind, task.lang)
    request = ChatRequest(
        messages=_messages(tpl, _values(task, tpl, retry_reason), system_role),
        max_tokens=max_tokens,
        temperature=temperature,
        purpose=task.kind,
        seqs=tuple(e.seq for e in task.entries if not e.message.is_empty()),
    )
    return request, tpl.version


def build_compress_request(
    task: SummaryTask,
    record: Record,
    max_tokens: int,
    *,
    temperature: float | None = None,
    system_role: bool = True,
    retry_reason: str | None = None,
) -> tuple[ChatRequest, str]:
    tpl = template("compress", task.lang)
    lines = record_lines(record, tpl.lang, task.user_name)
    values = _common(task, tpl)
    values["lines"] = len(lines)
    values["max_lines"] = max(MIN_LINES, min(values["max_lines"], len(lines) * 2 // 3))
    values["record"] = "\n".join(lines)
    values["retry"] = tpl.render("retry", reason=retry_reason) if retry_reason else ""
    request = ChatRequest(
        messages=_messages(tpl, values, system_role),
        max_tokens=max_tokens,
        temperature=temperature,
        purpose=task.kind,
    )
    return request, tpl.version


def instructions(task: SummaryTask) -> str:
    """The task's prompt with no conversation in it (no transcript, records or threads):
    what the model was told, which memory must never repeat."""
    out = []
    for kind in (task.kind, "compress"):
        tpl = template(kind, task.lang)
        values: dict[str, Any] = {**_common(task, tpl), "open_threads": "", "retry": ""}
        values.update(transcript="", records="", record="", lines="")
        out += [tpl.render("system", **values), tpl.render("user", **values)]
        out += [tpl.render(s, reason="", phrases="") for s in ("retry",) if tpl.has(s)]
    return "\n".join(out)


def entry_cost(entry: LogEntry, counter: TokenCounter, lang: str) -> int:
    """Tokens one message takes in the chronicler's transcript (header, labels, separator)."""
    if entry.message.is_empty():
        return 0
    # as most messages show: the time alone (the full date only opens a new day, a few tokens)
    return (
        counter.count(render_entry(entry, labels_for(lang), entry.message.at, numbered=False)) + 2
    )


def chunk_budget(profile: Profile, counter: TokenCounter, lang: str) -> int | None:
    """Transcript tokens a chapter may hold so that its whole rendered prompt (instructions,
    open threads, transcript) stays within `profile.summary_prompt` (None: no such bound)."""
    if profile.summary_prompt is None:
        return None
    tpl = template("chapter", lang)
    values: dict[str, Any] = {
        "user_name": "user",
        "character": UNNAMED[tpl.lang],
        "max_lines": MAX_LINES,
        "avoid": "",
        "first": 0,
        "last": 0,
        "open_threads": tpl.render("none"),
        "retry": "",
        "transcript": "",
    }
    frame = sum(counter.count(tpl.render(s, **values)) for s in ("system", "user"))
    threads_room = 120  # open threads carried from memory
    return max(256, profile.summary_prompt - frame - threads_room)


def chapter_ranges(
    entries: Sequence[LogEntry], profile: Profile, counter: TokenCounter, lang: str
) -> list[list[LogEntry]]:
    """A backlog cut into chapters of at most `profile.summary_chunk` message tokens whose
    rendered prompts fit `profile.summary_prompt`."""
    bounds: list[tuple[int, Callable[[LogEntry], int]]] = [
        (profile.summary_chunk, lambda e: e.tokens)
    ]
    budget = chunk_budget(profile, counter, lang)
    if budget is not None:
        bounds.append((budget, lambda e: entry_cost(e, counter, lang)))
    return chunks_within(entries, bounds)
