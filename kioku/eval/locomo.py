"""`kioku eval locomo`: an LLM-free forgetting proxy on LoCoMo — is the answer in the context at all?

Each conversation is replayed through each arm at one prompt budget (the local-64k profile
scaled to that window, made feasible by `strategies.fit_profile`), with the extractive chronicler
unless a model is given. Every question of categories 1–4 is then asked at the END of the
conversation, and the context that arm would send for it (system prompt, memory, raw window and
the recollection found for the question, all placed by the product's allocator; the question
itself excluded) is searched for the gold answer (`kioku.eval.answers`): strictly, as a
contiguous normalized phrase (`answer_in_context`), by the token F1 of the best window (`f1`),
and by the old bag-of-words rule (`bag_of_words`).

An arm cannot answer what is not in its prompt, but an answer can be in a prompt by accident and
still be unusable, and LoCoMo's answers are often paraphrases that no prompt holds verbatim. So
the rate is a proxy, not a bound. `full` (every message, no budget) is the reference: it holds
whatever the messages say and nothing more — a date it can show is a date some message renders.

Rates are reported overall, by category and by the age of the evidence (sessions between the
newest evidence turn and the last session), on conversations 0–4 (dev: the only ones any number
may be tuned on) and 5–9 (held out) separately, with a diagnosis of where each arm's answers
come from and what it loses against retrieval (`kioku.eval.diagnosis`), and a few questions
with what each arm's prompt holds around the answer, to read by eye. With a model, each arm
also answers from its context (F1 as in the LoCoMo paper) and, with a judge model, is graded.
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from kioku.counters import counter_from_spec
from kioku.datasets import Transcript, default_path, load_locomo
from kioku.errors import ContextOverflow, InputError
from kioku.models import ChatModel
from kioku.profiles import Profile, get_profile
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.tokens import TokenCounter

from . import qa
from .answers import index_of, locomo_f1, match, mean, normalize
from .baselines import RetrievalArm, entry_seqs
from .diagnosis import Row, diagnose, headline_gaps, prompt_split, sources
from .report import chronicler_prompts, file_digest, pins
from .strategies import (
    HEADLINE,
    REFERENCE,
    Arm,
    Context,
    check_strategies,
    close_all,
    fit_profile,
    progress_bar,
    replay,
)

KIND = "kioku.eval.locomo/2"
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
DEFAULT_SAMPLES = 20
EVIDENCE_WORDS = 8  # an evidence turn is "in" a part when its first words are
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
class Options:
    """What one run measures."""

    budget: int = DEFAULT_BUDGET
    profile: str = "local-64k"
    conversations: tuple[int, ...] = tuple(range(10))
    strategies: tuple[str, ...] = HEADLINE
    tokenizer: str = DEFAULT_TOKENIZER
    limit_questions: int | None = None
    samples: int = DEFAULT_SAMPLES  # questions shown with each arm's context around the answer
    seed: int = 0
    # Replay each conversation from this message on, for every arm: the folds fall elsewhere,
    # so the question meets kioku in another fold phase (what room it has at the end depends
    # on it). The questions stay; evidence before it is gone for every arm alike.
    start_at: int = 0


@dataclass(frozen=True)
class Models:
    """The models a run may use; with none it is LLM-free."""

    answer: ChatModel | None = None  # answers from each arm's context; also the chronicler
    judge: ChatModel | None = None
    summarizer: Summarizer | None = None  # default: the answer model's chronicler, or extractive


@dataclass(frozen=True)
class Question:
    conversation: int
    number: int
    split: str
    text: str
    answer: str
    category: int
    age: int | None
    evidence: tuple[int, ...]  # seqs of the evidence turns in the replayed log
    evidence_text: tuple[str, ...]
    # where the newest evidence turn stands in the conversation, 0 (first) to 1 (last)
    position: float | None = None

    @property
    def old(self) -> bool:
        return self.age is not None and self.age >= OLD_AGE


def questions_of(
    t: Transcript,
    index: int,
    limit: int | None = None,
    categories: Collection[int] = tuple(CATEGORIES),
) -> list[Question]:
    """The conversation's questions of `categories`; an adversarial question's gold is what it
    baits the reader into saying (its `adversarial_answer`)."""
    seqs = entry_seqs(t)
    by_dia = {str(m.get("dia_id")): i for i, m in enumerate(t.meta)}
    last = int(t.info.get("sessions") or 0)
    out = []
    for n, q in enumerate(t.info.get("qa", [])):
        if q.get("category") not in categories:
            continue
        found = [by_dia[e] for e in map(str, q.get("evidence", [])) if e in by_dia]
        out.append(
            Question(
                conversation=index,
                number=n,
                split="dev" if index in DEV else "heldout",
                text=str(q["question"]),
                answer=str(q.get("answer", q.get("adversarial_answer", ""))),
                category=int(q["category"]),
                age=evidence_age(q.get("evidence", []), last),
                evidence=tuple(seqs[i] for i in found if seqs[i] >= 0),
                evidence_text=tuple(t.messages[i].text for i in found),
                position=max(found) / max(1, len(t.messages) - 1) if found else None,
            )
        )
    return out[:limit] if limit else out


# one question of one arm -------------------------------------------------------------------------


def _evidence_in(parts: Mapping[str, str], evidence: Sequence[str]) -> tuple[str, ...]:
    heads = [" ".join(normalize(e).split()[:EVIDENCE_WORDS]) for e in evidence]
    heads = [h for h in heads if h]
    return tuple(
        p for p, text in parts.items() if text and any(index_of(text).phrase(h) for h in heads)
    )


def score(ctx: Context, q: Question, rank: int | None, graded: qa.Graded | None = None) -> Row:
    parts = {k: v for k, v in ctx.parts().items() if k != "system"}
    m = match(q.answer, ctx.text, q.category)
    found = tuple(
        p for p, text in parts.items() if text and match(q.answer, text, q.category).strict
    )
    return Row(
        conversation=q.conversation,
        number=q.number,
        split=q.split,
        strategy=ctx.strategy,
        category=q.category,
        age=q.age,
        old=q.old,
        match=m,
        tokens=ctx.tokens,
        found_in=found if m.strict else (),
        evidence_in=_evidence_in(parts, q.evidence_text),
        evidence_rank=rank,
        has_evidence=bool(q.evidence),
        account=ctx.account,
        answer_f1=locomo_f1(graded.given, q.answer, q.category)
        if graded and not graded.error
        else None,
        correct=graded.correct if graded else None,
        error=graded.error if graded else "",
    )


def evidence_rank(ranking: Sequence[int], q: Question) -> int | None:
    """The best 1-based rank of an evidence turn in a BM25 ranking (None: not ranked)."""
    where = {seq: i for i, seq in enumerate(ranking)}
    ranks = [where[s] + 1 for s in q.evidence if s in where]
    return min(ranks) if ranks else None


def sample_view(ctx: Context, q: Question, row: Row) -> dict[str, Any]:
    """What a person checks by eye: the match, and the context around it."""
    view: dict[str, Any] = {
        "strict": row.match.strict,
        "f1": row.match.f1,
        "bag_of_words": row.match.bag_of_words,
        "found_in": list(row.found_in),
        "evidence_in": list(row.evidence_in),
    }
    if row.match.where is not None:
        view["around"] = index_of(ctx.text).token_span(row.match.where)
    return view


# one conversation --------------------------------------------------------------------------------


@dataclass
class ConversationRun:
    """One LoCoMo conversation replayed through every arm and asked every question."""

    index: int
    transcript: Transcript
    questions: list[Question]
    sampled: set[int] = field(default_factory=set)  # question numbers shown in `samples`
    rows: list[Row] = field(default_factory=list)
    samples: dict[int, dict[str, Any]] = field(default_factory=dict)

    def ask(
        self,
        arms: Mapping[str, Arm],
        profile: Profile,
        answering: qa.Answering | None,
        advance: Callable[[], None],
    ) -> None:
        retrieval = arms.get("retrieval")
        ranker = retrieval if isinstance(retrieval, RetrievalArm) else None
        ranks = {
            q.number: evidence_rank(ranker.ranking(q.text), q) if ranker else None
            for q in self.questions
        }
        for name, arm in arms.items():
            for q in self.questions:
                ctx = arm.context(q.text)
                if name != REFERENCE and ctx.tokens + profile.response_reserve > profile.window:
                    raise ContextOverflow(
                        f"{name}: a prompt of {ctx.tokens} tokens exceeds the budget of "
                        f"{profile.prompt_budget}; the arm must be held to it"
                    )
                graded = answering(ctx, q.text, q.answer) if answering else None
                row = score(ctx, q, ranks[q.number], graded)
                self.rows.append(row)
                if q.number in self.sampled:
                    self._sample(q, ranks[q.number])[name] = sample_view(ctx, q, row)
                advance()

    def _sample(self, q: Question, rank: int | None) -> dict[str, Any]:
        if q.number not in self.samples:
            self.samples[q.number] = {
                "conversation": self.index,
                "question": q.text,
                "answer": q.answer,
                "category": q.category,
                "age": q.age,
                "evidence": list(q.evidence_text),
                "evidence_rank": rank,
                "arms": {},
            }
        arms: dict[str, Any] = self.samples[q.number]["arms"]
        return arms

    def summary(self, arms: Mapping[str, Arm]) -> dict[str, Any]:
        t = self.transcript
        return {
            "index": self.index,
            "sample_id": t.info.get("sample_id"),
            "split": "dev" if self.index in DEV else "heldout",
            "messages": len(t.messages),
            "sessions": int(t.info.get("sessions") or 0),
            "questions": len(self.questions),
            "strategies": {
                name: {
                    "answer_in_context": mean(
                        float(r.hit) for r in self.rows if r.strategy == name
                    ),
                    "memory_tokens": arm.memory().tokens,
                    "memory_chars": arm.memory().chars,
                    **arm.counters(),
                }
                for name, arm in arms.items()
            },
        }


# tallies -----------------------------------------------------------------------------------------


def summarize_rows(rows: Sequence[Row]) -> dict[str, Any]:
    def rate(rs: Iterable[Row], get: Callable[[Row], float] = lambda r: float(r.hit)) -> Any:
        return mean(get(r) for r in rs)

    f1 = lambda r: r.match.f1  # noqa: E731
    bag = lambda r: float(r.match.bag_of_words)  # noqa: E731
    aged = [r for r in rows if r.age is not None]
    old = [r for r in aged if r.old]
    out: dict[str, Any] = {
        "questions": len(rows),
        "answer_in_context": rate(rows),
        "f1": rate(rows, f1),
        "bag_of_words": rate(rows, bag),
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
        "old": rate(old),
        "old_f1": rate(old, f1),
        "old_bag_of_words": rate(old, bag),
        "old_questions": len(old),
        "context_tokens": round(statistics.fmean(r.tokens for r in rows), 1) if rows else 0.0,
        "context_tokens_max": max((r.tokens for r in rows), default=0),
        "prompt": prompt_split(rows),
        "found_in": sources(rows),
    }
    answered = [r for r in rows if r.answer_f1 is not None]
    if answered:
        out["answer_f1"] = rate(answered, lambda r: r.answer_f1 or 0.0)
        out["answer_f1_old"] = rate((r for r in answered if r.old), lambda r: r.answer_f1 or 0.0)
    graded = [r for r in rows if r.correct is not None]
    if graded:
        out["judge"] = rate(graded, lambda r: float(bool(r.correct)))
    errors = sum(1 for r in rows if r.error)
    if errors:
        out["errors"] = errors
    return out


def summarize(rows: Sequence[Row], names: Sequence[str], convs: Sequence[dict]) -> dict:
    out: dict[str, Any] = {}
    for name in names:
        mine = [r for r in rows if r.strategy == name]
        s = summarize_rows(mine)
        for split in ("dev", "heldout"):
            part = [r for r in mine if r.split == split]
            if part:
                s[split] = summarize_rows(part)
        per = [c["strategies"][name] for c in convs]
        s["memory_tokens"] = mean(c["memory_tokens"] for c in per)
        s["memory_chars"] = mean(c["memory_chars"] for c in per)
        for k in ("folds", "major_gcs", "forced_cuts"):
            if any(k in c for c in per):
                s[k] = sum(c.get(k, 0) for c in per)
        out[name] = s
    return out


# the run -----------------------------------------------------------------------------------------


def _summarizer(models: Models, counter: TokenCounter) -> Summarizer:
    if models.summarizer is not None:
        return models.summarizer
    if models.answer is not None:
        from kioku.chronicler import LLMChronicler

        return LLMChronicler(models.answer, counter, fallback=ExtractiveSummarizer(counter))
    return ExtractiveSummarizer(counter)


def _sampled(options: Options, index: int, questions: Sequence[Question]) -> set[int]:
    per = -(-options.samples // max(1, len(options.conversations)))
    pool = [q.number for q in questions]
    return set(random.Random(options.seed * 1000 + index).sample(pool, min(per, len(pool))))


def run(
    path: Path | str | None = None,
    options: Options = Options(),
    *,
    counter: TokenCounter | None = None,
    models: Models = Models(),
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay, ask, and tally; returns the JSON-ready result."""
    started = time.monotonic()
    names = check_strategies(options.strategies)
    data = Path(path) if path else default_path("locomo")
    if not data.exists():
        raise InputError(f"no such file: {data} (pass --data)")
    profile, fitted = fit_profile(get_profile(options.profile, options.budget))
    counter_label = (
        type(counter).__name__ if counter else f"{options.tokenizer} (counter_from_spec)"
    )
    counter = counter or counter_from_spec(options.tokenizer)
    summarizer = _summarizer(models, counter)
    done: list[ConversationRun] = []
    per_conv: list[dict[str, Any]] = []
    with progress_bar(progress) as bar:
        overall = bar.add_task("LoCoMo", total=len(options.conversations))
        for index in options.conversations:
            t = load_locomo(data, index)
            if options.start_at:
                k = options.start_at
                t = replace(t, messages=t.messages[k:], meta=t.meta[k:])
            questions = questions_of(t, index, options.limit_questions)
            conv = ConversationRun(index, t, questions, _sampled(options, index, questions))
            task = bar.add_task(f"  conv {index} replay", total=None)
            arms = replay(
                t, profile=profile, counter=counter, summarizer=summarizer, strategies=names
            )
            bar.update(
                task, description=f"  conv {index} questions", total=len(questions) * len(arms)
            )
            answering = (
                qa.Answering(
                    models.answer,
                    user=t.user,
                    character=t.character,
                    card=t.system_prompt,
                    judge_model=models.judge,
                    seed=options.seed,
                    judge_seed=options.seed,
                )
                if models.answer is not None
                else None
            )
            conv.ask(arms, profile, answering, partial(bar.advance, task))
            per_conv.append(conv.summary(arms))
            done.append(conv)
            close_all(arms)
            bar.remove_task(task)
            bar.advance(overall)
            if log:
                rates = ", ".join(
                    f"{n} {100 * (s['answer_in_context'] or 0):.0f}%"
                    for n, s in per_conv[-1]["strategies"].items()
                )
                split = "dev" if index in DEV else "heldout"
                log(f"conversation {index} ({split}): {rates}")
    rows = [r for c in done for r in c.rows]
    strategies = summarize(rows, names, per_conv)
    return {
        "kind": KIND,
        "budget": options.budget,
        "start_at": options.start_at,
        "profile": asdict(profile),
        "profile_fitted": fitted,
        "old_age": OLD_AGE,
        "age_buckets": list(BUCKET_LABELS),
        "categories": {str(k): v for k, v in CATEGORIES.items()},
        "questions": len(rows) // max(1, len(names)),
        "arms": [n for n in names if n != REFERENCE],
        "reference": REFERENCE if REFERENCE in names else None,
        "strategies": strategies,
        "margins": headline_gaps(strategies),
        "diagnosis": diagnose(rows, names),
        "samples": [s for c in done for _, s in sorted(c.samples.items())],
        "conversations": per_conv,
        "runtime_s": round(time.monotonic() - started, 1),
        "pins": pins(
            profile=profile,
            counter=counter_label,
            summarizer=qa.model_name(summarizer),
            models={
                "answer": qa.describe_model(models.answer),
                "judge": qa.describe_model(models.judge),
            },
            prompts=chronicler_prompts("en"),
            seed=options.seed,
            data={
                "path": str(data),
                "sha256": file_digest(data),
                "conversations": list(options.conversations),
            },
            strategies=list(names),
        ),
    }
