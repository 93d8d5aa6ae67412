"""kioku and its baselines, replayed side by side on one conversation at one budget.

  generational  kioku as shipped: chapters never rewritten, a major GC now and then, notes, and
                archive recall for the question (`kioku.layers.Layers`)
  rolling       one summary rewritten at each fold (seeds 002/004): `Kioku(strategy="rolling")`
  rolling-long  the same, given the memory `generational` ended up with (the profile's
                `synopsis_tokens` set to it), so the comparison is length-matched
  truncation    a sliding window: no memory, the newest messages that fit
  full          every message, no limit: the upper bound

Every arm sees the same turns (`kioku.bench.prefix.turns_of`) on the same simulated clock, and the
kioku arms are built by the prefix benchmark's `kioku_driver`, with the same summarizer. The
question is asked at the END of the conversation, after whatever summary was still running has
landed: `Arm.context(question)` is the prompt that arm would send for it, built without storing
the question (so one replay serves every question).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kioku.bench.prefix import Turn, kioku_driver, sliding_driver, turns_of
from kioku.context import MESSAGE_OVERHEAD
from kioku.datasets import Transcript
from kioku.engine import Conversation, Kioku
from kioku.layers import Layers
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage
from kioku.profiles import Profile
from kioku.recollection import Recollection
from kioku.store import Store
from kioku.summarizer import Summarizer
from kioku.tokens import TokenCounter

STRATEGIES: tuple[str, ...] = ("generational", "rolling", "rolling-long", "truncation", "full")
# ablation, not run by default: kioku's memory and notes without archive recall for the question
ABLATIONS: tuple[str, ...] = ("generational-norecall",)
KIOKU_ARMS = ("generational", "rolling", "rolling-long")
DEFAULT_TURN_SECONDS = 30.0
CONVERSATION_ID = "bench"  # what kioku_driver names its conversation


@dataclass(frozen=True)
class Context:
    """What one arm would send for a question at the end of the conversation."""

    strategy: str
    messages: tuple[ChatMessage, ...]  # the prompt; the question is in the last message
    question: str
    tokens: int  # prompt tokens, by the replay's counter
    extra: str = ""  # recollections (and their label) in front of the question

    @property
    def before(self) -> tuple[ChatMessage, ...]:
        """System prompt, memory exchange and raw window: everything before the question."""
        return self.messages[:-1]

    @property
    def text(self) -> str:
        """Everything the model would see except the question itself."""
        return "\n".join(m.content for m in self.before) + ("\n" + self.extra if self.extra else "")


@dataclass(frozen=True)
class MemoryStats:
    tokens: int = 0  # memory items (synopsis + chapters), by the replay's counter
    chars: int = 0
    rendered_tokens: int = 0  # the memory exchange as the prompt shows it (headers, notes)
    text: str = ""


class Arm(Protocol):
    name: str

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None: ...

    def finish(self) -> None: ...

    def context(self, question: str) -> Context: ...

    def memory(self) -> MemoryStats: ...

    def counters(self) -> dict[str, int]: ...


def progress_bar(enabled: bool) -> Progress:
    """The bar replays and evaluations show on stderr (stdout stays JSON)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not enabled,
    )


def fit_profile(profile: Profile) -> tuple[Profile, dict[str, Any]]:
    """A profile whose memory can grow to its limit and still leave the minimum raw window
    below the trigger. `Profile.scaled` keeps floors on the chapter, synopsis and major-GC
    sizes; at a small window (4,096) those floors add up to more than the room under the
    trigger, and every turn then ends in a forced cut (or, for a long rolling summary, an
    overflow). The three are scaled down together until synopsis + major GC + one chapter fit
    in trigger − min_raw. Returns the profile and what changed (empty when nothing did)."""
    fitted = profile.fitted()
    if fitted == profile:
        return profile, {}
    changed = {
        k: [getattr(profile, k), getattr(fitted, k)]
        for k in ("chapter_tokens", "synopsis_tokens", "major_gc")
    }
    return fitted, changed


def _chat(m: Message) -> ChatMessage:
    return ChatMessage("user" if m.role == "user" else "assistant", m.text)


class _ReplayLayers(Layers):
    """Recollections and the anti-repetition line go at the end of a turn's prompt: they never
    change memory, so the replay skips them unless asked for every turn (they cost a search and
    a tic count per turn); the question at the end gets its recollection (`question_recall`),
    never an anti-repetition line (a question is not a turn)."""

    def __init__(self, store: Store, per_turn: bool, question_recall: bool) -> None:
        super().__init__(store)
        self.per_turn = per_turn
        self.question_recall = question_recall
        self.answering = False  # set once the replay is over and the questions come

    def recollections(
        self, conv: Conversation, entry: LogEntry, raw_start: int, budget: int
    ) -> list[Recollection]:
        wanted = self.question_recall if self.answering else self.per_turn
        return super().recollections(conv, entry, raw_start, budget) if wanted else []

    def instructions(self, conv: Conversation) -> list[str]:
        return super().instructions(conv) if self.per_turn and not self.answering else []


@dataclass
class KiokuArm:
    """A kioku engine on an in-memory store, driven turn by turn like the prefix benchmark."""

    name: str
    transcript: Transcript
    profile: Profile
    counter: TokenCounter
    summarizer: Summarizer
    clock: list[float]
    strategy: str = "generational"
    layers: bool = False
    per_turn_recall: bool = False  # recollections in every turn's prompt (the demo shows them)
    recall: bool = True  # archive recall for the question at the end (with layers)
    kk: Kioku = field(init=False)
    conv: Conversation = field(init=False)

    def __post_init__(self) -> None:
        store = Store.open("sqlite://")
        self._layers = _ReplayLayers(store, self.per_turn_recall and self.recall, self.recall)
        self._drive, self.kk = kioku_driver(
            self.transcript,
            self.profile,
            self.counter,  # type: ignore[arg-type]
            self.clock,
            store,
            layers=self._layers if self.layers else False,
            strategy=self.strategy,
            summarizer=self.summarizer,
        )
        self.conv = self.kk.conversation(CONVERSATION_ID)
        self._final: tuple[Memory, list[LogEntry], Any] | None = None

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None:
        shown = self._drive(turn)
        return shown.messages if want_prompt else None

    def finish(self) -> None:
        """The question comes later: every summary still running lands and is folded in (as
        the first turn after it would), until nothing is left to do."""
        p = self.profile
        for _ in range(100):
            self.clock[0] += p.summary_delay_s + p.summary_duration_s + 1.0
            self.kk.worker.run_until_idle()
            report = self.conv.settle()
            if not report.folded and not report.scheduled:
                break
        info = self.conv.info()
        self._final = (self.conv.memory(), self.conv.raw_window(), info)
        self._layers.answering = True

    def context(self, question: str) -> Context:
        if self._final is None:
            self.finish()
        assert self._final is not None
        memory, raw, info = self._final
        entry = LogEntry(
            seq=info.next_seq,
            message=Message.user(question, author=self.transcript.user),
            tokens=self.counter.count(question),
        )
        prompt = self.conv.prompt_for(entry, info=info, window=raw, memory=memory)
        last = prompt.messages[-1].content
        extra = last[: -len(question)].strip() if last.endswith(question) else ""
        return Context(self.name, prompt.messages, question, prompt.tokens, extra)

    def memory(self) -> MemoryStats:
        m = self._final[0] if self._final else self.conv.memory()
        if m.is_empty():
            return MemoryStats()
        text, ack = render_memory(m, self.conv.lang)
        return MemoryStats(
            tokens=m.tokens,
            chars=sum(len(i.text) for i in m.items),
            rendered_tokens=self.counter.count(text) + self.counter.count(ack),
            text=text,
        )

    def counters(self) -> dict[str, int]:
        c = self.kk.store.counters(CONVERSATION_ID)
        out = {k: c.get(k, 0) for k in ("folds", "major_gcs", "forced_cuts")}
        # summaries the extractive chronicler wrote because the model's were unusable
        out["fallbacks"] = c.get("fallback", 0) + c.get("fallbacks", 0)
        return out

    def close(self) -> None:
        self.kk.close()
        self.kk.store.close()


@dataclass
class WindowArm:
    """No memory: `truncation` keeps the newest messages that fit, `full` keeps them all."""

    name: str
    transcript: Transcript
    profile: Profile
    counter: TokenCounter
    limit: bool = True
    history: list[tuple[ChatMessage, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sliding = (
            sliding_driver(self.transcript, self.profile, self.counter)  # type: ignore[arg-type]
            if self.limit
            else None
        )
        sp = self.transcript.system_prompt
        self._system = [ChatMessage("system", sp)] if sp else []
        self._system_tokens = self.counter.count(sp) if sp else 0

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None:
        users, replies = turn
        for m in [*users, *replies]:
            self.history.append((_chat(m), self.counter.count(m.text)))
        if self._sliding is not None and want_prompt:
            return self._sliding(turn).messages
        if want_prompt:
            return self._system + [c for c, _ in self.history[: -len(replies) or None]]
        return None

    def finish(self) -> None:
        pass

    def context(self, question: str) -> Context:
        q_t = self.counter.count(question)
        used = self._system_tokens + q_t + (len(self._system) + 1) * MESSAGE_OVERHEAD
        kept = 0
        if self.limit:
            for _, t in reversed(self.history):
                if used + t + MESSAGE_OVERHEAD > self.profile.prompt_budget:
                    break
                used += t + MESSAGE_OVERHEAD
                kept += 1
        else:
            kept = len(self.history)
            used += sum(t + MESSAGE_OVERHEAD for _, t in self.history)
        tail = [c for c, _ in self.history[len(self.history) - kept :]]
        messages = (*self._system, *tail, ChatMessage("user", question))
        return Context(self.name, messages, question, used)

    def memory(self) -> MemoryStats:
        return MemoryStats()

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


TurnHook = Callable[[str, int, list[ChatMessage] | None, "Arm"], None]


def make_arm(
    name: str,
    transcript: Transcript,
    profile: Profile,
    counter: TokenCounter,
    summarizer: Summarizer,
    clock: list[float],
    *,
    per_turn_recall: bool = False,
) -> Arm:
    if name == "generational":
        return KiokuArm(
            name,
            transcript,
            profile,
            counter,
            summarizer,
            clock,
            layers=True,
            per_turn_recall=per_turn_recall,
        )
    if name == "generational-norecall":
        return KiokuArm(
            name, transcript, profile, counter, summarizer, clock, layers=True, recall=False
        )
    if name in ("rolling", "rolling-long"):
        return KiokuArm(name, transcript, profile, counter, summarizer, clock, strategy="rolling")
    if name == "truncation":
        return WindowArm(name, transcript, profile, counter)
    if name == "full":
        return WindowArm(name, transcript, profile, counter, limit=False)
    raise ValueError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")


def check_strategies(names: Iterable[str]) -> tuple[str, ...]:
    from kioku.errors import InputError

    out = tuple(names)
    bad = [n for n in out if n not in STRATEGIES + ABLATIONS]
    if bad:
        raise InputError(
            f"unknown strategy {bad[0]!r}; use some of {', '.join(STRATEGIES + ABLATIONS)}"
        )
    if "rolling-long" in out and "generational" not in out:
        raise InputError("rolling-long is matched to generational's memory: run both")
    return out


def replay(
    transcript: Transcript,
    *,
    profile: Profile,
    counter: TokenCounter,
    summarizer: Summarizer,
    strategies: Sequence[str] = STRATEGIES,
    turn_seconds: float = DEFAULT_TURN_SECONDS,
    on_turn: TurnHook | None = None,
    want_prompts: Sequence[str] = (),
    per_turn_recall: bool = False,
) -> dict[str, Arm]:
    """Replay `transcript` through each strategy and settle it; the arms are ready for
    `context(question)`. `rolling-long` runs second, matched to `generational`'s final memory.
    `on_turn(name, index, prompt, arm)` is called after every turn (prompt only for the arms
    named in `want_prompts`)."""
    names = check_strategies(strategies)
    turns = turns_of(transcript)
    arms: dict[str, Arm] = {}

    def run(group: Sequence[str], prof_for: Callable[[str], Profile]) -> None:
        clock = [0.0]
        live = {
            n: make_arm(
                n,
                transcript,
                prof_for(n),
                counter,
                summarizer,
                clock,
                per_turn_recall=per_turn_recall,
            )
            for n in group
        }
        for i, turn in enumerate(turns):
            clock[0] += turn_seconds
            for n, arm in live.items():
                prompt = arm.feed(turn, want_prompt=n in want_prompts)
                if on_turn is not None:
                    on_turn(n, i, prompt, arm)
        for arm in live.values():
            arm.finish()
        arms.update(live)

    run([n for n in names if n != "rolling-long"], lambda _: profile)
    if "rolling-long" in names:
        target = max(profile.synopsis_tokens, arms["generational"].memory().tokens)
        run(["rolling-long"], lambda _: replace(profile, synopsis_tokens=target))
    return {n: arms[n] for n in names}


def close_all(arms: dict[str, Arm]) -> None:
    for arm in arms.values():
        close = getattr(arm, "close", None)
        if close is not None:
            close()
