"""`kioku eval locomo`: an LLM-free forgetting proxy on LoCoMo — is the answer in the context at all?

Each conversation is replayed through each strategy at one prompt budget (the local-64k profile
scaled to that window, made feasible by `strategies.fit_profile`), with the extractive chronicler
unless a model is given. Every question of categories 1–4 is then asked at the END of the
conversation, and the context that strategy would send for it (memory + raw window + the
recollection found for the question; the question itself excluded) is searched for every
normalized token of the gold answer. A strategy cannot answer what is not in its prompt, so this
rate bounds its QA accuracy from above without any model in the loop; `full` bounds the proxy
itself (LoCoMo's answers are often not verbatim).

Rates are reported overall, by category and by the age of the evidence (sessions between the
newest evidence turn and the last session), on conversations 0–4 (dev: the only ones any number
was tuned on) and 5–9 (held out) separately. With a model, each strategy also answers from its
context (F1 as in the LoCoMo paper) and, with a judge model, is graded.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from kioku.counters import counter_from_spec
from kioku.datasets import default_path, load_locomo
from kioku.errors import ContextOverflow, InputError, ModelError
from kioku.models import ChatModel
from kioku.profiles import get_profile
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.tokens import TokenCounter

from . import qa
from .answers import answer_in_context, locomo_f1, mean
from .report import chronicler_prompts, file_digest, pins
from .strategies import STRATEGIES, check_strategies, close_all, fit_profile, progress_bar, replay

KIND = "kioku.eval.locomo/1"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
AGE_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (0, 2),
    (3, 5),
    (6, 9),
    (10, 14),
    (15, 19),
    (20, None),
)
OLD_AGE = 10  # "old" evidence: this many sessions or more before the end
DEV = range(0, 5)
DEFAULT_BUDGET = 4096
DEFAULT_TOKENIZER = "qwen2.5"
_SESSION = re.compile(r"D(\d+)\s*:")


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


BUCKET_LABELS = tuple(bucket_label(lo, hi) for lo, hi in AGE_BUCKETS)


def age_bucket(age: int) -> str:
    for (lo, hi), label in zip(AGE_BUCKETS, BUCKET_LABELS, strict=True):
        if age >= lo and (hi is None or age <= hi):
            return label
    raise ValueError(f"negative age {age}")


def evidence_age(evidence: Iterable[str], last_session: int) -> int | None:
    """Sessions between the newest evidence turn and the last session (None: no evidence)."""
    sessions = [int(m.group(1)) for e in evidence for m in _SESSION.finditer(str(e))]
    return last_session - max(sessions) if sessions else None


@dataclass(frozen=True)
class Row:
    """One question asked of one strategy's context."""

    conversation: int
    split: str
    strategy: str
    category: int
    age: int | None
    hit: bool
    tokens: int
    f1: float | None = None
    correct: bool | None = None
    error: str = ""


def summarize_rows(rows: Sequence[Row]) -> dict[str, Any]:
    def rate(rs: Iterable[Row]) -> float | None:
        return mean(float(r.hit) for r in rs)

    aged = [r for r in rows if r.age is not None]
    out: dict[str, Any] = {
        "questions": len(rows),
        "answer_in_context": rate(rows),
        "by_category": {
            str(c): rate(r for r in rows if r.category == c)
            for c in CATEGORIES
            if any(r.category == c for r in rows)
        },
        "by_age": {
            b: rate(r for r in aged if age_bucket(r.age or 0) == b)
            for b in BUCKET_LABELS
            if any(age_bucket(r.age or 0) == b for r in aged)
        },
        "by_age_questions": {
            b: sum(1 for r in aged if age_bucket(r.age or 0) == b) for b in BUCKET_LABELS
        },
        "old": rate(r for r in aged if (r.age or 0) >= OLD_AGE),
        "old_questions": sum(1 for r in aged if (r.age or 0) >= OLD_AGE),
        "context_tokens": round(statistics.fmean(r.tokens for r in rows), 1) if rows else 0.0,
        "context_tokens_max": max((r.tokens for r in rows), default=0),
    }
    f1s = [r.f1 for r in rows if r.f1 is not None]
    if f1s:
        out["f1"] = mean(f1s)
        out["f1_old"] = mean(r.f1 for r in aged if r.f1 is not None and (r.age or 0) >= OLD_AGE)
    graded = [r.correct for r in rows if r.correct is not None]
    if graded:
        out["judge"] = mean(float(c) for c in graded)
    errors = sum(1 for r in rows if r.error)
    if errors:
        out["errors"] = errors
    return out


def _ticker(bar: Progress, task: Any, first: str, total: int) -> Callable[..., None]:
    """Advance the replay bar on the first arm's turns (two messages a turn, roughly)."""

    def tick(name: str, i: int, _prompt: Any, _arm: Any) -> None:
        if name == first:
            bar.update(task, completed=min(2 * (i + 1), total))

    return tick


def run(
    path: Path | str | None = None,
    *,
    budget: int = DEFAULT_BUDGET,
    profile_name: str = "local-64k",
    conversations: Sequence[int] = tuple(range(10)),
    strategies: Sequence[str] = STRATEGIES,
    tokenizer: str = DEFAULT_TOKENIZER,
    counter: TokenCounter | None = None,
    model: ChatModel | None = None,
    judge_model: ChatModel | None = None,
    summarizer: Summarizer | None = None,
    limit_questions: int | None = None,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay, ask, and tally; returns the JSON-ready result."""
    started = time.monotonic()
    names = check_strategies(strategies)
    data = Path(path) if path else default_path("locomo")
    if not data.exists():
        raise InputError(f"no such file: {data} (pass --data)")
    base = get_profile(profile_name, budget)
    profile, fitted = fit_profile(base)
    counter_label = f"{type(counter).__name__}" if counter else f"{tokenizer} (counter_from_spec)"
    counter = counter or counter_from_spec(tokenizer)
    if summarizer is None:
        if model is not None:
            from kioku.chronicler import LLMChronicler

            summarizer = LLMChronicler(model, counter, fallback=ExtractiveSummarizer(counter))
        else:
            summarizer = ExtractiveSummarizer(counter)
    rows: list[Row] = []
    per_conv: list[dict[str, Any]] = []
    with progress_bar(progress) as bar:
        overall = bar.add_task("LoCoMo", total=len(conversations))
        for index in conversations:
            t = load_locomo(data, index)
            split = "dev" if index in DEV else "heldout"
            last = int(t.info.get("sessions") or 0)
            questions = [q for q in t.info.get("qa", []) if q.get("category") in CATEGORIES]
            if limit_questions:
                questions = questions[:limit_questions]
            task = bar.add_task(f"  conv {index} replay", total=len(t.messages))
            tick = _ticker(bar, task, names[0], len(t.messages))

            arms = replay(
                t,
                profile=profile,
                counter=counter,
                summarizer=summarizer,
                strategies=names,
                on_turn=tick,
            )
            bar.update(
                task,
                description=f"  conv {index} questions",
                completed=0,
                total=len(questions) * len(arms),
            )
            conv_rows: list[Row] = []
            for name, arm in arms.items():
                for q in questions:
                    ctx = arm.context(q["question"])
                    if ctx.tokens + profile.response_reserve > profile.window and name != "full":
                        raise ContextOverflow(
                            f"{name}: a prompt of {ctx.tokens} tokens exceeds the budget"
                        )
                    f1 = correct = None
                    error = ""
                    if model is not None:
                        try:
                            given = qa.answer(
                                model,
                                ctx,
                                user=t.user,
                                character=t.character,
                                card=t.system_prompt,
                                seed=seed,
                            )
                            f1 = locomo_f1(given, q["answer"], int(q["category"]))
                            if judge_model is not None:
                                correct = qa.judge(
                                    judge_model, q["question"], str(q["answer"]), given, seed=seed
                                ).value
                        except ModelError as e:
                            error = f"{type(e).__name__}: {e}"
                            if log:
                                log(f"conv {index} {name}: {error}")
                    conv_rows.append(
                        Row(
                            conversation=index,
                            split=split,
                            strategy=name,
                            category=int(q["category"]),
                            age=evidence_age(q.get("evidence", []), last),
                            hit=answer_in_context(q["answer"], ctx.text),
                            tokens=ctx.tokens,
                            f1=f1,
                            correct=correct,
                            error=error,
                        )
                    )
                    bar.advance(task)
            per_conv.append(
                {
                    "index": index,
                    "sample_id": t.info.get("sample_id"),
                    "split": split,
                    "messages": len(t.messages),
                    "sessions": last,
                    "questions": len(questions),
                    "strategies": {
                        name: {
                            "answer_in_context": mean(
                                float(r.hit) for r in conv_rows if r.strategy == name
                            ),
                            "memory_tokens": arm.memory().tokens,
                            "memory_chars": arm.memory().chars,
                            **arm.counters(),
                        }
                        for name, arm in arms.items()
                    },
                }
            )
            rows.extend(conv_rows)
            close_all(arms)
            bar.remove_task(task)
            bar.advance(overall)
            if log:
                rates = ", ".join(
                    f"{n} {100 * (s['answer_in_context'] or 0):.0f}%"
                    for n, s in per_conv[-1]["strategies"].items()
                )
                log(f"conversation {index} ({split}): {rates}")

    out_strategies: dict[str, Any] = {}
    for name in names:
        mine = [r for r in rows if r.strategy == name]
        s = summarize_rows(mine)
        for split in ("dev", "heldout"):
            part = [r for r in mine if r.split == split]
            if part:
                s[split] = summarize_rows(part)
        convs = [c["strategies"][name] for c in per_conv]
        s["memory_tokens"] = mean(c["memory_tokens"] for c in convs)
        s["memory_chars"] = mean(c["memory_chars"] for c in convs)
        for k in ("folds", "major_gcs", "forced_cuts"):
            if any(k in c for c in convs):
                s[k] = sum(c.get(k, 0) for c in convs)
        out_strategies[name] = s
    return {
        "kind": KIND,
        "budget": budget,
        "profile": asdict(profile),
        "profile_fitted": fitted,
        "old_age": OLD_AGE,
        "age_buckets": list(BUCKET_LABELS),
        "categories": {str(k): v for k, v in CATEGORIES.items()},
        "questions": len(rows) // max(1, len(names)),
        "strategies": out_strategies,
        "conversations": per_conv,
        "runtime_s": round(time.monotonic() - started, 1),
        "pins": pins(
            profile=profile,
            counter=counter_label,
            summarizer=qa.model_name(summarizer),
            models={
                "answer": qa.describe_model(model),
                "judge": qa.describe_model(judge_model),
            },
            prompts=chronicler_prompts("en"),
            seed=seed,
            data={
                "path": str(data),
                "sha256": file_digest(data),
                "conversations": list(conversations),
            },
            strategies=list(names),
        ),
    }


def headline(result: Mapping[str, Any]) -> list[tuple[str, str, float | None, float | None]]:
    """(strategy, split, overall, old) for the console summary."""
    out = []
    for name, s in result["strategies"].items():
        for split in ("dev", "heldout"):
            if split in s:
                out.append((name, split, s[split]["answer_in_context"], s[split]["old"]))
    return out
