"""Summarize a whole transcript offline: the backlog folded into chapters and a synopsis.

The seed met this when a conversation kept raw on a 1M-token cloud model moved to a small local
summarizer: 150,000 chars had to be folded at once, so the backlog was cut into 32,000-char
pieces and folded as several chapters, oldest first. `summarize_transcript` does that for any
transcript (a dataset's conversation, a SillyTavern export, kioku JSONL): chapter-sized ranges of
`profile.summary_chunk` tokens, each summarized by the chronicler with the memory so far as
context, and a major GC into the synopsis whenever the chapters pass `profile.major_gc`. It backs
`kioku summarize` and lets a person read what a model would remember before going live.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kioku.chronicle_prompt import chapter_ranges
from kioku.chronicler import DEFAULT_CONFIG, ChroniclerConfig, LLMChronicler
from kioku.datasets import Transcript
from kioku.generations import item_from_summary
from kioku.memory import Memory, MemoryItem, render_memory
from kioku.messages import LogEntry
from kioku.models import ChatModel
from kioku.profiles import Profile
from kioku.summarizer import ExtractiveSummarizer, Summarizer, Summary, SummaryTask
from kioku.tokens import TokenCounter
from kioku.worth import usage_of


@dataclass(frozen=True)
class TranscriptMemory:
    memory: Memory
    text: str  # the memory exchange's user text, as a prompt would carry it
    summaries: tuple[tuple[SummaryTask, Summary], ...]  # every summary written, in order
    events: dict[str, int]  # how often each guard fired: refusal, retry, fallback, ...
    duration_s: float
    messages: int
    seconds: tuple[float, ...] = ()  # how long each summary took, in the order of `summaries`

    def to_json(self) -> dict[str, Any]:
        """Every chapter and synopsis written (with its range, source, requests, guard events
        and grounding), and the memory at the end, as `kioku summarize --json` prints it."""
        rows = []
        for n, (task, s) in enumerate(self.summaries):
            first, last = task.span
            rows.append(
                {
                    "kind": task.kind,
                    "first_seq": first,
                    "last_seq": last,
                    "source": s.source,
                    "model": s.model,
                    "prompt_version": s.prompt_version,
                    "tokens": s.tokens,
                    "input_tokens": s.input_tokens,
                    "output_tokens": _usage(s).get("completion_tokens", 0),
                    "attempts": s.attempts,
                    "seconds": round(self.seconds[n], 2) if n < len(self.seconds) else None,
                    "events": list(s.events),
                    "grounding": s.data.get("grounding"),
                    "text": s.text,
                    "data": dict(s.data),
                }
            )
        m = self.memory
        return {
            "messages": self.messages,
            "duration_s": round(self.duration_s, 2),
            "events": self.events,
            "summaries": rows,
            "memory": {
                "text": self.text,
                "tokens": m.tokens,
                "synopsis": _item_json(m.synopsis) if m.synopsis else None,
                "chapters": [_item_json(c) for c in m.chapters],
            },
        }


def _usage(s: Summary) -> dict[str, int]:
    u = s.data.get("usage") if isinstance(s.data, dict) else None
    return dict(u) if isinstance(u, dict) else {}


def _item_json(i: MemoryItem) -> dict[str, Any]:
    from kioku.grounding.records import grounded_share

    return {
        "kind": i.kind,
        "first_seq": i.first_seq,
        "last_seq": i.last_seq,
        "source": i.source,
        "tokens": i.tokens,
        "grounded_share": grounded_share(i),
        "text": i.text,
    }


def summarize_transcript(
    transcript: Transcript,
    model: ChatModel | Summarizer,
    counter: TokenCounter,
    profile: Profile,
    *,
    lang: str | None = None,
    limit: int | None = None,
    config: ChroniclerConfig = DEFAULT_CONFIG,
    fallback: Summarizer | None = None,
    avoid_phrases: tuple[str, ...] = (),
    console: Console | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TranscriptMemory:
    """Fold a transcript (its first `limit` messages) into memory, oldest first.

    `model` is a chat model (wrapped in `LLMChronicler` with the extractive fallback) or any
    `Summarizer`. Progress goes to `console` (stderr by default)."""
    lang = lang or transcript.lang
    summarizer: Summarizer
    if isinstance(model, Summarizer):
        summarizer = model
    else:
        summarizer = LLMChronicler(
            model, counter, fallback or ExtractiveSummarizer(counter), config=config
        )
    messages = transcript.messages[:limit] if limit else transcript.messages
    entries = [
        LogEntry(seq=i, message=m, tokens=counter.count(m.text)) for i, m in enumerate(messages)
    ]
    ranges = chapter_ranges(entries, profile, counter, lang)
    console = console or Console(stderr=True)
    started = clock()
    memory = Memory()
    written: list[tuple[SummaryTask, Summary]] = []
    seconds: list[float] = []
    events: Counter[str] = Counter()

    # what every task of this transcript shares; each one fills in its kind and input
    common = SummaryTask(
        kind="chapter",
        target_tokens=profile.chapter_tokens,
        ceiling_tokens=profile.summary_ceiling,
        window_tokens=profile.window,
        lang=lang,
        character=transcript.character,
        user_name=transcript.user,
        avoid_phrases=avoid_phrases,
        usage=usage_of(entries),  # the whole transcript is known: measure against it
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("chapters", total=len(ranges))
        for chunk in ranges:
            first, last = chunk[0].seq, chunk[-1].seq
            progress.update(bar, description=f"chapter #{first}–#{last}")
            task = replace(
                common, entries=tuple(chunk), previous=memory.synopsis, chapters=memory.chapters
            )
            began = clock()
            summary = summarizer.summarize(task)
            seconds.append(clock() - began)
            written.append((task, summary))
            events.update(summary.events)
            progress.console.print(_line("chapter", first, last, summary))
            memory = replace(memory, chapters=(*memory.chapters, _item(task, summary)))
            if sum(c.tokens for c in memory.chapters) > profile.major_gc:
                progress.update(bar, description=f"synopsis up to #{last}")
                began = clock()
                memory = _major_gc(
                    memory, summarizer, profile, common, written, events, progress.console
                )
                seconds.append(clock() - began)
            progress.advance(bar)
    text, _ack = render_memory(memory, lang)
    return TranscriptMemory(
        memory=memory,
        text=text,
        summaries=tuple(written),
        events=dict(events),
        duration_s=clock() - started,
        messages=len(entries),
        seconds=tuple(seconds),
    )


def _item(task: SummaryTask, summary: Summary) -> MemoryItem:
    return item_from_summary(task, summary, ready_at=0.0, status="active")


def _line(kind: str, first: int, last: int, s: Summary) -> str:
    counts = Counter(s.events)
    what = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in counts.items()) or "clean"
    g = s.data.get("grounding") if isinstance(s.data, dict) else None
    grounded = (
        f", {g['grounded']}/{g['lines']} lines grounded"
        if isinstance(g, dict) and not g.get("extractive")
        else ""
    )
    return (
        f"{kind} #{first}–#{last}: {s.tokens} tokens from {s.source} ({s.model or '?'}), "
        f"{s.attempts} request(s){grounded}, {what}"
    )


def _major_gc(
    memory: Memory,
    summarizer: Summarizer,
    profile: Profile,
    common: SummaryTask,
    written: list[tuple[SummaryTask, Summary]],
    events: Counter[str],
    console: Console,
) -> Memory:
    """Fold the older half of the chapters, with the previous synopsis, into a new synopsis."""
    n = max(1, len(memory.chapters) // 2)
    older, rest = memory.chapters[:n], memory.chapters[n:]
    task = replace(
        common,
        kind="synopsis",
        target_tokens=profile.synopsis_tokens,
        previous=memory.synopsis,
        chapters=older,
    )
    summary = summarizer.summarize(task)
    written.append((task, summary))
    events.update(summary.events)
    first, last = task.span
    console.print(_line("synopsis", first, last, summary))
    return Memory(synopsis=_item(task, summary), chapters=rest, notes=memory.notes)
