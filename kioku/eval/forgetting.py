"""`kioku eval forgetting`: the forgetting curve, measured with an LLM (SPEC §8, seed 000 §3).

1. Replay the conversation through every strategy, with one summarizer for all.
2. Cut it into segments where kioku folded (its chapters' ranges, plus the raw tail at the end;
   segments under `min_segment_tokens` are merged into the next so each can carry a quiz).
3. Per segment a model writes `n` factual questions with answers from that segment only (strict
   JSON, retried when unusable, a failure recorded and reported, never dropped in silence).
4. Each strategy answers every question from the prompt it would send at the end of the
   conversation; a judge model grades each answer.
5. Recall per segment, oldest first, is the curve; its mean, and the memory's length in tokens and
   characters, sit beside it. With `repeats` > 1 the replay and the answers run again (the
   questions stay the same) and the spread is reported: the seed saw memory length swing
   4,785–7,016 chars between identical runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from kioku.datasets import Transcript
from kioku.errors import InputError, ModelError
from kioku.models import ChatModel
from kioku.profiles import Profile
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.tokens import TokenCounter
from kioku.transcript import render_transcript

from . import qa
from .answers import mean
from .report import chronicler_prompts, pins
from .strategies import (
    CONVERSATION_ID,
    STRATEGIES,
    Arm,
    KiokuArm,
    check_strategies,
    close_all,
    fit_profile,
    progress_bar,
    replay,
)

KIND = "kioku.eval.forgetting/1"
DEFAULT_MIN_SEGMENT_TOKENS = 1000


@dataclass(frozen=True)
class Segment:
    index: int
    first_seq: int
    last_seq: int
    tokens: int
    tail: bool = False  # the raw window at the end: no fold has covered it yet


def fold_segments(arm: KiokuArm, min_tokens: int = DEFAULT_MIN_SEGMENT_TOKENS) -> list[Segment]:
    """The conversation cut where kioku folded: a chain of chapter ranges from seq 0 (every
    chapter ever written, retired ones included), then the unfolded tail. Pieces under
    `min_tokens` join the next one."""
    store = arm.kk.store
    chapters = sorted(
        (
            i
            for i in store.items(CONVERSATION_ID, "active", "retired", "ready")
            if i.kind == "chapter"
        ),
        key=lambda i: (i.first_seq, -i.last_seq),
    )
    ranges: list[tuple[int, int, bool]] = []
    start = 0
    for c in chapters:
        if c.first_seq == start:
            ranges.append((c.first_seq, c.last_seq, False))
            start = c.last_seq + 1
    end = store.conversation(CONVERSATION_ID).next_seq - 1
    if start <= end:
        ranges.append((start, end, True))
    merged: list[tuple[int, int, bool, int]] = []
    pending: tuple[int, int] | None = None
    for lo, hi, tail in ranges:
        if pending:
            lo = pending[0]
        tokens = store.tokens_between(CONVERSATION_ID, lo, hi)
        if tokens < min_tokens and not tail:
            pending = (lo, hi)
            continue
        pending = None
        merged.append((lo, hi, tail, tokens))
    if pending:  # a short last chapter with no tail after it joins the one before
        if merged:
            lo, _, tail, _ = merged.pop()
            merged.append(
                (lo, pending[1], tail, store.tokens_between(CONVERSATION_ID, lo, pending[1]))
            )
        else:
            lo, hi = pending
            merged.append((lo, hi, False, store.tokens_between(CONVERSATION_ID, lo, hi)))
    return [Segment(i, lo, hi, tok, tail) for i, (lo, hi, tail, tok) in enumerate(merged)]


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "max": None, "std": None}
    return {
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "std": round(statistics.pstdev(values), 4) if len(values) > 1 else 0.0,
    }


def write_quizzes(
    model: ChatModel,
    gen: KiokuArm,
    transcript: Transcript,
    segments: Sequence[Segment],
    *,
    n: int,
    seed: int,
    advance: Callable[[], None],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One quiz per segment, from that segment's messages only. A segment whose questions stay
    unusable is kept with its error (and no questions), never dropped."""
    quizzes = []
    for seg in segments:
        entries = gen.kk.store.entries(CONVERSATION_ID, seg.first_seq, seg.last_seq)
        quiz: dict[str, Any] = {**asdict(seg), "questions": []}
        try:
            asked = qa.write_questions(
                model,
                render_transcript(entries, gen.conv.lang),
                first=seg.first_seq,
                last=seg.last_seq,
                user=transcript.user,
                character=transcript.character,
                n=n,
                seed=seed,
            )
            quiz["questions"] = asked.value
            quiz["attempts"] = asked.attempts
        except ModelError as e:
            quiz["error"] = f"{type(e).__name__}: {e}"
            say(f"segment {seg.index} (#{seg.first_seq}–{seg.last_seq}): no questions: {e}")
        quizzes.append(quiz)
        advance()
    return quizzes


def answer_quizzes(
    arm: Arm,
    quizzes: Sequence[Mapping[str, Any]],
    answering: qa.Answering,
    *,
    advance: Callable[[], None],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """One arm answers every quiz from its final context: recall per segment, and each answer."""
    per_segment: list[float | None] = []
    answers: list[dict[str, Any]] = []
    for quiz in quizzes:
        grades: list[bool] = []
        for k, q in enumerate(quiz["questions"]):
            ctx = arm.context(q["question"])
            graded = answering(ctx, q["question"], q["answer"])
            row: dict[str, Any] = {"segment": quiz["index"], "question": k}
            if graded.given:
                row["answer"] = graded.given
            if graded.error:
                row["error"] = graded.error
                say(f"{arm.name}, segment {quiz['index']} question {k}: {graded.error}")
            else:
                row["correct"] = graded.correct
                grades.append(bool(graded.correct))
            row["context_tokens"] = ctx.tokens
            answers.append(row)
            advance()
        per_segment.append(mean(float(g) for g in grades))
    graded_all = [a["correct"] for a in answers if "correct" in a]
    mem = arm.memory()
    return {
        "recall_per_segment": per_segment,
        "mean_recall": mean(float(g) for g in graded_all),
        "memory_tokens": mem.tokens,
        "memory_chars": mem.chars,
        "memory_rendered_tokens": mem.rendered_tokens,
        "errors": sum(1 for a in answers if "error" in a),
        "answers": answers,
        **arm.counters(),
    }


def tally(reps: Sequence[Mapping[str, Any]], segments: int) -> dict[str, Any]:
    """One arm's repeats: the mean curve, and the spread the seed warned about."""
    recalls = [x["mean_recall"] for x in reps if x["mean_recall"] is not None]
    per_seg = [
        mean(x["recall_per_segment"][i] for x in reps if x["recall_per_segment"][i] is not None)
        for i in range(segments)
    ]
    return {
        "recall_per_segment": per_seg,
        "mean_recall": mean(recalls),
        "memory_tokens": mean(x["memory_tokens"] for x in reps),
        "memory_chars": mean(x["memory_chars"] for x in reps),
        "errors": sum(x["errors"] for x in reps),
        "spread": {
            "mean_recall": _spread(recalls),
            "memory_tokens": _spread([x["memory_tokens"] for x in reps]),
            "memory_chars": _spread([x["memory_chars"] for x in reps]),
        },
        "repeats": list(reps),
    }


def run(
    transcript: Transcript,
    *,
    model: ChatModel,
    counter: TokenCounter,
    profile: Profile,
    judge_model: ChatModel | None = None,
    summarizer: Summarizer | None = None,
    strategies: Sequence[str] = STRATEGIES,
    repeats: int = 1,
    seed: int = 0,
    questions_per_segment: int = qa.QUESTIONS_PER_SEGMENT,
    min_segment_tokens: int = DEFAULT_MIN_SEGMENT_TOKENS,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay, cut into segments, quiz, answer (`repeats` times), tally."""
    started = time.monotonic()
    names = check_strategies(strategies)
    if "generational" not in names:
        raise InputError("the segments are cut where kioku folds: include generational")
    if repeats < 1:
        raise InputError("repeats must be at least 1")
    judge_model = judge_model or model
    profile, fitted = fit_profile(profile)
    if summarizer is None:
        from kioku.chronicler import LLMChronicler

        summarizer = LLMChronicler(model, counter, fallback=ExtractiveSummarizer(counter))
    # the extractive chronicler writes the same memory every time: one replay serves all repeats
    deterministic = isinstance(summarizer, ExtractiveSummarizer)
    say = log or (lambda _s: None)

    quizzes: list[dict[str, Any]] = []
    repeats_out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    arms: dict[str, Arm] | None = None
    with progress_bar(progress) as bar:
        for r in range(repeats):
            if arms is None or not deterministic:
                if arms is not None:
                    close_all(arms)
                task = bar.add_task(f"replay {r + 1}/{repeats}", total=None)
                arms = replay(
                    transcript,
                    profile=profile,
                    counter=counter,
                    summarizer=summarizer,
                    strategies=names,
                )
                bar.remove_task(task)
            if r == 0:
                gen = arms["generational"]
                if not isinstance(gen, KiokuArm):
                    raise InputError("generational must replay kioku itself to cut segments")
                segments = fold_segments(gen, min_segment_tokens)
                qtask = bar.add_task("writing questions", total=len(segments))
                quizzes = write_quizzes(
                    model,
                    gen,
                    transcript,
                    segments,
                    n=questions_per_segment,
                    seed=seed,
                    advance=partial(bar.advance, qtask),
                    say=say,
                )
                bar.remove_task(qtask)
            answering = qa.Answering(
                model,
                user=transcript.user,
                character=transcript.character,
                card=transcript.system_prompt,
                judge_model=judge_model,
                seed=seed + r,
                judge_seed=seed,
            )
            total = sum(len(q["questions"]) for q in quizzes) * len(names)
            atask = bar.add_task(f"answering {r + 1}/{repeats}", total=total)
            for name, arm in arms.items():
                repeats_out[name].append(
                    answer_quizzes(
                        arm, quizzes, answering, advance=partial(bar.advance, atask), say=say
                    )
                )
            bar.remove_task(atask)
    if arms is not None:
        close_all(arms)

    return {
        "kind": KIND,
        "segments": quizzes,
        "failed_segments": sum(1 for q in quizzes if "error" in q),
        "strategies": {n: tally(repeats_out[n], len(quizzes)) for n in names},
        "runtime_s": round(time.monotonic() - started, 1),
        "pins": pins(
            profile=profile,
            counter=type(counter).__name__,
            summarizer=f"{type(summarizer).__name__}:{qa.model_name(getattr(summarizer, 'model', summarizer))}",
            models={
                "questions": qa.describe_model(model),
                "answer": qa.describe_model(model),
                "judge": qa.describe_model(judge_model),
            },
            prompts=chronicler_prompts(transcript.lang),
            seed=seed,
            data=data,
            profile_fitted=fitted,
            strategies=list(names),
            repeats=repeats,
            questions_per_segment=questions_per_segment,
            min_segment_tokens=min_segment_tokens,
            messages=len(transcript),
        ),
    }
