"""PNG plots of the evaluation results (matplotlib, Agg backend, nothing interactive).

- `forgetting_curve`: recall per segment, oldest first, one line per strategy, the spread over
  repeats as a band — the seed's instrument;
- `answer_by_age`: answer-in-context by the age of the evidence, per strategy (LoCoMo: dev and
  held-out panels; the demo: its planted facts);
- `reader_by_age`: a real reader's F1 by the age third of the evidence, per arm, with each
  figure's bootstrap 95% interval (`kioku eval locomo --reader`: the forgetting curve read by a
  model);
- `prefix_reuse`: the share of each prompt a serving engine takes from its prefix cache, per turn,
  kioku against its baselines (`kioku.bench.prefix` computes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

STYLE: Mapping[str, dict[str, Any]] = {
    "generational": {"color": "#d62728", "lw": 2.4, "marker": "o", "label": "generational (kioku)"},
    "kioku": {"color": "#d62728", "lw": 1.6, "label": "kioku"},
    "rolling": {"color": "#1f77b4", "lw": 1.6, "marker": "s"},
    "rolling-long": {"color": "#17becf", "lw": 1.6, "marker": "D"},
    "generational-norecall": {"color": "#ff9896", "lw": 1.6, "ls": ":", "marker": "o"},
    "rolling+recall": {"color": "#9467bd", "lw": 1.6, "marker": "P"},
    "retrieval": {"color": "#2ca02c", "lw": 1.8, "marker": "^"},
    "truncation": {"color": "#7f7f7f", "lw": 1.6, "marker": "v"},
    "none": {
        "color": "#8c564b",
        "lw": 1.2,
        "ls": "--",
        "marker": "x",
        "label": "none (no history)",
    },
    "sliding_window": {"color": "#7f7f7f", "lw": 1.2, "label": "sliding window"},
    "summary_in_system": {"color": "#1f77b4", "lw": 1.2, "label": "summary in system prompt"},
    "immediate_fold": {"color": "#ff7f0e", "lw": 1.2, "label": "fold in the trigger turn"},
    "full": {
        "color": "#000000",
        "lw": 1.2,
        "ls": "--",
        "marker": "x",
        "label": "full (reference)",
    },
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _style(name: str) -> dict[str, Any]:
    s = dict(STYLE.get(name, {}))
    s.setdefault("label", name)
    return s


def _save(fig: Any, path: Path | str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return p


def _pct(v: float | None) -> float:
    return float("nan") if v is None else 100.0 * v


def forgetting_curve(result: Mapping[str, Any], path: Path | str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    segs = result["segments"]
    x = list(range(1, len(segs) + 1))
    for name, s in result["strategies"].items():
        st = _style(name)
        tok = s.get("memory_tokens") or 0
        label = f"{st.pop('label')} (mean {_pct(s['mean_recall']):.0f}%, memory {tok:.0f} tok)"
        ax.plot(x, [_pct(v) for v in s["recall_per_segment"]], label=label, **st)
        reps = [r["recall_per_segment"] for r in s.get("repeats", [])]
        if len(reps) > 1:
            lo = [min(_pct(r[i]) for r in reps) for i in range(len(x))]
            hi = [max(_pct(r[i]) for r in reps) for i in range(len(x))]
            ax.fill_between(x, lo, hi, color=st.get("color"), alpha=0.15, lw=0)
    ax.set_xticks(x)
    ax.set_xticklabels(
        [f"{s['first_seq']}–{s['last_seq']}" for s in segs], rotation=45, ha="right", fontsize=7
    )
    ax.set_xlabel("segment of the conversation (messages), oldest first")
    ax.set_ylabel("recall (%)")
    ax.set_ylim(-3, 103)
    ax.set_title("Forgetting curve: questions per segment answered from the final context")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def _age_panel(
    ax: Any,
    by_strategy: Mapping[str, Mapping[str, Any]],
    buckets: Sequence[str],
    title: str,
    counts: Mapping[str, int] | None = None,
    overall_key: str = "answer_in_context",
) -> None:
    x = list(range(len(buckets)))
    for name, s in by_strategy.items():
        st = _style(name)
        overall = s.get(overall_key)
        label = st.pop("label") + (f" ({_pct(overall):.0f}%)" if overall is not None else "")
        ax.plot(x, [_pct(s["by_age"].get(b)) for b in buckets], label=label, **st)
    labels = list(buckets)
    if counts:
        labels = [f"{b}\n(n={counts.get(b, 0)})" for b in buckets]
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(-3, 103)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def answer_by_age(result: Mapping[str, Any], path: Path | str) -> Path:
    """LoCoMo: answer-in-context by evidence age, dev and held-out side by side."""
    plt = _plt()
    buckets = result["age_buckets"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for ax, split, title in (
        (axes[0], "dev", "conversations 0–4 (dev)"),
        (axes[1], "heldout", "conversations 5–9 (held out)"),
    ):
        part = {n: s[split] for n, s in result["strategies"].items() if split in s}
        first: Mapping[str, Any] = next(iter(part.values()), {})
        counts = first.get("by_age_questions")
        _age_panel(ax, part, buckets, title, counts)
        ax.set_xlabel("age of the evidence (sessions before the end)")
    axes[0].set_ylabel("gold answer in the context, as a phrase (%)")
    for ax in axes:
        if ax.get_lines():
            ax.legend(
                fontsize=7, loc="upper right", title="(overall in this half)", title_fontsize=7
            )
        else:
            ax.text(0.5, 0.5, "no conversations in this half", ha="center", transform=ax.transAxes)
    fig.suptitle(
        f"LoCoMo answer-in-context (strict) at a {result['budget']}-token budget (categories 1–4)",
        fontsize=11,
    )
    return _save(fig, path)


def reader_by_age(result: Mapping[str, Any], path: Path | str) -> Path:
    """`kioku eval locomo --reader`: F1 by where the newest evidence stands (oldest, middle,
    newest third of the conversation), one line per arm, its interval as error bars; dev and
    held-out in their own panels where both ran."""
    plt = _plt()
    thirds = list(result["age_thirds"])
    scores: Mapping[str, Mapping[str, Any]] = result["scores"]
    splits = [sp for sp in ("dev", "heldout") if any(sp in per for per in scores.values())]
    fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.6), squeeze=False)
    names = {"dev": "conversations 0–4 (dev)", "heldout": "conversations 5–9 (held out)"}
    arms = [a for a in scores if any(sp in scores[a] for sp in splits)]
    for ax, split in zip(axes[0], splits, strict=True):
        for k, arm in enumerate(arms):
            d = scores[arm].get(split)
            if not d:
                continue
            st = _style(arm)
            shift = (k - (len(arms) - 1) / 2) * 0.06  # bars of one third side by side
            xs, ys, lo, hi = [], [], [], []
            for i, t in enumerate(thirds):
                ci = d["by_age"].get(t, {}).get("f1", {})
                if ci.get("mean") is None:
                    continue
                xs.append(i + shift)
                ys.append(ci["mean"])
                lo.append(ci["mean"] - ci["lo"])
                hi.append(ci["hi"] - ci["mean"])
            overall = d["f1"].get("mean")
            label = st.pop("label") + (f" (F1 {overall:.2f})" if overall is not None else "")
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, label=label, **st)
        counts = _third_counts(result, split, thirds)
        ax.set_xticks(range(len(thirds)))
        ax.set_xticklabels([f"{t} third\n(n={counts[t]})" for t in thirds], fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("where the evidence stands in the conversation")
        ax.set_title(names[split], fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("answer F1 (LoCoMo scoring), 95% interval")
    fig.suptitle(
        f"What a model answers, by the age of what is asked ({result['budget']}-token window)",
        fontsize=11,
    )
    return _save(fig, path)


def _third_counts(result: Mapping[str, Any], split: str, thirds: Sequence[str]) -> dict[str, int]:
    got = {t: 0 for t in thirds}
    for a in result.get("answers", []):
        if a.get("split") == split and a.get("third") in got:
            got[a["third"]] += 1
    return got


def prefix_reuse(series: Mapping[str, Sequence[float]], path: Path | str, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    _reuse_panel(ax, series, title or "Prefix-cache reuse per turn")
    return _save(fig, path)


def _reuse_panel(ax: Any, series: Mapping[str, Sequence[float]], title: str) -> None:
    for name, values in series.items():
        st = _style(name.split(" ")[0])
        st.pop("marker", None)
        st["label"] = name if name not in STYLE else st["label"]
        mean = 100 * sum(values) / len(values) if values else 0.0
        st["label"] += f" (mean {mean:.0f}%)"
        ax.plot(range(1, len(values) + 1), [100 * v for v in values], **st)
    ax.set_xlabel("turn")
    ax.set_ylabel("prompt served from cache (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def demo_figure(
    facts: Mapping[str, Mapping[str, Mapping[str, Any]]],
    buckets: Sequence[str],
    explained: Mapping[str, str],
    reuse: Mapping[str, Mapping[str, Sequence[float]]],
    path: Path | str,
) -> Path:
    """The demo's PNG: per language, the planted facts each strategy still has in its final
    context by where they were planted, oldest first (top), and prefix reuse per turn, kioku
    against the sliding window (bottom). The legends sit beside the panels, never on the data;
    the strategies are named and explained once, under the figure."""
    plt = _plt()
    langs = list(facts)
    fig, axes = plt.subplots(2, len(langs), figsize=(6.8 * len(langs), 9.4), squeeze=False)
    for j, lang in enumerate(langs):
        ax = axes[0][j]
        x = list(range(len(buckets)))
        first: Mapping[str, Any] = next(iter(facts[lang].values()), {})
        counts = first.get("by_place_questions") or {}
        for name, st_ in facts[lang].items():
            st = _style(name)
            overall = st_.get("answer_in_context")
            label = st.pop("label") + (
                f" ({_pct(overall):.0f}% of all)" if overall is not None else ""
            )
            ax.plot(x, [_pct(st_["by_place"].get(b)) for b in buckets], label=label, **st)
        ax.set_xticks(x)
        ax.set_xticklabels(
            [
                f"{b}\n{counts.get(b, 0)} fact{'s' if counts.get(b, 0) != 1 else ''}"
                for b in buckets
            ],
            fontsize=8,
        )
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.set_title(f"{lang}: planted facts still in the final context", fontsize=10)
        ax.set_xlabel("where in the conversation the fact was planted  (oldest ← → newest)")
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.27), ncol=2)
        if lang in reuse:
            rx = axes[1][j]
            _reuse_panel(rx, reuse[lang], f"{lang}: prefix-cache reuse per turn")
            rx.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    axes[0][0].set_ylabel("facts whose answer is in the context (%)")
    fig.suptitle(
        "kioku demo: what each strategy still holds at the end, and what it costs the cache",
        fontsize=12,
    )
    legend = "\n".join(f"{name}: {text}" for name, text in explained.items())
    legend += (
        "\nkioku's prompt keeps its prefix until a fold (one cache break each); a sliding window "
        "shifts every turn once full, so almost nothing is reused."
    )
    fig.text(0.01, 0.005, legend, fontsize=8.5, va="bottom", ha="left", family="sans-serif")
    fig.tight_layout(rect=(0, 0.11, 1, 0.97), h_pad=3.5)
    return _save(fig, path)
