"""The LLM chronicler: a model writes each chapter and synopsis; code decides what may be stored.

The seed learned that the guards belong in code, not in the prompt: a refusal ("I can't help with
that", 101 chars against 519 for the shortest real summary) stored as memory sits in every prompt
after it; a summary cut at max_tokens loses its end, which is where the open threads were; a
prompt telling the model "don't repeat tics" does not stop it. Models taught the rest: one
copies the prompt's example, swaps names and cites messages that do not say what it wrote. So
every reply passes these checks before it becomes a `Summary`:

- `finish_reason == "length"` → never stored; asked again with max_tokens at the ceiling, but
  never past the window (`SummaryTask.window_tokens`: prompt + max_tokens fit in it).
- short and holding a stock refusal phrase (ja/en/zh) → a refusal; asked once more, then the
  extractive chronicler writes the chapter instead (`source="extractive"`, events "fallback",
  and why in `data["fallback"]`, `kioku.outcomes`).
- neither lines of the reply format (`kioku.reply_format`) nor the JSON record → never stored;
  asked again with the reason.
- every line grounded in the messages it cites (`kioku.grounding`): a line
  that fails is dropped (an event per drop: "dropped_name", "dropped_author", …) or replaced by
  its message's own words; a record with less than `min_grounded_share` of its lines grounded
  is rejected ("ungrounded"), asked again with examples, then falls back. The share is stored
  with the summary (`data["grounding"]`).
- verbal tics (`task.avoid_phrases`) and "she often says …" are cut from the record.
- longer than the target → a synopsis is compressed again by the model (another request,
  grounded again), never truncated; a chapter, a list of independent lines, leaves out its
  least informative whole lines in code ("trimmed"); shorter → the room is filled with the
  span's own lines, verbatim.

The flow is written once, without I/O: `chronicle(task, ...)` is a generator that yields each
`ChatRequest` and receives the `Completion`. `LLMChronicler` drives it with a sync model,
`AsyncLLMChronicler` with an async one. Every `Summary` lists what happened on the way in
`events` (refusal, truncated, unparseable, retry, compress, fallback, ...) for the compaction log.
Model errors (timeouts, a dead server) are not bad summaries: they propagate, and the job is
retried by the worker.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kioku.chronicle_prompt import (
    build_compress_request,
    build_request,
    context_items,
    max_lines,
)
from kioku.errors import BadSummary, Ungrounded
from kioku.flows import adrive, drive
from kioku.grounding.check import Evidence
from kioku.grounding.choice import Item, choose, drafted, item_text, span_candidates, trim
from kioku.grounding.evidence import known_threads, task_evidence
from kioku.grounding.records import (
    MIN_SHARE,
    Grounding,
    cited,
    ground_record,
    item_of_line,
    record_from_reply,
    replace_dropped,
)
from kioku.models import ChatModel, ChatRequest, Completion
from kioku.outcomes import FALLBACK, fallback_data
from kioku.prompts import resolve_lang
from kioku.refusal import DEFAULT_REFUSAL_CHARS, is_refusal
from kioku.rendering import render_record
from kioku.reply_format import looks_like_json, parse_lines, without_phrases
from kioku.scenes import Scene, scenes, scenes_in, scenes_of
from kioku.structure import (
    Record,
    Thread,
    carry_threads,
    is_structured,
    merge_threads,
    parse_record,
    record_from_data,
    remove_phrases,
)
from kioku.summarizer import Line, Summarizer, Summary, SummaryTask, stored_lines
from kioku.tokens import TokenCounter

# A chronicle is a reading, not a story: a low temperature keeps a model on the text
# (and a retry after a refusal still gets another roll)
DEFAULT_TEMPERATURE = 0.2
MESSAGE_OVERHEAD_TOKENS = 8  # the chat template's tokens around each message


@dataclass(frozen=True)
class ChroniclerConfig:
    max_attempts: int = 3  # requests for one record before the extractive fallback
    max_refusals: int = 2  # the second refusal falls back at once (seed: retry once)
    compress_rounds: int = 2  # requests to shorten an over-long record
    over_target: float = 1.3  # a record above target * this is compressed
    # first request: max_tokens = target * factor + overhead (the facts asked for fit in the
    # target; a model that loops stops sooner, and a cut reply is asked again)
    max_tokens_factor: float = 1.0
    max_tokens_overhead: int = 256  # the line and thread markup costs tokens the target does not
    temperature: float | None = DEFAULT_TEMPERATURE
    refusal_chars: int = DEFAULT_REFUSAL_CHARS
    # Some chat templates have no system role (they drop it, or raise): with False the
    # instructions open the user turn instead.
    system_role: bool = True
    min_grounded_share: float = MIN_SHARE  # below it a record is rejected
    replace_dropped: bool = True  # a dropped line about its message: that message's own words
    fill: bool = True  # chosen together with the lines it could keep (`choice.choose`)
    window_margin: int = 64  # tokens kept free of prompt + max_tokens (the count may estimate)


DEFAULT_CONFIG = ChroniclerConfig()


@dataclass(frozen=True)
class GaveUp:
    """The flow's answer when no reply could be stored: the caller falls back."""

    reason: str
    events: tuple[str, ...]
    attempts: int
    input_tokens: int
    model: str
    output_tokens: int = 0
    groundings: tuple[Grounding, ...] = ()
    detail: str = ""  # what the last rejection said, for the stand-in's mark and the log


def first_max_tokens(task: SummaryTask, config: ChroniclerConfig = DEFAULT_CONFIG) -> int:
    """max_tokens of the first request: room for the target plus the markup around it. A reply
    that still hits it is asked again at the ceiling."""
    want = int(task.target_tokens * config.max_tokens_factor) + config.max_tokens_overhead
    return min(task.ceiling_tokens, want)


def prompt_tokens(request: ChatRequest, counter: TokenCounter) -> int:
    return sum(counter.count(m.content) + MESSAGE_OVERHEAD_TOKENS for m in request.messages)


def room(
    request: ChatRequest, task: SummaryTask, counter: TokenCounter, config: ChroniclerConfig
) -> int | None:
    """The most max_tokens this request may ask for inside the window (None: no window)."""
    if task.window_tokens is None:
        return None
    return task.window_tokens - prompt_tokens(request, counter) - config.window_margin


def judge(
    completion: Completion,
    ev: Evidence,
    config: ChroniclerConfig,
    threads: dict[str, str] | None = None,
    avoid: Sequence[str] = (),
    salvage: bool = False,
) -> tuple[Record, Grounding, int]:
    """Accept a reply as a grounded record (and how many verbal tics came out of it first) or
    raise `BadSummary` saying why: "truncated", "refusal", "unparseable: ...", "ungrounded:
    ...". A cut reply is read only with `salvage` (a chapter's lines, each its own fact, and
    the chapter's room is filled from its messages; a cut synopsis would forget what it did
    not reach), and only its whole lines. A reply that fails to parse is a refusal when it is short
    and holds a stock phrase; one that parses is not, so a short Chinese chapter where someone
    "无法入睡" is not mistaken for a refusal."""
    text = completion.text
    cut = completion.finish_reason == "length"
    if cut and not salvage:
        raise BadSummary("truncated", text)
    if cut:
        # a cut line-form reply keeps its whole lines (a model that loops does so until max_tokens,
        # after lines worth keeping): they are grounded like any; a cut JSON record is lost
        whole = text.rsplit("\n", 1)[0] if "\n" in text.strip() else ""
        if looks_like_json(text) or not whole.strip():
            raise BadSummary("truncated", text)
        text = whole
    try:
        if looks_like_json(text):
            parsed, tics = remove_phrases(parse_record(text, None), avoid)  # type: ignore[arg-type]
            record, grounding = ground_record(parsed, ev, threads)
        else:
            lines, tics = without_phrases(parse_lines(text), avoid)
            record, grounding = record_from_reply(lines, ev, threads)
    except BadSummary:
        if cut:
            raise BadSummary("truncated", completion.text) from None
        if is_refusal(text, config.refusal_chars):
            raise BadSummary("refusal", text) from None
        raise
    if grounding.share < config.min_grounded_share or record.is_empty():
        if cut:
            raise BadSummary("truncated", completion.text)
        raise Ungrounded(grounding.rejection(), text, grounding)
    return record, grounding, tics


def _event_of(error: BadSummary) -> str:
    return error.reason.split(":", 1)[0]


Flow = Generator[ChatRequest, Completion, "Summary | GaveUp"]


@dataclass
class _Run:
    """What one chronicle run has spent and seen so far: requests, tokens, guard events, and
    the grounding of every reply that parsed."""

    task: SummaryTask
    counter: TokenCounter
    config: ChroniclerConfig
    ev: Evidence
    events: list[str] = field(default_factory=list)
    groundings: list[Grounding] = field(default_factory=list)
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    scenes: Mapping[int, Scene] = field(default_factory=dict)  # where the span's scenes start
    rejected: str = ""  # why the last reply was rejected ("unparseable: …")

    def ask(
        self, request: ChatRequest, threads: dict[str, str] | None = None, salvage: bool = False
    ) -> Generator[ChatRequest, Completion, tuple[Record, Grounding] | BadSummary]:
        """One request: the grounded record the reply holds, or why it was rejected."""
        self.attempts += 1
        completion = yield request
        self.input_tokens += completion.usage.prompt_tokens
        self.output_tokens += completion.usage.completion_tokens
        self.model = completion.model or self.model
        try:
            record, grounding, tics = judge(
                completion, self.ev, self.config, threads, self.task.avoid_phrases, salvage
            )
        except BadSummary as e:
            self.events.append(_event_of(e))
            self.rejected = e.reason
            if isinstance(e, Ungrounded):
                self.groundings.append(e.grounding)
            return e
        self.groundings.append(grounding)
        if completion.finish_reason == "length":
            self.events.append("salvaged")  # a cut reply whose whole lines were grounded
        if tics:
            self.events.append("tics_removed")
        return record, grounding

    def fit(self, request: ChatRequest) -> ChatRequest | None:
        """The request with max_tokens inside the window, or None when nothing fits."""
        left = room(request, self.task, self.counter, self.config)
        if left is None or request.max_tokens <= left:
            return request
        if left < 64:
            return None
        return replace(request, max_tokens=left)

    def gave_up(self, reason: str) -> GaveUp:
        return GaveUp(
            reason,
            tuple(self.events),
            self.attempts,
            self.input_tokens,
            self.model,
            self.output_tokens,
            tuple(self.groundings),
            self.rejected,
        )


def _next_try(e: BadSummary, task: SummaryTask, max_tokens: int) -> tuple[int, str | None]:
    """After a rejected reply: the next request's max_tokens and the reason it names. A cut
    reply gets half as much room again (up to the ceiling, and within the window) and is told
    to stop sooner: the facts asked for fit the first request's room, and a model that ran
    out of it was looping (given the whole window, such a reply used under half of it); a refusal
    is a roll of the dice: ask the same again."""
    if e.reason == "truncated":
        n = max_lines(task.target_tokens, task.lang)
        cut = f"the answer was cut at {max_tokens} tokens: write at most {n} facts and stop"
        return min(task.ceiling_tokens, max_tokens * 3 // 2), cut
    if e.reason == "refusal":
        return max_tokens, None
    return max_tokens, e.reason.split(": ", 1)[-1]


def task_scenes(task: SummaryTask) -> dict[int, Scene]:
    """The scenes a record's lines can fall in: its messages' own, and for a synopsis those of
    the items it folds."""
    known: dict[int, Scene] = {}
    if task.kind == "synopsis":
        for item in context_items(task):
            known.update(scenes_in(item.data))
    known.update({sc.first_seq: sc for sc in scenes(task.entries)})
    return known


def chronicle(
    task: SummaryTask,
    counter: TokenCounter,
    config: ChroniclerConfig = DEFAULT_CONFIG,
) -> Flow:
    """The whole chronicler as a generator: yields requests, receives completions, returns the
    `Summary` to store or `GaveUp` (the caller falls back). No I/O happens here."""
    run = _Run(task, counter, config, task_evidence(task), scenes=task_scenes(task))
    written = yield from _write(run)
    if written is None:
        last = run.events[-1] if run.events else "no attempt"
        return run.gave_up(last)
    record, grounding, version = written
    polish = _Polish(task, run.events)
    record = polish(record, merge_threads(context_items(task)) if task.kind == "synopsis" else [])
    record, grounding, version = yield from _compress(run, record, grounding, version, polish)
    record, grounding, added = _complete(task, record, grounding, counter, config, run.scenes)
    run.events.extend(grounding.events())
    lang = resolve_lang(task.lang)
    used = scenes_of(cited(record), run.scenes)
    text = render_record(record, lang, {sc.first_seq: sc for sc in used})
    data = record.to_data(lang)
    if used:  # the date and people of each scene the lines fall in, shown in memory
        data["scenes"] = [sc.to_json() for sc in used]
    data["usage"] = {"prompt_tokens": run.input_tokens, "completion_tokens": run.output_tokens}
    data["grounding"] = {**grounding.to_json(), "attempts": [g.to_json() for g in run.groundings]}
    if added:  # the span's own words, verbatim: what the model wrote is the rest
        data["added"] = added
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


def _complete(
    task: SummaryTask,
    record: Record,
    grounding: Grounding,
    counter: TokenCounter,
    config: ChroniclerConfig,
    scenes: Mapping[int, Scene],
) -> tuple[Record, Grounding, list[dict[str, Any]]]:
    """The record chosen from the model's lines and the lines it could have kept: a chapter's
    messages, a synopsis's folded items (`choice.choose`); without `fill`, a chapter's
    dropped lines replaced by their messages' words. Returns what was added, so the model's
    own part of the record stays known."""
    lang = resolve_lang(task.lang)
    replaced: list[Any] = []
    filled: list[Any] = []
    if config.fill and (task.kind == "synopsis" or task.entries):
        candidates, groups = _candidates(task, lang)
        record, filled, left_out = choose(
            record,
            candidates,
            task.target_tokens,
            counter,
            lang,
            task.avoid_phrases,
            scenes,
            groups,
        )
        grounding = replace(grounding, trimmed=grounding.trimmed + left_out)
    elif config.replace_dropped and task.kind != "synopsis" and task.entries:
        record, replaced = replace_dropped(
            record, grounding, task.entries, lang, task.avoid_phrases
        )
    added = [
        {"seq": it.seq, "text": item_text(it), "why": why}
        for why, items in (("replaced", replaced), ("filled", filled))
        for it in items
    ]
    return record, replace(grounding, replaced=len(replaced), filled=len(filled)), added


def _candidates(
    task: SummaryTask, lang: str
) -> tuple[list[tuple[Item, Line]], list[tuple[int, int]]]:
    """What a record may keep besides the model's lines: a chapter, its messages' lines; a
    synopsis, the lines of the synopsis and chapters it folds (stored, so grounded before),
    with the seq range of each so every part keeps its share."""
    if task.kind != "synopsis":
        return span_candidates(task.entries, lang), []
    out: list[tuple[Item, Line]] = []
    groups: list[tuple[int, int]] = []
    for item in context_items(task):
        groups.append((item.first_seq, item.last_seq))
        if is_structured(item.data):
            out += drafted(record_from_data(item.data), lang, scenes_in(item.data))
        else:
            out += [(item_of_line(ln), ln) for ln in stored_lines(item)]
    if task.entries:
        groups.append((task.entries[0].seq, task.entries[-1].seq))
        out += span_candidates(task.entries, lang)
    return out, groups


def _write(run: _Run) -> Generator[ChatRequest, Completion, tuple[Record, Grounding, str] | None]:
    """Ask for the record until one passes the guards: (record, grounding, prompt version), or
    None after `max_attempts` requests or `max_refusals` refusals."""
    task, config = run.task, run.config
    max_tokens = first_max_tokens(task, config)
    reason: str | None = None
    refusals = 0
    threads = known_threads(task)
    while run.attempts < config.max_attempts:
        request, version = build_request(
            task,
            max_tokens,
            temperature=config.temperature,
            system_role=config.system_role,
            retry_reason=reason,
        )
        fitted = run.fit(request)
        if fitted is None:
            run.events.append("no_room")  # the prompt alone fills the window: never sent
            return None
        got = yield from run.ask(fitted, threads, salvage=task.kind != "synopsis")
        if not isinstance(got, BadSummary):
            return (*got, version)
        max_tokens, reason = _next_try(got, task, max_tokens)
        if got.reason == "refusal":
            refusals += 1
            if refusals >= config.max_refusals:
                break
        if run.attempts < config.max_attempts:
            run.events.append("retry")
    return None


def _compress(
    run: _Run,
    record: Record,
    grounding: Grounding,
    version: str,
    polish: _Polish,
) -> Generator[ChatRequest, Completion, tuple[Record, Grounding, str]]:
    """An over-long record is compressed again by the model, never truncated: up to
    `compress_rounds` requests, each kept only if it came out shorter and grounded."""
    task, counter, config = run.task, run.counter, run.config
    lang = resolve_lang(task.lang)
    tokens = counter.count(render_record(record, lang, run.scenes))
    limit = task.target_tokens * config.over_target
    if task.kind != "synopsis" and tokens > limit:
        if config.fill:  # chosen within the target with the span's lines (`_complete`)
            run.events.append("trimmed")
            return record, grounding, version
        record, trimmed = trim(record, task.target_tokens, counter, lang, run.scenes)
        run.events.append("trimmed")
        return record, replace(grounding, trimmed=trimmed), version
    max_tokens = first_max_tokens(task, config)
    reason: str | None = None
    for _ in range(config.compress_rounds):
        if tokens <= limit:
            break
        run.events.append("compress")
        request, cversion = build_compress_request(
            task,
            record,
            max_tokens,
            temperature=config.temperature,
            system_role=config.system_role,
            retry_reason=reason,
        )
        fitted = run.fit(request)
        if fitted is None:
            break
        threads = {t.id: t.title for t in record.threads}
        got = yield from run.ask(fitted, threads)
        if isinstance(got, BadSummary):
            max_tokens, reason = _next_try(got, task, max_tokens)
            continue
        shorter = polish(got[0], merge_threads([{**record.to_data(lang)}]))
        shorter_tokens = counter.count(render_record(shorter, lang, run.scenes))
        if shorter_tokens < tokens:
            record, tokens, grounding = shorter, shorter_tokens, got[1]
            if "+" not in version:
                version = f"{version}+{cversion}"
    if tokens > limit:
        run.events.append("over_target")
    return record, grounding, version


class _Polish:
    """What every accepted record goes through: threads carried over from the memory before
    it, and verbal tics removed from what the threads carried (each fix is an event)."""

    def __init__(self, task: SummaryTask, events: list[str]) -> None:
        self.task = task
        self.events = events

    def __call__(self, r: Record, threads_before: Sequence[Thread]) -> Record:
        task = self.task
        if task.kind == "synopsis" or threads_before:
            r = carry_threads(r, threads_before, drop_resolved=task.kind == "synopsis")
        r, tics = remove_phrases(r, task.avoid_phrases)
        if tics and "tics_removed" not in self.events:
            self.events.append("tics_removed")
        return r


def finish(result: Summary | GaveUp, task: SummaryTask, fallback: Summarizer) -> Summary:
    """A stored summary, or the fallback's when the model gave nothing storable (its lines are
    the messages' own words: all of them grounded)."""
    if isinstance(result, Summary):
        return result
    fb = fallback.summarize(task)
    lines = len(fb.data.get("lines", ())) if isinstance(fb.data, dict) else 0
    grounding: dict[str, Any] = {
        "lines": lines,
        "grounded": lines,
        "share": 1.0,
        "extractive": True,
        "attempts": [g.to_json() for g in result.groundings],
    }
    # the model's summary failed: the stand-in says why (`kioku.outcomes`)
    why = fallback_data(result.reason, result.detail)
    return replace(
        fb,
        events=(*result.events, "fallback"),
        attempts=result.attempts,
        input_tokens=result.input_tokens or fb.input_tokens,
        data={
            **fb.data,
            FALLBACK: why,
            "grounding": grounding,
            # what the model's rejected replies cost
            "usage": {
                "prompt_tokens": result.input_tokens,
                "completion_tokens": result.output_tokens,
            },
        },
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
