"""The LLM chronicler: a model writes each chapter and synopsis; code decides what may be stored.

The seed learned that the guards belong in code, not in the prompt: a refusal ("I can't help with
that", 101 chars against 519 for the shortest real summary) stored as memory sits in every prompt
after it; a summary cut at max_tokens loses its end, which is where the open threads were; a
prompt telling the model "don't repeat tics" does not stop it. So every reply passes these checks
before it becomes a `Summary`:

- `finish_reason == "length"` → never stored; asked again with max_tokens at the ceiling.
- short and holding a stock refusal phrase (ja/en/zh) → a refusal; asked once more, then the
  extractive chronicler writes the chapter instead (`source="extractive"`, events "fallback").
- not the JSON shape of `structure.py` → never stored; asked again with the reason.
- verbal tics (`task.avoid_phrases`) and "she often says …" are cut from the record.
- "verbatim" key lines that are not in the transcript are dropped.
- longer than the target → the model compresses it again (another request), never truncated.

The flow is written once, without I/O: `chronicle(task, ...)` is a generator that yields each
`ChatRequest` and receives the `Completion`. `LLMChronicler` drives it with a sync model,
`AsyncLLMChronicler` with an async one. Every `Summary` lists what happened on the way in
`events` (refusal, truncated, unparseable, retry, compress, fallback, ...) for the compaction log.
Model errors (timeouts, a dead server) are not bad summaries: they propagate, and the job is
retried by the worker.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from kioku.corrections import apply_edits, edits_of
from kioku.errors import BadSummary
from kioku.memory import MemoryItem
from kioku.models import ChatMessage, ChatModel, ChatRequest, Completion
from kioku.prompts import PromptTemplate, resolve_lang, template
from kioku.structure import (
    Record,
    Thread,
    carry_threads,
    entry_sources,
    is_structured,
    merge_threads,
    parse_record,
    record_from_data,
    record_sources,
    remove_phrases,
    render_record,
    render_threads,
    verify_key_lines,
)
from kioku.summarizer import Summarizer, Summary, SummaryTask
from kioku.tokens import TokenCounter
from kioku.transcript import render_transcript

DEFAULT_REFUSAL_CHARS = 400  # seed: refusal 101 chars, shortest real summary 519

# Stock refusal phrases, all languages at once: a model may refuse in English in a Japanese
# conversation. Matched case-insensitively, only in short replies.
REFUSAL_PHRASES: tuple[str, ...] = (
    "i can't",
    "i cannot",
    "i can not",
    "i'm sorry",
    "i am sorry",
    "i'm unable",
    "i am unable",
    "i won't",
    "i will not",
    "as an ai",
    "can't help with",
    "cannot help with",
    "can't assist",
    "cannot assist",
    "can't comply",
    "cannot comply",
    "できません",
    "申し訳ありません",
    "申し訳ございません",
    "お手伝いでき",
    "お答えでき",
    "控えさせていただ",
    "我不能",
    "无法",
    "抱歉",
    "对不起",
    "作为一个人工智能",
    "作为ai",
    "不能提供",
)

# How a token target reads in the prompt: models cannot count tokens, they can count words
# (en) and characters (ja, zh). Output chars per token in the seed: ja 1.2-1.3, zh 1.2, en 4.7.
UNITS_PER_TOKEN = {"en": 0.75, "ja": 1.25, "zh": 1.2}
UNNAMED = {"en": "(unnamed)", "ja": "(名前なし)", "zh": "(未命名)"}
QUOTES = {"en": ('"', '"', ", "), "ja": ("「", "」", "、"), "zh": ("“", "”", "、")}


@dataclass(frozen=True)
class ChroniclerConfig:
    max_attempts: int = 3  # requests for one record before the extractive fallback
    max_refusals: int = 2  # the second refusal falls back at once (seed: retry once)
    compress_rounds: int = 2  # requests to shorten an over-long record
    over_target: float = 1.3  # a record above target * this is compressed
    max_tokens_factor: float = 2.0  # first request: max_tokens = target * factor + overhead
    max_tokens_overhead: int = 256  # the JSON keys cost tokens the target does not count
    max_key_lines: int = 5
    temperature: float | None = None
    refusal_chars: int = DEFAULT_REFUSAL_CHARS
    # Gemma's chat templates have no system role (llama-cpp-python's "gemma" format drops it):
    # with False the instructions open the user turn instead.
    system_role: bool = True


DEFAULT_CONFIG = ChroniclerConfig()


@dataclass(frozen=True)
class GaveUp:
    """The flow's answer when no reply could be stored: the caller falls back."""

    reason: str
    events: tuple[str, ...]
    attempts: int
    input_tokens: int
    model: str


def is_refusal(text: str, max_chars: int = DEFAULT_REFUSAL_CHARS) -> bool:
    t = text.strip().replace("’", "'").lower()
    return len(t) < max_chars and any(p in t for p in REFUSAL_PHRASES)


def first_max_tokens(task: SummaryTask, config: ChroniclerConfig = DEFAULT_CONFIG) -> int:
    """max_tokens of the first request: room for the target plus the JSON around it. A reply
    that still hits it is asked again at the ceiling."""
    want = int(task.target_tokens * config.max_tokens_factor) + config.max_tokens_overhead
    return min(task.ceiling_tokens, want)


def target_units(target_tokens: int, lang: str) -> int:
    n = target_tokens * UNITS_PER_TOKEN[resolve_lang(lang)]
    return max(10, int(round(n / 10.0)) * 10)


def context_items(task: SummaryTask) -> list[MemoryItem]:
    """The memory the record continues: for a chapter or cut, the current synopsis and chapters
    (their open threads are offered so the model reuses the ids); for a synopsis, what it folds."""
    return ([task.previous] if task.previous else []) + list(task.chapters)


def _item_text(item: MemoryItem, lang: str) -> str:
    body = (
        render_record(record_from_data(item.data), lang) if is_structured(item.data) else item.text
    )
    if is_structured(item.data) and item.data.get("operator_edits"):
        body = apply_edits(body, edits_of(item))  # what an operator retracted stays out
    return f"[#{item.first_seq}–#{item.last_seq}]\n{body.strip()}"


def _phrases(phrases: Sequence[str], lang: str) -> str:
    o, c, sep = QUOTES[resolve_lang(lang)]
    return sep.join(f"{o}{p}{c}" for p in phrases if p.strip())


def _open_threads(threads: Sequence[Thread], tpl: PromptTemplate, lang: str) -> str:
    open_ = [t for t in threads if t.status == "open"]
    return render_threads(open_, lang) if open_ else tpl.render("none")


def _common(task: SummaryTask, tpl: PromptTemplate, config: ChroniclerConfig) -> dict[str, Any]:
    lang = tpl.lang
    first, last = task.span
    return {
        "user_name": task.user_name or "user",
        "character": task.character or UNNAMED[lang],
        "target_length": tpl.render("length", n=target_units(task.target_tokens, lang)),
        "max_key_lines": config.max_key_lines,
        "avoid": tpl.render("avoid", phrases=_phrases(task.avoid_phrases, lang))
        if any(p.strip() for p in task.avoid_phrases)
        else "",
        "first": first,
        "last": last,
    }


def _messages(
    tpl: PromptTemplate, values: dict[str, Any], config: ChroniclerConfig
) -> tuple[ChatMessage, ...]:
    system = tpl.render("system", **values)
    user = tpl.render("user", **values)
    if config.system_role:
        return (ChatMessage("system", system), ChatMessage("user", user))
    return (ChatMessage("user", f"{system}\n\n{user}"),)


def build_request(
    task: SummaryTask,
    max_tokens: int,
    config: ChroniclerConfig = DEFAULT_CONFIG,
    retry_reason: str | None = None,
) -> tuple[ChatRequest, str]:
    """The request for the task's own prompt (chapter, cut or synopsis) and its prompt version."""
    tpl = template(task.kind, task.lang)
    lang = tpl.lang
    values = _common(task, tpl, config)
    values["open_threads"] = _open_threads(merge_threads(context_items(task)), tpl, lang)
    values["retry"] = tpl.render("retry", reason=retry_reason) if retry_reason else ""
    if task.kind == "synopsis":
        values["records"] = "\n\n".join(_item_text(i, lang) for i in context_items(task))
    else:
        values["transcript"] = render_transcript(task.entries, lang)
    request = ChatRequest(
        messages=_messages(tpl, values, config),
        max_tokens=max_tokens,
        temperature=config.temperature,
        purpose=task.kind,
    )
    return request, tpl.version


def build_compress_request(
    task: SummaryTask,
    record: Record,
    tokens: int,
    max_tokens: int,
    config: ChroniclerConfig = DEFAULT_CONFIG,
    retry_reason: str | None = None,
) -> tuple[ChatRequest, str]:
    tpl = template("compress", task.lang)
    values = _common(task, tpl, config)
    values["tokens"] = tokens
    values["record"] = json.dumps(record.to_json(), ensure_ascii=False, indent=1)
    values["retry"] = tpl.render("retry", reason=retry_reason) if retry_reason else ""
    request = ChatRequest(
        messages=_messages(tpl, values, config),
        max_tokens=max_tokens,
        temperature=config.temperature,
        purpose=task.kind,
    )
    return request, tpl.version


def judge(completion: Completion, span: tuple[int, int], config: ChroniclerConfig) -> Record:
    """Accept a reply as a record or raise `BadSummary` saying why: "truncated", "refusal",
    "unparseable: ...". A cut reply is never parsed. A reply that fails to parse is a refusal when
    it is short and holds a stock phrase; one that parses as a record is not, so a short Chinese
    chapter where someone "无法入睡" is not mistaken for a refusal."""
    if completion.finish_reason == "length":
        raise BadSummary("truncated", completion.text)
    try:
        return parse_record(completion.text, span)
    except BadSummary:
        if is_refusal(completion.text, config.refusal_chars):
            raise BadSummary("refusal", completion.text) from None
        raise


def _event_of(error: BadSummary) -> str:
    return error.reason.split(":", 1)[0]


Flow = Generator[ChatRequest, Completion, "Summary | GaveUp"]


def chronicle(
    task: SummaryTask,
    counter: TokenCounter,
    config: ChroniclerConfig = DEFAULT_CONFIG,
) -> Flow:
    """The whole chronicler as a generator: yields requests, receives completions, returns the
    `Summary` to store or `GaveUp` (the caller falls back). No I/O happens here."""
    lang = resolve_lang(task.lang)
    span = task.span
    before = merge_threads(context_items(task))
    if task.kind == "synopsis":
        inputs = [record_from_data(i.data) for i in context_items(task) if is_structured(i.data)]
        sources = record_sources(inputs)
        for item in context_items(task):  # extractive items keep their lines verbatim
            for ln in item.data.get("lines", ()) if not is_structured(item.data) else ():
                sources.setdefault(int(ln["seq"]), []).append(str(ln["text"]))
    else:
        sources = entry_sources(task.entries)

    events: list[str] = []
    attempts = 0
    refusals = 0
    input_tokens = output_tokens = 0
    model = ""
    max_tokens = first_max_tokens(task, config)
    reason: str | None = None
    record: Record | None = None
    version = ""

    def tally(c: Completion) -> None:
        nonlocal input_tokens, output_tokens, model
        input_tokens += c.usage.prompt_tokens
        output_tokens += c.usage.completion_tokens
        model = c.model or model

    while attempts < config.max_attempts:
        attempts += 1
        request, version = build_request(task, max_tokens, config, reason)
        completion = yield request
        tally(completion)
        try:
            record = judge(completion, span, config)
            break
        except BadSummary as e:
            events.append(_event_of(e))
            if e.reason == "truncated":
                max_tokens = task.ceiling_tokens
                reason = None
            elif e.reason == "refusal":
                refusals += 1
                reason = None  # refusals are a roll of the dice: ask the same thing again
                if refusals >= config.max_refusals:
                    break
            else:
                reason = e.reason.split(": ", 1)[-1]
            if attempts < config.max_attempts:
                events.append("retry")
    if record is None:
        last = events[-1] if events else "no attempt"
        return GaveUp(last, tuple(events), attempts, input_tokens, model)

    def polish(r: Record, threads_before: Sequence[Thread]) -> Record:
        if task.kind == "synopsis" or threads_before:
            r = carry_threads(r, threads_before, drop_resolved=task.kind == "synopsis")
        r, tics = remove_phrases(r, task.avoid_phrases)
        if tics:
            events.append("tics_removed")
        r, dropped = verify_key_lines(r, sources)
        if dropped:
            events.append("key_lines_dropped")
        return r

    record = polish(record, before if task.kind == "synopsis" else [])
    text = render_record(record, lang)
    tokens = counter.count(text)

    limit = task.target_tokens * config.over_target
    rounds = 0
    compress_max = first_max_tokens(task, config)
    compress_reason: str | None = None
    while tokens > limit and rounds < config.compress_rounds:
        rounds += 1
        attempts += 1
        events.append("compress")
        request, cversion = build_compress_request(
            task, record, tokens, compress_max, config, compress_reason
        )
        completion = yield request
        tally(completion)
        try:
            shorter = judge(completion, span, config)
        except BadSummary as e:
            events.append(_event_of(e))
            if e.reason == "truncated":
                compress_max = task.ceiling_tokens
            compress_reason = None if e.reason in ("truncated", "refusal") else e.reason
            continue
        shorter = polish(shorter, merge_threads([{**record.to_data(lang)}]))
        new_text = render_record(shorter, lang)
        new_tokens = counter.count(new_text)
        if new_tokens < tokens:
            record, text, tokens = shorter, new_text, new_tokens
            if "+" not in version:
                version = f"{version}+{cversion}"
    if tokens > limit:
        events.append("over_target")

    data = record.to_data(lang)
    data["usage"] = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens}
    return Summary(
        text=text,
        tokens=tokens,
        source="llm",
        model=model,
        prompt_version=version,
        data=data,
        input_tokens=input_tokens,
        attempts=attempts,
        events=tuple(events),
    )


T = TypeVar("T")


def drive(
    flow: Generator[ChatRequest, Completion, T], complete: Callable[[ChatRequest], Completion]
) -> T:
    """Run a flow against a sync model."""
    try:
        request = next(flow)
        while True:
            request = flow.send(complete(request))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(
    flow: Generator[ChatRequest, Completion, T],
    complete: Callable[[ChatRequest], Awaitable[Completion]],
) -> T:
    """Run a flow against an async model."""
    try:
        request = next(flow)
        while True:
            request = flow.send(await complete(request))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def finish(result: Summary | GaveUp, task: SummaryTask, fallback: Summarizer) -> Summary:
    """A stored summary, or the fallback's when the model gave nothing storable."""
    if isinstance(result, Summary):
        return result
    fb = fallback.summarize(task)
    return replace(
        fb,
        events=(*result.events, "fallback"),
        attempts=result.attempts,
        input_tokens=result.input_tokens or fb.input_tokens,
    )


class LLMChronicler:
    """`Summarizer` backed by a chat model, with the extractive chronicler as its fallback."""

    def __init__(
        self,
        model: ChatModel,
        counter: TokenCounter,
        fallback: Summarizer,
        config: ChroniclerConfig = DEFAULT_CONFIG,
    ) -> None:
        self.model = model
        self.counter = counter
        self.fallback = fallback
        self.config = config

    def summarize(self, task: SummaryTask) -> Summary:
        result = drive(chronicle(task, self.counter, self.config), self.model.complete)
        return finish(result, task, self.fallback)


class AsyncChatModel(Protocol):
    async def complete(self, request: ChatRequest) -> Completion: ...


class AsyncLLMChronicler:
    """The same flow, driven by an async chat model (e.g. `client.AsyncOpenAIChatModel`)."""

    def __init__(
        self,
        model: AsyncChatModel,
        counter: TokenCounter,
        fallback: Summarizer,
        config: ChroniclerConfig = DEFAULT_CONFIG,
    ) -> None:
        self.model = model
        self.counter = counter
        self.fallback = fallback
        self.config = config

    async def summarize(self, task: SummaryTask) -> Summary:
        result = await adrive(chronicle(task, self.counter, self.config), self.model.complete)
        return finish(result, task, self.fallback)
