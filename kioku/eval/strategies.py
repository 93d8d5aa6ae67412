"""kioku and its baselines, replayed side by side on one conversation at one budget.

The headline arms (`ARMS`), every one held to the same budget:
  generational           kioku as shipped: chapters never rewritten, a major GC now and then,
                         notes, and archive recall for the question (`kioku.layers.Layers`)
  generational-norecall  the same memory, no recall for the question: what the chapters, the
                         synopsis and the notes hold by themselves
  rolling                one summary rewritten at each fold (seeds 002/004):
                         `Kioku(strategy="rolling")`
  rolling+recall         the same summary, with kioku's archive recall for the question
  rolling-long           rolling, given the memory `generational` ended up with (the profile's
                         `synopsis_tokens` set to it), so the comparison is length-matched
  truncation             a sliding window: no memory, the newest messages that fit
  retrieval              no memory: the question's best BM25 turns ±1, filling the budget
And the reference (`REFERENCE`), which is not an arm:
  full                   every message, no limit (see `kioku.eval.baselines`)

Every arm sees the same turns (`kioku.bench.prefix.turns_of`) on the same simulated clock, and the
kioku arms are built by the prefix benchmark's `kioku_driver`, with the same summarizer. The
question is asked at the END of the conversation, after whatever summary was still running has
landed and the question's turn has made room for its recollections (`Conversation.settle`):
`Arm.context(question)` is the prompt that arm would send for it, built without storing
the question (so one replay serves every question), by the product's own allocator
(`Conversation.prompt_for` → `kioku.context.plan` and `finish`) for every arm — so the same budget split,
the same rendering of messages and of their dates. The question carries the date of the last
message (it is asked that day). Arms that differ only at the question share one replay:
`generational-norecall` reads `generational`'s final state, `rolling+recall` `rolling`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kioku.bench.prefix import Turn, kioku_driver, turns_of
from kioku.datasets import Transcript
from kioku.engine import Conversation, Kioku
from kioku.errors import InputError
from kioku.layers import Layers
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry
from kioku.models import ChatMessage
from kioku.profiles import Profile
from kioku.recall.need import Need, Recall
from kioku.store import Store
from kioku.summarizer import Summarizer
from kioku.tokens import TokenCounter
from kioku.turn_state import TurnState

from .arms import Arm, Context, MemoryStats, context_of, question_entry
from .baselines import RetrievalArm, WindowArm

ARMS: tuple[str, ...] = (
    "generational",
    "generational-norecall",
    "rolling",
    "rolling+recall",
    "rolling-long",
    "truncation",
    "retrieval",
)
REFERENCE = "full"
HEADLINE: tuple[str, ...] = (*ARMS, REFERENCE)  # `kioku eval locomo`'s default
# the demo's and the forgetting curve's default (each arm there costs model calls)
STRATEGIES: tuple[str, ...] = ("generational", "rolling", "rolling-long", "truncation", "full")
KNOWN: tuple[str, ...] = HEADLINE
# arms that read another arm's replay, with or without recall for the question
VIEWS: dict[str, tuple[str, bool]] = {
    "generational": ("generational", True),
    "generational-norecall": ("generational", False),
    "rolling": ("rolling", False),
    "rolling+recall": ("rolling", True),
    "rolling-long": ("rolling-long", False),
}
DEFAULT_TURN_SECONDS = 30.0
CONVERSATION_ID = "bench"  # what kioku_driver names its conversation


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
    in trigger − min_raw, and memory takes at most `Profile.memory_share` of the ceiling
    (`Profile.fitted`). Returns the profile and what changed (empty when nothing did)."""
    fitted = profile.fitted()
    if fitted == profile:
        return profile, {}
    changed = {
        k: [getattr(profile, k), getattr(fitted, k)]
        for k in ("chapter_tokens", "synopsis_tokens", "major_gc", "notes_tokens")
        if getattr(profile, k) != getattr(fitted, k)
    }
    return fitted, changed


class _ReplayLayers(Layers):
    """Recollections and the anti-repetition line go at the end of a turn's prompt: the replay
    skips them unless asked for every turn (they cost a search and a tic count per turn, and
    what a statement is shown would then be carried in the raw window the question reads); a
    question at the end goes through recall's gate (`kioku.recall.need`, as every turn of the
    product does) when `question_recall` says so (a view of the same replay may ask without), and
    gets no anti-repetition line (a question is not a turn)."""

    def __init__(self, store: Store, per_turn: bool, *, notes: bool = True) -> None:
        super().__init__(store, notes=notes, tics=notes)
        self.per_turn = per_turn
        self.question_recall = False
        self.answering = False  # set once the replay is over and the questions come

    def recall(self, turn: TurnState, entry: LogEntry) -> Recall:
        wanted = self.question_recall if self.answering else self.per_turn
        if not wanted:
            return Recall(Need.off("recall is off in this arm"))
        return super().recall(turn, entry)

    def instructions(self, turn: TurnState) -> list[str]:
        return super().instructions(turn) if self.per_turn and not self.answering else []


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
    recall: bool = True  # archive recall for the question at the end
    kk: Kioku = field(init=False)
    conv: Conversation = field(init=False)

    def __post_init__(self) -> None:
        store = Store.open("sqlite://")
        # a rolling arm has no notes and no tic guard, only the archive recall a view of it may
        # ask for at the question (`rolling+recall`): recall never changes memory
        self._layers = _ReplayLayers(store, self.per_turn_recall and self.recall, notes=self.layers)
        self._drive, self.kk = kioku_driver(
            self.transcript,
            self.profile,
            self.counter,  # type: ignore[arg-type]
            self.clock,
            store,
            layers=self._layers,
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
        the first turn after it would), until nothing is left to do; then what the turn of a
        question does first (a ready chapter folds when the question needs the room)."""
        if self._final is not None:
            return
        p = self.profile
        for _ in range(100):
            self.clock[0] += p.summary_delay_s + p.summary_duration_s + 1.0
            self.kk.worker.run_until_idle()
            report = self.conv.settle()
            if not report.folded and not report.scheduled:
                break
        # the turn of a question that wants the past makes its room: a ready chapter folds
        self.conv.settle(recall=self.profile.recall_tokens)
        info = self.conv.info()
        self._final = (self.conv.memory(), self.conv.raw_window(), info)
        self._layers.answering = True

    def context(self, question: str, *, recall: bool | None = None) -> Context:
        self.finish()
        assert self._final is not None
        memory, raw, info = self._final
        use_recall = self.recall if recall is None else recall
        self._layers.question_recall = use_recall
        at = raw[-1].message.at if raw else None
        entry = question_entry(question, info.next_seq, self.transcript.user, at, self.counter)
        prompt = self.conv.prompt_for(entry, info=info, window=raw, memory=memory)
        return context_of(self.name, prompt, question)

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
class View:
    """An arm that asks its questions of another arm's replay, with or without recall."""

    name: str
    base: KiokuArm
    recall: bool

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None:
        return None  # the base is fed

    def finish(self) -> None:
        self.base.finish()

    def context(self, question: str) -> Context:
        self.finish()
        return replace(self.base.context(question, recall=self.recall), strategy=self.name)

    def memory(self) -> MemoryStats:
        return self.base.memory()

    def counters(self) -> dict[str, int]:
        return self.base.counters()

    @property
    def kk(self) -> Kioku:
        return self.base.kk

    @property
    def conv(self) -> Conversation:
        return self.base.conv


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
    """The arm that replays for `name` (a view's base: `generational`, `rolling`, …)."""
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
    if name in ("rolling", "rolling-long"):
        return KiokuArm(
            name, transcript, profile, counter, summarizer, clock, strategy="rolling", recall=False
        )
    if name == "truncation":
        return WindowArm(name, transcript, profile, counter)
    if name == "retrieval":
        return RetrievalArm(name, transcript, profile, counter)
    if name == REFERENCE:
        return WindowArm(name, transcript, profile, counter, limit=False)
    raise InputError(f"unknown strategy {name!r}; use some of {', '.join(KNOWN)}")


def check_strategies(names: Iterable[str]) -> tuple[str, ...]:
    out = tuple(names)
    bad = [n for n in out if n not in KNOWN]
    if bad:
        raise InputError(f"unknown strategy {bad[0]!r}; use some of {', '.join(KNOWN)}")
    if "rolling-long" in out and "generational" not in out:
        raise InputError("rolling-long is matched to generational's memory: run both")
    if not out:
        raise InputError(f"name at least one strategy: {', '.join(KNOWN)}")
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
    named in `want_prompts`), under the name of the arm that replays."""
    names = check_strategies(strategies)
    replayers = list(dict.fromkeys(VIEWS.get(n, (n, False))[0] for n in names))
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

    run([n for n in replayers if n != "rolling-long"], lambda _: profile)
    if "rolling-long" in replayers:
        target = max(profile.synopsis_tokens, arms["generational"].memory().tokens)
        run(["rolling-long"], lambda _: replace(profile, synopsis_tokens=target))
    out: dict[str, Arm] = {}
    for n in names:
        base, recall = VIEWS.get(n, (n, False))
        arm = arms[base]
        if isinstance(arm, KiokuArm) and (n != base or recall != arm.recall):
            view = View(n, arm, recall)
            view.finish()
            out[n] = view
        else:
            out[n] = arm
    return out


def close_all(arms: dict[str, Arm]) -> None:
    closed: set[int] = set()
    for arm in arms.values():
        target = arm.base if isinstance(arm, View) else arm
        close = getattr(target, "close", None)
        if close is not None and id(target) not in closed:
            closed.add(id(target))
            close()
