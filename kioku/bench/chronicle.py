"""`kioku bench chronicle`: the LLM chronicler on fixed spans, against the extractive one.

A 1.5B model wrote memory that parsed and was false. This benchmark runs the chronicler as
`kioku summarize` does (`backlog.summarize_transcript`, the profile's chapter ranges) on fixed
spans — LoCoMo conversation 0 (its first 141 messages) and RealPersonaChat CP (its first 297),
or any `--span` — and reports, per chapter and in total:

- the share of the lines the model wrote that grounding kept, the lines dropped by reason,
  the lines replaced by their message's own words or added in the room the model left, and
  the chapters that fell back to the extractive chronicler; and the same over every reply
  the model wrote, the rejected ones too (`all_replies`);
- seconds per chapter, and tokens in and out;
- for LoCoMo, strict answer-in-context (`kioku.eval.answers`) for the questions whose evidence
  lies inside the span: the LLM chapters as stored, the model's own lines alone (without what
  was added verbatim: the ablation), the extractive chapters, and the span itself; and the
  questions on which the LLM and extractive memories differ (`differ`: a tie can hide a win
  and a loss);
- a re-check of every stored line by the grounding function (`stored_ungrounded`: 0 unless the
  chronicler let one through), and `samples`: stored lines of chapters and synopses, drawn
  at random, next to the message each cites, for a person to read.

`--replies` keeps what the model wrote and `--replay` plays it back (`kioku.reply_log`): a
change to grounding, choice or rendering measured on a live run's own replies, without the
model.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kioku.backlog import TranscriptMemory, summarize_transcript
from kioku.chronicle_prompt import record_lines
from kioku.datasets import Transcript, load
from kioku.eval.answers import match
from kioku.grounding.choice import item_text
from kioku.grounding.evidence import evidence_for, task_evidence
from kioku.grounding.records import ground_record
from kioku.messages import LogEntry
from kioku.profiles import Profile
from kioku.rendering import render_record
from kioku.structure import Record, is_structured, norm_text, record_from_data
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.tokens import TokenCounter
from kioku.transcript import render_transcript

KIND = "kioku.bench.chronicle/1"


@dataclass(frozen=True)
class Span:
    """A fixed span of a dataset: `locomo:0:141` (conversation 0, its first 141 messages) or
    `realpersonachat:CP:297` (speaker CP)."""

    fmt: str
    which: str
    messages: int

    @property
    def name(self) -> str:
        return f"{self.fmt}:{self.which}:{self.messages}"

    @classmethod
    def parse(cls, spec: str) -> Span:
        from kioku.errors import InputError

        parts = spec.split(":")
        if (
            len(parts) != 3
            or parts[0] not in ("locomo", "realpersonachat")
            or not parts[2].isdigit()
        ):
            raise InputError(
                f"--span takes locomo:<conversation>:<messages> or "
                f"realpersonachat:<speaker>:<messages>, not {spec!r}"
            )
        return cls(parts[0], parts[1], int(parts[2]))

    def load(self) -> Transcript:
        if self.fmt == "locomo":
            t = load(None, "locomo", conversation=int(self.which))
        else:
            t = load(None, "realpersonachat", speaker=self.which)
        return replace(t, messages=t.messages[: self.messages], meta=t.meta[: self.messages])


DEFAULT_SPANS = (Span("locomo", "0", 141), Span("realpersonachat", "CP", 297))


def _entries(t: Transcript) -> list[LogEntry]:
    return [LogEntry(seq=i, message=m) for i, m in enumerate(t.messages)]


def _model_only(data: Mapping[str, Any]) -> Record:
    """A stored record without what was added verbatim (replacements, fill)."""
    record = record_from_data(data)
    added = {(a["seq"], norm_text(a["text"])) for a in data.get("added", ())}

    def mine(items: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(it for it in items if (it.seq, norm_text(item_text(it))) not in added)

    return replace(
        record,
        events=mine(record.events),
        claims=mine(record.claims),
        user_facts=mine(record.user_facts),
        key_lines=mine(record.key_lines),
    )


def chapter_rows(result: TranscriptMemory) -> list[dict[str, Any]]:
    """Per chapter (and synopsis): what `kioku summarize --json` says of it, in figures."""
    rows = []
    for row in result.to_json()["summaries"]:
        g = row["grounding"] or {}
        model = not g.get("extractive")
        fallback = "fallback" in row["events"]
        rows.append(
            {
                "kind": row["kind"],
                "first_seq": row["first_seq"],
                "last_seq": row["last_seq"],
                "source": row["source"],
                "fallback": fallback,
                "requests": row["attempts"],
                "seconds": None if row["seconds"] is None else round(row["seconds"], 1),
                "tokens_in": row["input_tokens"] if row["source"] == "llm" or fallback else 0,
                "tokens_out": row["output_tokens"],
                "memory_tokens": row["tokens"],
                "lines": g.get("lines", 0) if model else 0,
                "grounded": g.get("grounded", 0) if model else 0,
                "grounded_share": g.get("share") if model else None,
                "dropped": g.get("dropped", {}),
                "replaced": g.get("replaced", 0),
                "filled": g.get("filled", 0),
                "attempts": [a.get("share") for a in g.get("attempts", ())],
                "all_replies": every_reply(g.get("attempts", ())),
                "events": dict(Counter(row["events"])),
            }
        )
    return rows


def every_reply(attempts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What grounding did to every reply the model wrote for a chapter, the rejected ones too
    (a fallback chapter stores none of the model's lines, but its drops are what it wrote)."""
    dropped: Counter[str] = Counter()
    for a in attempts:
        dropped.update(a.get("dropped", {}))
    return {
        "replies": len(attempts),
        "lines": sum(a.get("lines", 0) for a in attempts),
        "grounded": sum(a.get("grounded", 0) for a in attempts),
        "dropped": dict(dropped),
    }


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    lines = sum(r["lines"] for r in rows)
    kept = sum(r["grounded"] for r in rows)
    dropped: Counter[str] = Counter()
    every_dropped: Counter[str] = Counter()
    for r in rows:
        dropped.update(r["dropped"])
        every_dropped.update(r["all_replies"]["dropped"])
    return {
        "chapters": sum(1 for r in rows if r["kind"] != "synopsis"),
        "synopses": sum(1 for r in rows if r["kind"] == "synopsis"),
        "lines": lines,
        "grounded": kept,
        "grounded_share": round(kept / lines, 3) if lines else None,
        "dropped": dict(dropped),
        "replaced": sum(r["replaced"] for r in rows),
        "filled": sum(r["filled"] for r in rows),
        "fallbacks": sum(1 for r in rows if r["fallback"]),
        "requests": sum(r["requests"] for r in rows),
        "seconds": round(sum(r["seconds"] or 0 for r in rows), 1),
        "tokens_in": sum(r["tokens_in"] for r in rows),
        "tokens_out": sum(r["tokens_out"] for r in rows),
        "all_replies": {
            "replies": sum(r["all_replies"]["replies"] for r in rows),
            "lines": sum(r["all_replies"]["lines"] for r in rows),
            "grounded": sum(r["all_replies"]["grounded"] for r in rows),
            "dropped": dict(every_dropped),
        },
    }


def recheck(result: TranscriptMemory, t: Transcript) -> dict[str, Any]:
    """Every stored LLM line read again by the grounding function: what the chronicler kept
    must pass what kept it (a regression check, not the proof: `samples` is read by a person)."""
    entries = _entries(t)
    bad: list[dict[str, Any]] = []
    checked = 0
    known: dict[str, str] = {}  # threads memory already holds: a chapter may carry one on
    for task, s in result.summaries:
        if not is_structured(s.data):
            continue
        record = record_from_data(s.data)
        if s.source != "llm":
            known.update({th.id: th.title for th in record.threads})
            continue
        first, last = task.span
        # a synopsis is read against the chapters it folds, as the chronicler read it
        ev = (
            task_evidence(task)
            if task.kind == "synopsis"
            else evidence_for(
                entries[first : last + 1], lang=t.lang, user_name=t.user, character=t.character
            )
        )
        _, g = ground_record(record, ev, known)
        known.update({th.id: th.title for th in record.threads})
        checked += g.written
        bad += [{"first_seq": first, "text": d.text, "reason": d.reason} for d in g.dropped]
    return {"checked": checked, "ungrounded": len(bad), "lines": bad[:20]}


def samples(result: TranscriptMemory, t: Transcript, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` stored lines of the model's chapters and synopses, drawn at random, each next to
    the message it cites and marked `by` the model or by the span (a message's line, added
    verbatim)."""
    pool: list[tuple[str, int | None, str, str]] = []
    for task, s in result.summaries:
        if s.source != "llm" or not is_structured(s.data):
            continue
        mine = set(record_lines(_model_only(s.data), t.lang, t.user))
        for line in record_lines(record_from_data(s.data), t.lang, t.user):
            head = line.removeprefix("QUOTE ").split(" ", 1)[0].removeprefix("#")
            cited = int(head) if head.isdigit() else None
            pool.append((line, cited, "model" if line in mine else "span", task.kind))
    picked = random.Random(seed).sample(pool, min(n, len(pool)))
    out = []
    for line, cited, by, kind in picked:
        m = t.messages[cited] if cited is not None and 0 <= cited < len(t.messages) else None
        out.append(
            {
                "line": line,
                "by": by,
                "in": kind,
                "seq": cited,
                "source": f"{m.author}: {m.text}" if m is not None else None,
            }
        )
    return out


def answers(
    t: Transcript, llm: TranscriptMemory, extractive: TranscriptMemory, index: int
) -> dict[str, Any]:
    """Strict answer-in-context for the LoCoMo questions whose evidence lies in the span."""
    from kioku.eval.locomo import questions_of

    n = len(t.messages)
    qs = [q for q in questions_of(t, index) if q.evidence and max(q.evidence) < n]
    model_only = "\n\n".join(
        render_record(_model_only(s.data), t.lang)
        for task, s in llm.summaries
        if s.source == "llm" and is_structured(s.data) and task.kind != "synopsis"
    )
    contexts = {
        "llm": llm.text,
        "llm_model_lines_only": model_only,
        "extractive": extractive.text,
        "span": render_transcript(_entries(t), t.lang),
    }
    out: dict[str, Any] = {"questions": len(qs)}
    strict: dict[str, list[bool]] = {}
    for name, text in contexts.items():
        found = [match(q.answer, text, q.category) for q in qs]
        strict[name] = hits = [m.strict for m in found]
        out[name] = {
            "answer_in_context": round(sum(hits) / len(qs), 3) if qs else None,
            "found": sum(hits),
            "f1": round(sum(m.f1 for m in found) / len(qs), 3) if qs else None,
            "context_chars": len(text),
        }
    # where the totals come from: a tie can hide a win and a loss
    out["differ"] = [
        {
            "question": q.text,
            "answer": q.answer,
            "evidence": list(q.evidence),
            "llm": llm_found,
            "extractive": ext_found,
        }
        for q, llm_found, ext_found in zip(qs, strict["llm"], strict["extractive"], strict=True)
        if llm_found != ext_found
    ]
    return out


def run_span(
    span: Span,
    chronicler: Summarizer,
    counter: TokenCounter,
    profile: Profile,
    *,
    n_samples: int = 20,
    seed: int = 0,
    console: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    t = span.load()
    llm = summarize_transcript(t, chronicler, counter, profile, console=console, clock=clock)
    extractive = summarize_transcript(
        t, ExtractiveSummarizer(counter), counter, profile, console=console, clock=clock
    )
    rows = chapter_rows(llm)
    out: dict[str, Any] = {
        "span": span.name,
        "messages": len(t.messages),
        "lang": t.lang,
        "chapters": rows,
        "totals": totals(rows),
        "recheck": recheck(llm, t),
        "memory_tokens": {"llm": llm.memory.tokens, "extractive": extractive.memory.tokens},
        "samples": samples(llm, t, n_samples, seed),
    }
    if span.fmt == "locomo":
        out["answers"] = answers(t, llm, extractive, int(span.which))
    return out


def run(
    chronicler: Summarizer,
    counter: TokenCounter,
    profile: Profile,
    *,
    spans: Sequence[Span] = DEFAULT_SPANS,
    model: str = "",
    n_samples: int = 20,
    seed: int = 0,
    console: Any = None,
) -> dict[str, Any]:
    results = [
        run_span(s, chronicler, counter, profile, n_samples=n_samples, seed=seed, console=console)
        for s in spans
    ]
    rows = [r for res in results for r in res["chapters"]]
    with_answers = [r["answers"] for r in results if "answers" in r and r["answers"]["questions"]]
    floors = {
        "stored_ungrounded": sum(r["recheck"]["ungrounded"] for r in results),
        "llm_at_least_extractive": all(
            a["llm"]["found"] >= a["extractive"]["found"] for a in with_answers
        )
        if with_answers
        else None,
    }
    return {
        "kind": KIND,
        "model": model or "extractive",
        "profile": profile.name,
        "window": profile.window,
        "spans": results,
        "totals": totals(rows),
        "floors": floors,
    }
