"""Pinning what shaped a run, and the Markdown report of one.

The seed nearly evaluated a moving target: the working tree changed under a running evaluation.
Every result therefore carries its pins: kioku's version, the git commit (and whether the tree
had uncommitted changes under `kioku/`), Python, the models, prompt versions, seed and profile.
`markdown(result)` turns a locomo, forgetting or audit result into a short report.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import kioku
from kioku.profiles import Profile

ROOT = Path(kioku.__file__).resolve().parent.parent


def git_state(root: Path = ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None}
    status = git("status", "--porcelain", "--", "kioku")
    return {"commit": commit, "dirty": bool(status)}


def file_digest(path: Path | str | None) -> str | None:
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pins(
    *,
    profile: Profile | None = None,
    counter: str = "",
    summarizer: str = "",
    models: Mapping[str, Any] | None = None,
    prompts: Mapping[str, str] | None = None,
    seed: int | None = None,
    data: Mapping[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    from kioku.eval.qa import prompt_versions

    out: dict[str, Any] = {
        "kioku_version": getattr(kioku, "__version__", "?"),
        "git": git_state(),
        "python": platform.python_version(),
        "counter": counter,
        "summarizer": summarizer,
        "models": dict(models or {}),
        "prompts": {**prompt_versions(), **dict(prompts or {})},
        "seed": seed,
    }
    if profile is not None:
        out["profile"] = asdict(profile)
    if data is not None:
        out["data"] = dict(data)
    out.update(more)
    return out


def chronicler_prompts(lang: str) -> dict[str, str]:
    """The versions of the chronicler's prompt files a run in `lang` uses."""
    from kioku.prompts import TASKS, template

    return {f"chronicler-{t}": template(t, lang).version for t in TASKS}


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(r) + " |" for r in rows)
    return "\n".join(lines)


def locomo_markdown(result: Mapping[str, Any]) -> str:
    buckets = result["age_buckets"]
    out = [
        "# LoCoMo answer-in-context (LLM-free forgetting proxy)",
        "",
        f"Budget {result['budget']} tokens, profile `{result['profile']['name']}`, "
        f"{result['questions']} questions (categories 1–4) in {len(result['conversations'])} "
        f"conversations, {result['runtime_s']:.0f} s. Rates in %. `strict`: the gold answer as a "
        "contiguous normalized phrase (the headline); `f1`: token F1 of the best window; `bag`: "
        f"every answer word anywhere (the old, lenient match); `old` = evidence "
        f"{result['old_age']}+ sessions before the end. `full` is the reference, not an arm.",
        "",
    ]
    for split in ("dev", "heldout", "all"):
        label = {
            "dev": "Dev (conversations 0–4)",
            "heldout": "Held out (5–9)",
            "all": "All",
        }[split]
        rows = []
        for name, s in result["strategies"].items():
            d = s if split == "all" else s.get(split)
            if not d or not d.get("questions"):
                continue
            prompt = d.get("prompt") or {}
            rows.append(
                [
                    name,
                    _pct(d["answer_in_context"]),
                    _pct(d.get("f1")),
                    _pct(d.get("bag_of_words")),
                    _pct(d["old"]),
                    *[_pct(d["by_age"].get(b)) for b in buckets],
                    f"{d['context_tokens']:.0f}",
                    f"{prompt.get('recollections', 0):.0f}",
                ]
            )
        if rows:
            out += [f"## {label}", ""]
            out.append(
                _table(
                    [
                        "strategy",
                        "strict",
                        "f1",
                        "bag",
                        "old",
                        *[f"age {b}" for b in buckets],
                        "ctx tok",
                        "recall tok",
                    ],
                    rows,
                )
            )
            out.append("")
    out += _diagnosis_markdown(result)
    return "\n".join(out)


def _diagnosis_markdown(result: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for split, d in (result.get("diagnosis") or {}).items():
        versus = d.get("vs_retrieval") or {}
        if not versus:
            continue
        out += [f"## What each arm loses against retrieval ({split})", ""]
        rows = []
        for name, v in versus.items():
            lost = v.get("lost", {})
            ranks = lost.get("by_evidence_rank", {})
            where = lost.get("evidence_in", {})
            rows.append(
                [
                    name,
                    str(v["only_this"]),
                    str(v["only_other"]),
                    " ".join(f"{k}:{n}" for k, n in ranks.items()) or "–",
                    " ".join(f"{k}:{n}" for k, n in where.items()) or "–",
                    str(lost.get("recall_tokens_mean", "–")),
                ]
            )
        out.append(
            _table(
                [
                    "arm",
                    "only this arm",
                    "only retrieval",
                    "lost, by evidence BM25 rank",
                    "lost, evidence was in",
                    "recall tok",
                ],
                rows,
            )
        )
        out.append("")
    return out


def forgetting_markdown(result: Mapping[str, Any]) -> str:
    segs = result["segments"]
    out = [
        "# Forgetting curve",
        "",
        f"{len(segs)} segments, {result['pins'].get('questions_per_segment')} questions each, "
        f"{result['pins'].get('repeats')} repeat(s). Recall per segment, oldest first.",
        "",
    ]
    headers = [
        "strategy",
        "mean",
        "spread",
        "memory tok",
        "memory chars",
        *[f"s{i}" for i in range(len(segs))],
    ]
    rows = []
    for name, s in result["strategies"].items():
        sp = s["spread"]["mean_recall"]
        rows.append(
            [
                name,
                _pct(s["mean_recall"]),
                f"{_pct(sp['min'])}–{_pct(sp['max'])}",
                f"{s['memory_tokens']:.0f}",
                f"{s['memory_chars']:.0f}",
                *[_pct(v) for v in s["recall_per_segment"]],
            ]
        )
    out.append(_table(headers, rows))
    return "\n".join(out) + "\n"


def audit_markdown(result: Mapping[str, Any]) -> str:
    t = result["totals"]  # "n/a": memory holds nothing of that kind to judge
    rows = [[k.replace("_", " "), str(v)] for k, v in t.items()]
    return "\n".join(
        [
            f"# Memory audit: {result['conversation']}",
            "",
            f"{len(result['items'])} memory items checked against their source ranges.",
            "",
            _table(["check", "count"], rows),
            "",
        ]
    )


def _ci(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "–"
    return f"{d['mean']:.2f} [{d['lo']:.2f}–{d['hi']:.2f}]"


def reader_markdown(result: Mapping[str, Any]) -> str:
    """`kioku eval locomo --reader`: each arm's answers scored, with 95% intervals."""
    pinned = result["pins"]
    reader = (pinned.get("models") or {}).get("reader") or {}
    thirds = result["age_thirds"]
    cats = result["categories"]
    out = [
        "# LoCoMo answered by a reader",
        "",
        f"Reader `{reader.get('name', '?')}`, chronicler `{pinned.get('summarizer')}`, budget "
        f"{result['budget']} tokens, {result['questions']} questions, "
        f"{result['runtime_s']:.0f} s. LoCoMo's F1 (its scorer's rules per category; "
        "adversarial: 1 when the reply says not mentioned), `strict`: the gold answer as a phrase "
        "of the reply; mean [bootstrap 95% interval]. A judge's grade depends on the judge.",
        "",
    ]
    for split, label in (("dev", "Dev (conversations 0–4)"), ("heldout", "Held out (5–9)")):
        rows = []
        for arm, per in result["scores"].items():
            d = per.get(split)
            if not d:
                continue
            rows.append(
                [
                    arm,
                    _ci(d["f1"]),
                    _ci(d["strict"]),
                    _ci(d.get("judge")),
                    *[_ci((d["by_age"].get(t) or {}).get("f1")) for t in thirds],
                    *[_ci((d["by_category"].get(c) or {}).get("f1")) for c in cats],
                    str(d["f1"]["n"]),
                ]
            )
        if not rows:
            continue
        heads = ["arm", "F1", "strict", "judge", *thirds, *cats.values(), "n"]
        out += [f"## {label}", "", _table(heads, rows), ""]
        margin = (result.get("margins") or {}).get(split) or {}
        if margin:
            out += [
                "generational − arm, F1 (paired): "
                + ", ".join(f"{a} {_ci(m)}" for a, m in margin.items()),
                "",
            ]
    return "\n".join(out)


def markdown(result: Mapping[str, Any]) -> str:
    kind = str(result.get("kind", ""))
    if kind.startswith("kioku.eval.reader"):
        return reader_markdown(result)
    if kind.startswith("kioku.eval.locomo"):
        return locomo_markdown(result)
    if kind.startswith("kioku.eval.forgetting"):
        return forgetting_markdown(result)
    if kind.startswith("kioku.eval.audit"):
        return audit_markdown(result)
    raise ValueError(f"no report for a result of kind {kind!r}")
