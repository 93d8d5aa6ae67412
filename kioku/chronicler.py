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
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from kioku.corrections import edits_of
from kioku.errors import BadSummary
from kioku.memory import MemoryItem
from kioku.models import ChatMessage, ChatModel, ChatRequest, Completion
from kioku.operator_edits import apply_edits
from kioku.prompts import PromptTemplate, resolve_lang, template
from kioku.rendering import render_record, render_threads
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


@dataclass
class _Run:
    """What one chronicle run has spent and seen so far: requests, tokens, guard events."""

    events: list[str] = field(default_factory=list)
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""

    def ask(
        self, request: ChatRequest, span: tuple[int, int], config: ChroniclerConfig
    ) -> Generator[ChatRequest, Completion, Record | BadSummary]:
        """One request: the record the reply holds, or why it was rejected (an event)."""
        self.attempts += 1
        completion = yield request
        self.input_tokens += completion.usage.prompt_tokens
        self.output_tokens += completion.usage.completion_tokens
        self.model = completion.model or self.model
        try:
            return judge(completion, span, config)
        except BadSummary as e:
            self.events.append(_event_of(e))
            return e


def _next_try(e: BadSummary, task: SummaryTask, max_tokens: int) -> tuple[int, str | None]:
    """After a rejected reply: the next request's max_tokens and the reason it names. A cut
    reply gets the task's whole ceiling; a refusal is a roll of the dice: ask the same again."""
    if e.reason == "truncated":
        return task.ceiling_tokens, None
    if e.reason == "refusal":
        return max_tokens, None
    return max_tokens, e.reason.split(": ", 1)[-1]


def chronicle(
    task: SummaryTask,
    counter: TokenCounter,
    config: ChroniclerConfig = DEFAULT_CONFIG,
) -> Flow:
    """The whole chronicler as a generator: yields requests, receives completions, returns the
    `Summary` to store or `GaveUp` (the caller falls back). No I/O happens here."""
    run = _Run()
    written = yield from _write(task, config, run)
    if written is None:
        last = run.events[-1] if run.events else "no attempt"
        return GaveUp(last, tuple(run.events), run.attempts, run.input_tokens, run.model)
    record, version = written
    polish = _Polish(task, run.events)
    record = polish(record, merge_threads(context_items(task)) if task.kind == "synopsis" else [])
    record, version = yield from _compress(task, counter, config, run, record, version, polish)
    lang = resolve_lang(task.lang)
    text = render_record(record, lang)
    data = record.to_data(lang)
    data["usage"] = {"prompt_tokens": run.input_tokens, "completion_tokens": run.output_tokens}
    return Summary(
        text=text,
        tokens=counter.count(text),
        source="llm",
        model=run.model,
        prompt_version=version,
        data=data,
        input_tokens=run.input_tokens,
        attempts=run.attempts,
        events=tuple(run.events),
    )


def _write(
    task: SummaryTask, config: ChroniclerConfig, run: _Run
) -> Generator[ChatRequest, Completion, tuple[Record, str] | None]:
    """Ask for the record until one passes the guards: (record, prompt version), or None after
    `max_attempts` requests or `max_refusals` refusals."""
    max_tokens = first_max_tokens(task, config)
    reason: str | None = None
    refusals = 0
    while run.attempts < config.max_attempts:
        request, version = build_request(task, max_tokens, config, reason)
        got = yield from run.ask(request, task.span, config)
        if isinstance(got, Record):
            return got, version
        max_tokens, reason = _next_try(got, task, max_tokens)
        if got.reason == "refusal":
            refusals += 1
            if refusals >= config.max_refusals:
                break
        if run.attempts < config.max_attempts:
            run.events.append("retry")
    return None


def _compress(
    task: SummaryTask,
    counter: TokenCounter,
    config: ChroniclerConfig,
    run: _Run,
    record: Record,
    version: str,
    polish: _Polish,
) -> Generator[ChatRequest, Completion, tuple[Record, str]]:
    """An over-long record is compressed again by the model, never truncated: up to
    `compress_rounds` requests, each kept only if it came out shorter."""
    lang = resolve_lang(task.lang)
    tokens = counter.count(render_record(record, lang))
    limit = task.target_tokens * config.over_target
    max_tokens = first_max_tokens(task, config)
    reason: str | None = None
    for _ in range(config.compress_rounds):
        if tokens <= limit:
            break
        run.events.append("compress")
        request, cversion = build_compress_request(task, record, tokens, max_tokens, config, reason)
        got = yield from run.ask(request, task.span, config)
        if isinstance(got, BadSummary):
            max_tokens, reason = _next_try(got, task, max_tokens)
            continue
        shorter = polish(got, merge_threads([{**record.to_data(lang)}]))
        shorter_tokens = counter.count(render_record(shorter, lang))
        if shorter_tokens < tokens:
            record, tokens = shorter, shorter_tokens
            if "+" not in version:
                version = f"{version}+{cversion}"
    if tokens > limit:
        run.events.append("over_target")
    return record, version


class _Polish:
    """What every accepted record goes through: threads carried over from the memory before
    it, verbal tics removed, key lines checked against their sources (each fix is an event)."""

    def __init__(self, task: SummaryTask, events: list[str]) -> None:
        self.task = task
        self.events = events
        self.sources = _sources(task)

    def __call__(self, r: Record, threads_before: Sequence[Thread]) -> Record:
        task = self.task
        if task.kind == "synopsis" or threads_before:
            r = carry_threads(r, threads_before, drop_resolved=task.kind == "synopsis")
        r, tics = remove_phrases(r, task.avoid_phrases)
        if tics:
            self.events.append("tics_removed")
        r, dropped = verify_key_lines(r, self.sources)
        if dropped:
            self.events.append("key_lines_dropped")
        return r


def _sources(task: SummaryTask) -> dict[int, list[str]]:
    """The text behind each seq a key line may quote: the messages, or for a synopsis the key
    lines its inputs kept (an extractive item's lines verbatim)."""
    if task.kind != "synopsis":
        return entry_sources(task.entries)
    inputs = [record_from_data(i.data) for i in context_items(task) if is_structured(i.data)]
    sources = record_sources(inputs)
    for item in context_items(task):
        for ln in item.data.get("lines", ()) if not is_structured(item.data) else ():
            sources.setdefault(int(ln["seq"]), []).append(str(ln["text"]))
    return sources


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
        result: T = stop.value
        return result


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
        result: T = stop.value
        return result


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
