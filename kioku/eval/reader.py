"""`kioku eval locomo --reader URL`: what a real model answers from each arm's prompt.

The LLM-free proxy asks whether the gold answer is somewhere in a prompt; a user sees what the
model answers. Here each arm's prompt for a question — the one the product would send: system
prompt, memory exchange, raw window, recollections, then the question as the user's message
with one line asking for a brief answer or "not mentioned" — goes to a reader, an
OpenAI-compatible model apart from the chronicler that wrote the memory. Each reply is scored
as LoCoMo's own scorer scores it (`answers.locomo_f1`), by the strict match of the gold answer
in the reply, and, with a judge, by the judge (reported apart: it depends on the judge).

Arms, on the same reader and budget, each laid out stable part first so the reader's prefix
cache serves them alike: `generational` (the product, every layer on), `retrieval` (the recent
window, then BM25 turns in front of the question in the room kioku gives recollections:
`baselines.RecentRetrievalArm`),
`truncation` (a sliding window), `rolling` (one rewritten summary) and `none` (no history: the
floor a reader reaches from priors alone).

Cost: every question of a conversation is asked at one state, its end; the questions are asked
arm by arm (`schedule`), so each arm's stable prefix (system, memory, window) is read once and
then found in the server's cache. `--questions N` samples N questions, spread evenly over the
conversations, and within each over the categories and the evidence's age (`sample`), seeded.

Figures: per arm, dev (0–4) and held-out (5–9) apart, overall, per category and per age third
of the evidence (oldest / middle / newest third of the conversation), each with a bootstrap
95% interval (fixed seed); and generational's paired margin over every other arm.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kioku.counters import counter_from_spec
from kioku.datasets import Transcript, default_path, load_locomo
from kioku.errors import BadEvalReply, InputError, ModelError
from kioku.models import ChatMessage, ChatModel, ChatRequest
from kioku.profiles import Profile, get_profile
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.tokens import TokenCounter

from . import qa
from .answers import ADVERSARIAL, locomo_f1, reply_strict, says_not_known, stemmer_name
from .arms import Context
from .baselines import RecentRetrievalArm, RetrievalArm, WindowArm
from .cli_shared import indexes_of
from .locomo import CATEGORIES, DEFAULT_BUDGET, Question, questions_of
from .report import file_digest, pins
from .strategies import KNOWN, REFERENCE, close_all, fit_profile, replay

KIND = "kioku.eval.reader/1"
NONE = "none"
READER_ARMS: tuple[str, ...] = ("generational", "retrieval", "truncation", "rolling", NONE)
ALL_CATEGORIES: dict[int, str] = {**CATEGORIES, ADVERSARIAL: "adversarial"}
_KNOWN = ", ".join(f"{k} ({v})" for k, v in ALL_CATEGORIES.items())  # what --categories takes
THIRDS: tuple[str, ...] = ("oldest", "middle", "newest")
NO_EVIDENCE = "unplaced"  # a question whose evidence is not in the conversation
INSTRUCTION = (
    "Answer in a few words from the conversation. If it does not say, answer: not mentioned."
)
MAX_TOKENS = 64
# the room a sliding window leaves for the question, so that it keeps one window per state
QUESTION_ROOM = 96
RESAMPLES = 2000


def third(position: float | None) -> str:
    """Which third of the conversation the newest evidence turn stands in."""
    if position is None:
        return NO_EVIDENCE
    return THIRDS[min(2, int(position * 3))]


def check_arms(names: Iterable[str]) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(names))
    allowed = [n for n in KNOWN if n not in (REFERENCE, "rolling-long")] + [NONE]
    bad = [n for n in out if n not in allowed]
    if bad:
        raise InputError(f"the reader has no arm {bad[0]!r}; use some of {', '.join(allowed)}")
    if not out:
        raise InputError(f"name at least one arm: {', '.join(allowed)}")
    return out


@dataclass(frozen=True)
class ReaderOptions:
    budget: int = DEFAULT_BUDGET
    profile: str = "local-64k"
    conversations: tuple[int, ...] = tuple(range(5, 10))
    arms: tuple[str, ...] = READER_ARMS
    tokenizer: str = "qwen2.5"
    questions: int | None = None  # in all, over the conversations; None: every question
    # the categories asked: adversarial alone (5) is the check that a reply says "not known"
    # where the conversation does not say, on more questions than a spread sample holds
    categories: tuple[int, ...] = tuple(ALL_CATEGORIES)
    seed: int = 0
    time_on: bool = False  # time each prompt's evaluation on the reader
    max_tokens: int = MAX_TOKENS


# which questions, in which order ------------------------------------------------------------------


def categories_of(spec: str) -> tuple[int, ...]:
    """`--categories`: numbers, ranges or names, "5", "1-4", "adversarial", "multi-hop,5"."""
    by_name = {v: k for k, v in ALL_CATEGORIES.items()}
    parts = [p.strip().lower() for p in spec.split(",")]
    named = [by_name[p] for p in parts if p in by_name]
    numbered = ",".join(p for p in parts if p not in by_name)
    return checked_categories([*named, *indexes_of(numbered, "--categories", _KNOWN)], spec)


def checked_categories(categories: Iterable[int], spec: object = None) -> tuple[int, ...]:
    """The categories asked, each once, in order; a clear error for one LoCoMo does not have."""
    picked = sorted(set(categories))
    if not picked or any(c not in ALL_CATEGORIES for c in picked):
        shown = spec if spec is not None else picked
        raise InputError(f"--categories takes {_KNOWN}, not {shown!r}")
    return tuple(picked)


def shares(total: int, parts: Sequence[int]) -> dict[int, int]:
    """`total` split over `parts` as evenly as it goes, the first ones taking the remainder."""
    n = len(parts)
    return {p: total // n + (1 if i < total % n else 0) for i, p in enumerate(parts)}


def sample(
    questions: Sequence[Question], n: int | None, seed: int, turn: int = 0
) -> list[Question]:
    """`n` of `questions` (all when None), spread evenly over the categories and, within each,
    over the age thirds: categories take turns (in their order, from the `turn`-th: the next
    conversation goes on where the last one stopped), and within one the thirds take turns;
    a stratum with nothing left gives its turn away. The same seed picks the same questions.
    Returned in the conversation's question order."""
    if n is None or n >= len(questions):
        return sorted(questions, key=lambda q: q.number)
    rng = random.Random(seed)
    queues: dict[int, list[Question]] = {}
    for c in sorted({q.category for q in questions}):
        strata = [
            [q for q in questions if q.category == c and third(q.position) == t]
            for t in (*THIRDS, NO_EVIDENCE)
        ]
        for s in strata:
            rng.shuffle(s)
        start = rng.randrange(len(THIRDS))
        order = strata[start:3] + strata[:start] + strata[3:]
        queue: list[Question] = []
        while any(order):
            for s in order:
                if s:
                    queue.append(s.pop())
        queues[c] = queue
    cats = list(queues)
    cats = cats[turn % len(cats) :] + cats[: turn % len(cats)]
    picked: list[Question] = []
    while len(picked) < n:
        for c in cats:
            if queues[c] and len(picked) < n:
                picked.append(queues[c].pop(0))
    return sorted(picked, key=lambda q: q.number)


def schedule(
    asked: Mapping[int, Sequence[Question]], arms: Sequence[str]
) -> list[tuple[int, str, Question]]:
    """The order the reader gets the prompts: conversation by conversation, and within one arm
    by arm, so that an arm's stable prefix stays in the server's cache for all its questions."""
    return [(c, arm, q) for c, qs in asked.items() for arm in arms for q in qs]


# one answer --------------------------------------------------------------------------------------


def reader_messages(ctx: Context) -> tuple[ChatMessage, ...]:
    """The arm's prompt as the product lays it out, closed by the question: whatever the arm
    shows with the question (recollections, retrieved turns, a date line) first, then the
    question, then the instruction line."""
    last = "\n\n".join(t for t in (ctx.extra, ctx.question) if t)
    return (*ctx.before, ChatMessage("user", f"{last}\n{INSTRUCTION}"))


@dataclass(frozen=True)
class Reader:
    """Who reads the prompts, who grades, and how each answer is asked."""

    model: ChatModel
    counter: TokenCounter
    judge: ChatModel | None = None
    time_on: bool = False
    max_tokens: int = MAX_TOKENS
    seed: int = 0

    def answer(self, ctx: Context, q: Question) -> dict[str, Any]:
        """The reply and its scores; a model error is recorded, never raised or scored."""
        messages = reader_messages(ctx)
        out: dict[str, Any] = {
            "prompt_tokens": ctx.tokens + self.counter.count(INSTRUCTION) + 1,
        }
        try:
            if self.time_on:
                # the prompt alone (one token out): its evaluation; the answer then finds the
                # whole prompt cached
                start = time.perf_counter()
                self.model.complete(
                    ChatRequest(messages, max_tokens=1, temperature=0.0, purpose="eval")
                )
                out["prompt_seconds"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            c = self.model.complete(
                ChatRequest(
                    messages,
                    max_tokens=self.max_tokens,
                    temperature=0.0,
                    purpose="eval",
                    extra={"seed": self.seed},
                )
            )
            out["seconds"] = round(time.perf_counter() - start, 3)
        except ModelError as e:
            return {**out, "reply": "", "error": f"{type(e).__name__}: {e}"}
        reply = c.text.strip()
        out |= {
            "reply": reply,
            "f1": round(locomo_f1(reply, q.answer, q.category), 4),
            "strict": reply_strict(reply, q.answer, q.category),
        }
        if c.usage.prompt_tokens:
            out["server_prompt_tokens"] = c.usage.prompt_tokens
        # an adversarial gold answer is the bait, not the truth: nothing for a judge to compare
        if self.judge is not None and q.category != ADVERSARIAL:
            try:
                out["judge"] = bool(
                    qa.judge(self.judge, q.text, q.answer, reply, seed=self.seed).value
                )
            except (ModelError, BadEvalReply) as e:
                out["judge_error"] = f"{type(e).__name__}: {e}"
        return out


def fresh_tokens(
    previous: Sequence[ChatMessage], messages: Sequence[ChatMessage], counter: TokenCounter
) -> int:
    """What a server that keeps only the previous request's prefix must read anew: the tokens
    of the messages after those the two prompts share from the start."""
    same = 0
    for a, b in zip(previous, messages, strict=False):
        if a != b:
            break
        same += 1
    return sum(counter.count(m.content) for m in messages[same:])


# arms --------------------------------------------------------------------------------------------


def reader_arms(
    t: Transcript,
    names: Sequence[str],
    *,
    profile: Profile,
    counter: TokenCounter,
    summarizer: Summarizer,
) -> dict[str, Any]:
    """Each named arm, replayed to the end of `t` and ready for `context(question)`."""
    replayed = [n for n in names if n != NONE]
    arms: dict[str, Any] = (
        dict(
            replay(t, profile=profile, counter=counter, summarizer=summarizer, strategies=replayed)
        )
        if replayed
        else {}
    )
    if isinstance(arms.get("truncation"), WindowArm):
        arms["truncation"].question_room = QUESTION_ROOM
    if isinstance(arms.get("retrieval"), RetrievalArm):
        arms["retrieval"] = RecentRetrievalArm("retrieval", arms["retrieval"])
    if NONE in names:
        arms[NONE] = WindowArm(NONE, t, profile, counter)  # never fed: the question alone
    return {n: arms[n] for n in names}


# figures -----------------------------------------------------------------------------------------


def interval(values: Sequence[float], seed: int, resamples: int = RESAMPLES) -> dict[str, Any]:
    """The mean and its bootstrap 95% interval (percentiles of resampled means)."""
    v = np.asarray(values, dtype=float)
    if not len(v):
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {
        "mean": round(float(v.mean()), 4),
        "lo": round(float(lo), 4),
        "hi": round(float(hi), 4),
        "n": int(len(v)),
    }


def _metrics(rows: Sequence[Mapping[str, Any]], seed: int) -> dict[str, Any]:
    scored = [r for r in rows if "f1" in r]
    out: dict[str, Any] = {
        "f1": interval([r["f1"] for r in scored], seed),
        "strict": interval([float(r["strict"]) for r in scored], seed),
        # how often the reply says "not mentioned": right on an adversarial question, a
        # miss on any other (a reader that always abstains scores 1 on category 5 alone)
        "not_known": interval([float(says_not_known(r["reply"])) for r in scored], seed),
    }
    judged = [r for r in scored if "judge" in r]
    if judged:
        out["judge"] = interval([float(r["judge"]) for r in judged], seed)
    errors = len(rows) - len(scored)
    if errors:
        out["errors"] = errors
    return out


def summarize(
    answers: Sequence[Mapping[str, Any]], arms: Sequence[str], seed: int
) -> dict[str, Any]:
    """Per arm and split: overall, by category, by age third; and generational's paired
    margin of F1 over each other arm (the same questions, resampled together)."""
    out: dict[str, Any] = {}
    for arm in arms:
        per: dict[str, Any] = {}
        for split in ("dev", "heldout"):
            mine = [
                (a, a["arms"][arm]) for a in answers if a["split"] == split and arm in a["arms"]
            ]
            if not mine:
                continue
            rows = [r for _, r in mine]
            per[split] = {
                **_metrics(rows, seed),
                "by_category": {
                    str(c): _metrics([r for a, r in mine if a["category"] == c], seed)
                    for c in ALL_CATEGORIES
                    if any(a["category"] == c for a, _ in mine)
                },
                "by_age": {
                    t: _metrics([r for a, r in mine if a["third"] == t], seed)
                    for t in (*THIRDS, NO_EVIDENCE)
                    if any(a["third"] == t for a, _ in mine)
                },
            }
        out[arm] = per
    return out


def margins(answers: Sequence[Mapping[str, Any]], arms: Sequence[str], seed: int) -> dict:
    """`generational` F1 minus each other arm's, per split, over the questions both scored."""
    if "generational" not in arms:
        return {}
    out: dict[str, Any] = {}
    for split in ("dev", "heldout"):
        row: dict[str, Any] = {}
        for arm in arms:
            if arm == "generational":
                continue
            diffs = [
                a["arms"]["generational"]["f1"] - a["arms"][arm]["f1"]
                for a in answers
                if a["split"] == split
                and "f1" in a["arms"].get("generational", {})
                and "f1" in a["arms"].get(arm, {})
            ]
            if diffs:
                row[arm] = interval(diffs, seed)
        if row:
            out[split] = row
    return out


# the run -----------------------------------------------------------------------------------------


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not enabled,
    )


def run(
    path: Path | str | None,
    options: ReaderOptions,
    *,
    reader: ChatModel,
    judge: ChatModel | None = None,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay each conversation through every arm, ask the sampled questions, and score the
    replies; returns the JSON-ready result."""
    started = time.monotonic()
    arms = check_arms(options.arms)
    data = Path(path) if path else default_path("locomo")
    if not data.exists():
        raise InputError(f"no such file: {data} (pass --data)")
    if options.questions is not None and options.questions < 1:
        raise InputError("--questions takes a number of 1 or more, or all")
    profile, fitted = fit_profile(get_profile(options.profile, options.budget))
    counter_label = type(counter).__name__ if counter else options.tokenizer
    counter = counter or counter_from_spec(options.tokenizer)
    summarizer = summarizer or ExtractiveSummarizer(counter)
    ask = Reader(
        reader,
        counter,
        judge=judge,
        time_on=options.time_on,
        max_tokens=options.max_tokens,
        seed=options.seed,
    )
    categories = checked_categories(options.categories)
    convs = options.conversations
    quota = shares(options.questions, convs) if options.questions is not None else {}
    transcripts: dict[int, Transcript] = {}
    asked: dict[int, list[Question]] = {}
    turn = 0
    for index in convs:
        t = transcripts[index] = load_locomo(data, index)
        every = questions_of(t, index, categories=categories)
        asked[index] = sample(every, quota.get(index), options.seed * 1000 + index, turn)
        turn += len(asked[index])
    order = schedule(asked, arms)
    results: dict[tuple[int, int], dict[str, Any]] = {}
    previous: tuple[ChatMessage, ...] = ()
    with _progress(progress) as bar:
        task = bar.add_task("answers", total=len(order))
        for index in convs:
            t = transcripts[index]
            bar.update(task, description=f"conv {index}: replay")
            live = reader_arms(t, arms, profile=profile, counter=counter, summarizer=summarizer)
            try:
                for _, name, q in (step for step in order if step[0] == index):
                    bar.update(task, description=f"conv {index}: {name}")
                    ctx = live[name].context(q.text)
                    row = results.setdefault((index, q.number), _question(q))
                    row["arms"][name] = ask.answer(ctx, q)
                    messages = reader_messages(ctx)
                    row["arms"][name]["fresh_tokens"] = fresh_tokens(previous, messages, counter)
                    previous = messages
                    bar.advance(task)
            finally:
                close_all(live)
            if log:
                done = [r for (c, _), r in results.items() if c == index]
                log(
                    f"conversation {index}: "
                    + ", ".join(
                        f"{n} F1 {_mean(r['arms'][n].get('f1') for r in done):.2f}" for n in arms
                    )
                )
    answers = [results[k] for k in sorted(results)]
    return {
        "kind": KIND,
        "budget": options.budget,
        "profile": asdict(profile),
        "profile_fitted": fitted,
        "arms": list(arms),
        "categories": {str(k): ALL_CATEGORIES[k] for k in categories},
        "age_thirds": list(THIRDS),
        "instruction": INSTRUCTION,
        "questions": len(answers),
        "questions_requested": options.questions if options.questions is not None else "all",
        "order": [[c, arm, q.number] for c, arm, q in order],
        "scores": summarize(answers, arms, options.seed),
        "cache": {
            arm: {
                k: sum(a["arms"][arm][k] for a in answers)
                for k in ("prompt_tokens", "fresh_tokens")
            }
            for arm in arms
        },
        "margins": margins(answers, arms, options.seed),
        "answers": answers,
        "runtime_s": round(time.monotonic() - started, 1),
        "pins": pins(
            profile=profile,
            counter=counter_label,
            summarizer=qa.model_name(summarizer),
            models={"reader": qa.describe_model(reader), "judge": qa.describe_model(judge)},
            seed=options.seed,
            data={
                "path": str(data),
                "sha256": file_digest(data),
                "conversations": list(convs),
            },
            scorer={"f1": "locomo task_eval/evaluation.py", "stemmer": stemmer_name()},
            time_on=options.time_on,
            max_tokens=options.max_tokens,
            resamples=RESAMPLES,
        ),
    }


def _question(q: Question) -> dict[str, Any]:
    return {
        "conversation": q.conversation,
        "number": q.number,
        "split": q.split,
        "category": q.category,
        "third": third(q.position),
        "age": q.age,
        "question": q.text,
        "gold": q.answer,
        "arms": {},
    }


def _mean(values: Iterable[float | None]) -> float:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else 0.0
