"""`kioku demo`: the first command a newcomer runs. No data, no model server, about a minute.

It replays the built-in roleplay (`kioku.story`: Japanese and English, a few thousand messages
with planted facts, a character who lies about her age, a promise kept late, a creeping verbal
tic) through kioku with the extractive chronicler and the memory layers attached, on the local-8k
profile so folds come often. It shows folds and major GCs as they happen, prints the final
memory, compares prefix-cache reuse with a sliding window (the prefix benchmark's machinery, on a
real tokenizer), checks which planted facts each strategy still has in its final context, runs
the structural audit, and writes one PNG. With KIOKU_LLM_URL set the chronicler is that model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kioku.bench.prefix import ChatMLTokens, Tally, turns_of
from kioku.counters import counter_from_spec
from kioku.datasets import Transcript
from kioku.errors import InputError
from kioku.eval.answers import answer_in_context, mean
from kioku.eval.audit import audit_store
from kioku.eval.strategies import CONVERSATION_ID, STRATEGIES, Arm, KiokuArm, close_all, replay
from kioku.memory import render_memory
from kioku.models import ChatMessage
from kioku.profiles import Profile, get_profile
from kioku.story import LANGS, story
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.terminal import piped, plural
from kioku.tokens import TokenCounter

DEFAULT_MESSAGES = 3200  # in total, split between the languages
DEFAULT_PROFILE = "local-8k"
DEFAULT_PNG = "kioku-demo.png"
# Where in the conversation a planted fact was last mentioned, as a share of it, oldest first:
# the table's columns and the figure's x axis read left to right from the start to the end.
PLACES: tuple[tuple[float, float, str], ...] = (
    (0.0, 0.25, "first 25%"),
    (0.25, 0.5, "25-50%"),
    (0.5, 0.75, "50-75%"),
    (0.75, 0.9, "75-90%"),
    (0.9, 1.01, "last 10%"),
)
BUCKETS = tuple(b[2] for b in PLACES)
# What each strategy is, in a line (the table's caption and the figure's legend say it).
EXPLAINED: Mapping[str, str] = {
    "generational": "kioku: chapters never rewritten, a synopsis at each major GC, notes, "
    "archive recall",
    "rolling": "one summary, rewritten at every fold (the common design kioku replaces)",
    "rolling-long": "the same, given as many tokens as kioku's memory holds at the end",
    "truncation": "a sliding window: only the newest messages that fit",
    "full": "every message, no limit: the reference, not an arm (it does not fit a real window)",
}


def place_bucket(position: float) -> str:
    """The bucket of a fact last mentioned at `position` (0 = the first message, 1 = the end)."""
    for lo, hi, label in PLACES:
        if lo <= position < hi:
            return label
    return BUCKETS[-1]


@dataclass
class LangResult:
    lang: str
    messages: int
    turns: int
    seconds: float
    events: list[str] = field(default_factory=list)
    reuse: dict[str, dict[str, Any]] = field(default_factory=dict)
    reuse_series: dict[str, list[float]] = field(default_factory=dict)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)
    memory: str = ""
    memory_tokens: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)


def summarizer_from_env(
    counter: TokenCounter, profile: Profile, env: Mapping[str, str]
) -> tuple[Summarizer, str]:
    url = env.get("KIOKU_LLM_URL")
    if not url:
        return ExtractiveSummarizer(counter), "extractive"
    from kioku.chronicler import LLMChronicler
    from kioku.client import OpenAIChatModel

    model = OpenAIChatModel(
        url,
        model=env.get("KIOKU_LLM_MODEL") or None,
        api_key=env.get("KIOKU_LLM_API_KEY") or None,
        profile=profile,
    )
    return LLMChronicler(model, counter, fallback=ExtractiveSummarizer(counter)), f"llm {url}"


def fact_rates(
    t: Transcript, arms: Mapping[str, Arm], on_question: Callable[[], None] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Which planted facts each arm's final context still holds, by where they were planted."""
    n = len(t.messages)
    questions = []
    for q in t.info["questions"]:
        place = max(q["evidence"]) / n
        questions.append({**q, "place": round(place, 3), "bucket": place_bucket(place), "hits": {}})
    out: dict[str, Any] = {}
    for name, arm in arms.items():
        for q in questions:
            q["hits"][name] = answer_in_context(q["answer"], arm.context(q["question"]).text)
            if on_question is not None:
                on_question()
        out[name] = {
            "answer_in_context": mean(float(q["hits"][name]) for q in questions),
            "by_place": {
                b: mean(float(q["hits"][name]) for q in questions if q["bucket"] == b)
                for b in BUCKETS
            },
            "by_place_questions": {
                b: sum(1 for q in questions if q["bucket"] == b) for b in BUCKETS
            },
        }
    return out, questions


def run_lang(
    lang: str,
    messages: int,
    *,
    profile: Profile,
    counter: TokenCounter,
    tok: ChatMLTokens,
    summarizer: Summarizer,
    console: Console,
    quiet: bool,
) -> LangResult:
    started = time.monotonic()
    t = story(lang, messages)
    turns = turns_of(t)
    res = LangResult(lang, len(t.messages), len(turns), 0.0)
    tallies = {
        "kioku": Tally(profile.prompt_budget),
        "sliding_window": Tally(profile.prompt_budget),
    }
    last = {"folds": 0, "major_gcs": 0, "forced_cuts": 0}

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task(
            f"[bold]{lang}[/bold] replaying turns: kioku, rolling, truncation, full",
            total=len(turns),
        )
        matched: list[Any] = []  # the rolling-long replay's task, once it starts

        def on_turn(name: str, i: int, prompt: list[ChatMessage] | None, arm: Arm) -> None:
            if name == "rolling-long":
                # the second replay: rolling, given as many tokens as kioku's memory ended with
                if not matched:
                    bar.update(task, visible=False)
                    size = arm.profile.synopsis_tokens if isinstance(arm, KiokuArm) else 0
                    matched.append(
                        bar.add_task(
                            f"[bold]{lang}[/bold] replaying turns: rolling-long "
                            f"({size:,} tokens, as many as kioku's memory)",
                            total=len(turns),
                        )
                    )
                bar.advance(matched[0])
                return
            replies = turns[i][1]
            reply_ids = tok.tok.encode(replies[0].text) if replies else []
            if name == "truncation" and prompt is not None:
                tallies["sliding_window"].add(
                    tok.prompt(prompt), reply_ids, profile.response_reserve
                )
            if name != "generational" or prompt is None:
                return
            tallies["kioku"].add(tok.prompt(prompt), reply_ids, profile.response_reserve)
            bar.advance(task)
            c = arm.counters()
            if all(c[k] == last[k] for k in last):
                return
            assert isinstance(arm, KiokuArm)
            mem = arm.conv.memory()
            raw_start = arm.conv.info().raw_start
            if c["major_gcs"] > last["major_gcs"]:
                s = mem.synopsis
                line = (
                    f"turn {i + 1:>4}  [magenta]major GC[/magenta]  synopsis #{s.first_seq}–"
                    f"{s.last_seq} ({s.tokens} tok)"
                    if s
                    else f"turn {i + 1:>4}  [magenta]major GC[/magenta]"
                )
            else:
                ch = mem.chapters[-1] if mem.chapters else None
                what = f"chapter  #{ch.first_seq}–{ch.last_seq} ({ch.tokens} tok)" if ch else ""
                kind = "cut!" if c["forced_cuts"] > last["forced_cuts"] else "fold"
                line = f"turn {i + 1:>4}  [cyan]{kind:<8}[/cyan]  {what}"
            line += (
                f" · memory {mem.tokens} tok, {plural(len(mem.items), 'item')} · raw from "
                f"#{raw_start}"
            )
            res.events.append(line)
            if not quiet:
                bar.console.print(line, highlight=False)
            last.update({k: c[k] for k in last})

        arms = replay(
            t,
            profile=profile,
            counter=counter,
            summarizer=summarizer,
            strategies=STRATEGIES,
            on_turn=on_turn,
            want_prompts=("generational", "truncation"),
            per_turn_recall=True,
        )
        gen = arms["generational"]
        assert isinstance(gen, KiokuArm)
        asked = bar.add_task(
            f"[bold]{lang}[/bold] asking for {plural(len(t.info['questions']), 'planted fact')} "
            f"in each strategy's final context",
            total=len(t.info["questions"]) * len(arms),
        )
        res.facts, res.questions = fact_rates(t, arms, lambda: bar.advance(asked))
        bar.add_task(f"[bold]{lang}[/bold] auditing kioku's memory", total=None)
        res.audit = audit_store(gen.kk.store, CONVERSATION_ID)["totals"]
    res.reuse = {k: v.summary() for k, v in tallies.items()}
    res.reuse_series = {k: list(v.reuse) for k, v in tallies.items()}
    mem = gen.conv.memory()
    res.memory = render_memory(mem, gen.conv.lang)[0]
    res.memory_tokens = mem.tokens
    res.counters = gen.counters()
    close_all(arms)
    res.seconds = time.monotonic() - started
    return res


def _print_lang(console: Console, r: LangResult, quiet: bool) -> None:
    if not quiet:
        console.print(
            Panel(r.memory, title=f"{r.lang}: final memory ({r.memory_tokens} tok)", expand=False),
            markup=False,
            highlight=False,
        )
    t = Table(title=f"{r.lang}: prefix-cache reuse, {r.turns} turns", title_justify="left")
    for col in ("prompt", "mean reuse", "median", "cache breaks", "re-read tokens"):
        t.add_column(col, justify="right" if col != "prompt" else "left")
    for name, s in r.reuse.items():
        t.add_row(
            name.replace("_", " "),
            f"{100 * s['prefix_reuse_mean']:.1f}%",
            f"{100 * s['prefix_reuse_median']:.1f}%",
            str(s["cache_breaks"]),
            f"{s['reprocessed_tokens']:,}",
        )
    console.print(t)
    counts = next(iter(r.facts.values()))["by_place_questions"]
    f = Table(
        title=f"{r.lang}: planted facts still in the final context, by where in the "
        "conversation they were planted (oldest first)",
        title_justify="left",
        caption="\n".join(f"{n}: {EXPLAINED[n]}" for n in r.facts if n in EXPLAINED),
        caption_justify="left",
    )
    f.add_column("strategy", no_wrap=True)
    f.add_column(f"all\n{plural(len(r.questions), 'fact')}", justify="right")
    for b in BUCKETS:
        f.add_column(f"{b}\n{plural(counts[b], 'fact')}", justify="right", no_wrap=True)
    for name, s in r.facts.items():
        f.add_row(
            name,
            f"{100 * (s['answer_in_context'] or 0):.0f}%",
            *[
                "–" if s["by_place"][b] is None else f"{100 * s['by_place'][b]:.0f}%"
                for b in BUCKETS
            ],
        )
    console.print(f)
    a = r.audit
    claims = a["claims_as_fact"]  # "n/a" where memory has no claims to judge (extractive)
    console.print(
        f"{r.lang}: {plural(r.counters.get('folds', 0), 'fold')}, "
        f"{plural(r.counters.get('major_gcs', 0), 'major GC')}, "
        f"{plural(r.counters.get('forced_cuts', 0), 'forced cut')} · audit: "
        + (
            f"{plural(claims, 'claim')} written as facts, "
            if isinstance(claims, int)
            else f"claims written as facts: {claims}, "
        )
        + f"{plural(a['tic_phrases_in_memory'], 'tic phrase')} in memory "
        f"(of {a['tic_phrases_found']} found), "
        f"{plural(a['lines_in_memory_twice'], 'line')} held twice, "
        f"{plural(a['habit_lines_in_memory'], 'habit')} · {r.seconds:.0f} s",
        highlight=False,
    )


def run(
    lang: str = "both",
    messages: int | None = None,
    out: Path | str = ".",
    *,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    env = os.environ if env is None else env
    langs = list(LANGS) if lang == "both" else [lang]
    if any(x not in LANGS for x in langs):
        raise InputError(f"--lang is ja, en or both, not {lang!r}")
    total = messages or DEFAULT_MESSAGES
    per_lang = max(1, total // len(langs))
    # piped (`kioku demo | tee demo.log`), a line is never broken in the middle of a phrase
    console = console or Console(soft_wrap=piped())
    profile = get_profile(DEFAULT_PROFILE)
    counter = counter_from_spec("qwen2.5")
    tok = ChatMLTokens()
    summarizer, chronicler = summarizer_from_env(counter, profile, env)
    if not quiet:
        console.print(
            f"[bold]kioku demo[/bold]: {per_lang * len(langs):,} messages of a built-in roleplay "
            f"({', '.join(langs)}), profile {profile.name} (window {profile.window:,}, trigger "
            f"{profile.trigger:,} tokens), chronicler: {chronicler}",
            highlight=False,
        )
    results = []
    for lg in langs:
        r = run_lang(
            lg,
            per_lang,
            profile=profile,
            counter=counter,
            tok=tok,
            summarizer=summarizer,
            console=console,
            quiet=quiet,
        )
        _print_lang(console, r, quiet)
        results.append(r)
    from kioku.eval.plots import demo_figure

    out_dir = Path(out)
    png = demo_figure(
        {r.lang: r.facts for r in results},
        BUCKETS,
        EXPLAINED,
        {
            r.lang: {
                "kioku": r.reuse_series["kioku"],
                "sliding_window": r.reuse_series["sliding_window"],
            }
            for r in results
        },
        out_dir / DEFAULT_PNG,
    )
    seconds = time.monotonic() - started
    console.print(f"wrote [bold]{png}[/bold] · {seconds:.0f} s", highlight=False)
    return {
        "png": str(png),
        "seconds": round(seconds, 1),
        "chronicler": chronicler,
        "profile": profile.name,
        "languages": {
            r.lang: {
                "messages": r.messages,
                "turns": r.turns,
                "seconds": round(r.seconds, 1),
                "counters": r.counters,
                "memory_tokens": r.memory_tokens,
                "prefix_reuse": r.reuse,
                "facts": r.facts,
                "questions": r.questions,
                "audit": r.audit,
                "events": len(r.events),
            }
            for r in results
        },
    }
