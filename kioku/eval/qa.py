"""The evaluation's model calls: write questions, answer them, grade the answers, audit memory.

Every prompt is a versioned template file in `kioku/eval/prompts/` (the version goes into the
report's pins). A reply that must be JSON is parsed strictly; a bad one (not JSON, the wrong
shape, the wrong number of questions, cut at max_tokens) is asked again with the reason, up to
`attempts` times, and then raises `BadEvalReply`: it is never turned into "no questions" or
"wrong" behind the caller's back. Callers that can go on without one answer record the failure
and count it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from kioku.errors import BadEvalReply, ConfigError, ModelError
from kioku.models import ChatMessage, ChatModel, ChatRequest
from kioku.prompts import PromptTemplate

from .strategies import Context

T = TypeVar("T")
DEFAULT_ATTEMPTS = 3
QUESTIONS_PER_SEGMENT = 8
_SECTION = re.compile(r"^=== ([a-z_]+) ===$", re.MULTILINE)
_VERSION = re.compile(r"^version:\s*(\S+)\s*$", re.MULTILINE)


@cache
def prompt(task: str) -> PromptTemplate:
    path = resources.files(__package__).joinpath("prompts", f"{task}.txt")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no evaluation prompt {task!r}") from None
    m = _VERSION.search(text.split("===", 1)[0])
    if not m:
        raise ConfigError(f"evaluation prompt {task}.txt has no 'version:' line")
    parts = _SECTION.split(text)
    sections = tuple(
        (parts[i], parts[i + 1].removeprefix("\n").rstrip()) for i in range(1, len(parts) - 1, 2)
    )
    return PromptTemplate(
        task=task, lang="en", version=f"eval-{task}-v{m.group(1)}", sections=sections
    )


def prompt_versions() -> dict[str, str]:
    return {t: prompt(t).version for t in ("questions", "answer", "judge", "audit")}


def _json_object(text: str) -> Any:
    fenced = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        candidates.append(text[start : end + 1])
    if not candidates:
        raise ValueError("no JSON object in the reply")
    error = ""
    for c in candidates:
        try:
            return json.loads(c)
        except json.JSONDecodeError as e:
            error = error or f"invalid JSON ({e.msg})"
    raise ValueError(error)


@dataclass(frozen=True)
class Asked:
    value: Any
    attempts: int
    text: str


def ask(
    model: ChatModel,
    task: str,
    messages: Sequence[ChatMessage],
    parse: Callable[[str], T],
    *,
    retry_values: Mapping[str, Any] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    max_tokens: int = 1024,
    temperature: float | None = None,
    seed: int | None = None,
) -> Asked:
    """Ask until `parse(reply)` succeeds; `parse` raises ValueError with the reason otherwise."""
    tpl = prompt(task)
    convo = list(messages)
    reason = ""
    text = ""
    extra = {"seed": seed} if seed is not None else {}
    for n in range(1, attempts + 1):
        c = model.complete(
            ChatRequest(
                tuple(convo),
                max_tokens=max_tokens,
                temperature=temperature,
                purpose="eval",
                extra=dict(extra),
            )
        )
        text = c.text
        try:
            if c.truncated:
                raise ValueError("the reply was cut at max_tokens")
            return Asked(parse(text), n, text)
        except ValueError as e:
            reason = str(e)
        if not tpl.has("retry"):
            continue
        convo = [
            *messages,
            ChatMessage("assistant", text),
            ChatMessage("user", tpl.render("retry", reason=reason, **(retry_values or {}))),
        ]
    raise BadEvalReply(task, reason, text)


# questions ---------------------------------------------------------------------------------------


def parse_questions(text: str, n: int) -> list[dict[str, str]]:
    obj = _json_object(text)
    items = obj.get("questions") if isinstance(obj, dict) else None
    if not isinstance(items, list):
        raise ValueError('the JSON has no "questions" list')
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise ValueError(f"question {i + 1} is not an object")
        q, a = it.get("question"), it.get("answer")
        if not isinstance(q, str) or not q.strip() or not isinstance(a, (str, int, float)):
            raise ValueError(f'question {i + 1} needs a non-empty "question" and an "answer"')
        if not str(a).strip():
            raise ValueError(f"question {i + 1} has an empty answer")
        out.append({"question": q.strip(), "answer": str(a).strip()})
    if len(out) != n:
        raise ValueError(f"expected exactly {n} questions, got {len(out)}")
    if len({q["question"].lower() for q in out}) != n:
        raise ValueError("two questions are the same")
    return out


def write_questions(
    model: ChatModel,
    transcript_text: str,
    *,
    first: int,
    last: int,
    user: str,
    character: str,
    n: int = QUESTIONS_PER_SEGMENT,
    seed: int | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Asked:
    tpl = prompt("questions")
    messages = [
        ChatMessage("system", tpl.render("system", user=user, character=character, n=n)),
        ChatMessage(
            "user",
            tpl.render("user", transcript=transcript_text, first=first, last=last, n=n),
        ),
    ]
    return ask(
        model,
        "questions",
        messages,
        lambda t: parse_questions(t, n),
        retry_values={"n": n},
        attempts=attempts,
        max_tokens=256 + 160 * n,
        temperature=0.3,
        seed=seed,
    )


# answers ------------------------------------------------------------------------------------------


def answer_messages(
    ctx: Context, *, user: str, character: str, card: str
) -> tuple[ChatMessage, ...]:
    """The strategy's context with the evaluation's instructions: its system prompt (the
    character card) becomes reference inside an answering system prompt, its memory exchange
    and raw window stay as they are, and the question closes it with any recollection."""
    tpl = prompt("answer")
    body = [m for m in ctx.before if m.role != "system"]
    recollections = f"{ctx.extra}\n\n" if ctx.extra else ""
    return (
        ChatMessage(
            "system", tpl.render("system", user=user, character=character, card=card or "-")
        ),
        *body,
        ChatMessage("user", tpl.render("user", recollections=recollections, question=ctx.question)),
    )


def answer(
    model: ChatModel,
    ctx: Context,
    *,
    user: str,
    character: str,
    card: str,
    seed: int | None = None,
) -> str:
    messages = answer_messages(ctx, user=user, character=character, card=card)
    extra = {"seed": seed} if seed is not None else {}
    c = model.complete(
        ChatRequest(messages, max_tokens=128, temperature=0.0, purpose="eval", extra=extra)
    )
    return c.text.strip()


@dataclass(frozen=True)
class Graded:
    """One question answered from one context, and graded when a judge is given."""

    given: str = ""
    correct: bool | None = None
    error: str = ""


@dataclass(frozen=True)
class Answering:
    """Who answers and who grades, for every question of one conversation: the answer loop of
    both `kioku eval forgetting` and `kioku eval locomo`."""

    model: ChatModel
    user: str
    character: str
    card: str
    judge_model: ChatModel | None = None
    seed: int | None = None  # the answers' (a repeat may change it)
    judge_seed: int | None = None

    def __call__(self, ctx: Context, question: str, gold: str) -> Graded:
        """A model error is recorded in the result, never raised and never a wrong answer."""
        given = ""
        try:
            given = answer(
                self.model,
                ctx,
                user=self.user,
                character=self.character,
                card=self.card,
                seed=self.seed,
            )
            if self.judge_model is None:
                return Graded(given)
            grade = judge(self.judge_model, question, gold, given, seed=self.judge_seed)
            return Graded(given, bool(grade.value))
        except ModelError as e:
            return Graded(given, None, f"{type(e).__name__}: {e}")


# grades -------------------------------------------------------------------------------------------


def parse_grade(text: str) -> bool:
    obj = _json_object(text)
    if not isinstance(obj, dict) or not isinstance(obj.get("correct"), bool):
        raise ValueError('the JSON needs "correct": true or false')
    return bool(obj["correct"])


def judge(
    model: ChatModel,
    question: str,
    gold: str,
    given: str,
    *,
    seed: int | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Asked:
    tpl = prompt("judge")
    messages = [
        ChatMessage("system", tpl.render("system")),
        ChatMessage("user", tpl.render("user", question=question, gold=gold, answer=given)),
    ]
    return ask(
        model,
        "judge",
        messages,
        parse_grade,
        attempts=attempts,
        max_tokens=64,
        temperature=0.0,
        seed=seed,
    )


# audit --------------------------------------------------------------------------------------------


def parse_audit(text: str) -> dict[str, list[dict[str, str]]]:
    obj = _json_object(text)
    if not isinstance(obj, dict):
        raise ValueError("the JSON is not an object")
    out: dict[str, list[dict[str, str]]] = {}
    for key in ("claims_as_fact", "resolved_left_open"):
        items = obj.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ValueError(f'"{key}" must be a list of objects')
        out[key] = [{k: str(v) for k, v in i.items()} for i in items]
    return out


def audit_item(
    model: ChatModel,
    transcript_text: str,
    memory_text: str,
    *,
    first: int,
    last: int,
    user: str,
    character: str,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Asked:
    tpl = prompt("audit")
    messages = [
        ChatMessage("system", tpl.render("system", user=user, character=character)),
        ChatMessage(
            "user",
            tpl.render(
                "user", transcript=transcript_text, memory=memory_text, first=first, last=last
            ),
        ),
    ]
    return ask(
        model, "audit", messages, parse_audit, attempts=attempts, max_tokens=1024, temperature=0.0
    )


def model_name(model: object) -> str:
    return str(getattr(model, "name", "") or type(model).__name__)


def describe_model(model: object | None) -> dict[str, Any] | None:
    """What to pin about a model: its name (URL or id) and, when the server lists them, the
    model ids it serves (`GET /models`); a server that does not answer is pinned as such."""
    if model is None:
        return None
    out: dict[str, Any] = {"name": model_name(model)}
    models = getattr(model, "models", None)
    if callable(models):
        try:
            out["served"] = list(models())
        except Exception as e:  # a pin must not abort the run it describes
            out["served"] = f"unavailable ({type(e).__name__})"
    return out
