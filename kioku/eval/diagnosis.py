"""Why an arm loses: where its answers come from, and what retrieval found that it did not.

A rate says who wins; it does not say what to change. For every question each arm's row
records which part of its prompt holds the answer (memory exchange, raw window, the
recollection in front of the question), which part holds the evidence turn (its text, as
LoCoMo's `evidence` names it), and the evidence's rank among the turns plain BM25 returns for
the question (`retrieval`'s ranking). From those rows, per half (dev / held out):

- `vs_retrieval`: each arm against `retrieval`, question by question — both hit, only one, none;
  and the questions the arm loses, by the evidence's BM25 rank (1–3, 4–10, 11+, not found,
  none given), by where the arm's prompt had the evidence (memory, raw, recall, nowhere), the
  recollection tokens the arm's prompt used on them, and how often the allocator dropped
  recollections that did not fit;
- `evidence_rank`: how often the evidence is among BM25's best three turns at all;
- `sources`: the share of each arm's hits, overall and on old evidence, found in each part of
  its prompt (a hit found only in the memory exchange is what chapters, synopsis and notes add).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kioku.context import Account

from .answers import Match, mean

PARTS = ("memory", "raw", "recall")
RANK_BUCKETS = ("1-3", "4-10", "11+", "not found", "no evidence")
BASELINE = "retrieval"
UNBOUNDED = 10**8  # a window this large is no budget


@dataclass(frozen=True)
class Row:
    """One question asked of one arm's context."""

    conversation: int
    number: int  # the question's index in its conversation's QA list
    split: str
    strategy: str
    category: int
    age: int | None
    old: bool
    match: Match
    tokens: int
    found_in: tuple[str, ...] = ()  # parts of the prompt the strict answer is in
    evidence_in: tuple[str, ...] = ()  # parts of the prompt an evidence turn is in
    evidence_rank: int | None = None  # best BM25 rank of an evidence turn (1 = first)
    has_evidence: bool = True
    account: Account | None = None
    answer_f1: float | None = None  # a model's answer, scored as the LoCoMo paper does
    correct: bool | None = None
    error: str = ""

    @property
    def key(self) -> tuple[int, int]:
        return (self.conversation, self.number)

    @property
    def hit(self) -> bool:
        return self.match.strict


def rank_bucket(row: Row) -> str:
    if not row.has_evidence:
        return "no evidence"
    r = row.evidence_rank
    if r is None:
        return "not found"
    return "1-3" if r <= 3 else "4-10" if r <= 10 else "11+"


def _share(rows: Sequence[Row], pred: Callable[[Row], bool]) -> float | None:
    return mean(float(pred(r)) for r in rows) if rows else None


def prompt_split(rows: Sequence[Row]) -> dict[str, float | None]:
    """Mean tokens of each part of the prompt, what was left unused, and what recall dropped."""
    accounts = [r.account for r in rows if r.account is not None]
    if not accounts:
        return {}

    def avg(get: Callable[[Account], float]) -> float:
        return round(sum(get(a) for a in accounts) / len(accounts), 1)

    limited = all(a.window < UNBOUNDED for a in accounts)  # the full reference has no budget
    return {
        "system": avg(lambda a: a.system),
        "memory": avg(lambda a: a.memory),
        "raw": avg(lambda a: a.raw),
        "recollections": avg(lambda a: a.recollections),
        "instructions": avg(lambda a: a.instructions),
        "question": avg(lambda a: a.new),
        "overhead": avg(lambda a: a.overhead),
        "unused": avg(lambda a: max(0, a.window - a.reserve - a.total)) if limited else None,
        "dropped_recollections": avg(lambda a: a.dropped_recollections),
        "recall_dropped_share": mean(float(a.dropped_recollections > 0) for a in accounts),
    }


def sources(rows: Sequence[Row]) -> dict[str, Any]:
    """Where an arm's hits are: the share found in each part, and found only there."""
    hits = [r for r in rows if r.hit]
    out: dict[str, Any] = {"hits": len(hits)}
    for p in PARTS:
        out[p] = _share(hits, lambda r, p=p: p in r.found_in)  # type: ignore[misc]
        out[f"only_{p}"] = _share(hits, lambda r, p=p: r.found_in == (p,))  # type: ignore[misc]
    return out


def versus(mine: Sequence[Row], theirs: Sequence[Row]) -> dict[str, Any]:
    """Question by question against another arm; the questions `mine` loses, explained."""
    other = {r.key: r for r in theirs}
    pairs = [(r, other[r.key]) for r in mine if r.key in other]
    tally = Counter((a.hit, b.hit) for a, b in pairs)
    lost = [a for a, b in pairs if b.hit and not a.hit]
    out: dict[str, Any] = {
        "questions": len(pairs),
        "both": tally[(True, True)],
        "only_this": tally[(True, False)],
        "only_other": tally[(False, True)],
        "neither": tally[(False, False)],
    }
    if lost:
        ranks = Counter(rank_bucket(r) for r in lost)
        where = Counter(next((p for p in PARTS if p in r.evidence_in), "nowhere") for r in lost)
        recall = [r.account.recollections for r in lost if r.account is not None]
        dropped = [r.account.dropped_recollections > 0 for r in lost if r.account is not None]
        out["lost"] = {
            "by_evidence_rank": {b: ranks[b] for b in RANK_BUCKETS if ranks[b]},
            "evidence_in": {w: where[w] for w in (*PARTS, "nowhere") if where[w]},
            "old": sum(1 for r in lost if r.old),
            "recall_tokens_mean": round(sum(recall) / len(recall), 1) if recall else None,
            "recall_dropped_share": mean(float(d) for d in dropped),
        }
    return out


def evidence_ranks(rows: Sequence[Row]) -> dict[str, Any]:
    """How BM25 ranks the evidence, and how often `rows`' arm hits in each rank bucket."""
    out: dict[str, Any] = {}
    for b in RANK_BUCKETS:
        mine = [r for r in rows if rank_bucket(r) == b]
        if mine:
            out[b] = {"questions": len(mine), "hit": _share(mine, lambda r: r.hit)}
    return out


def diagnose(rows: Iterable[Row], names: Sequence[str]) -> dict[str, Any]:
    """The diagnosis for each half present in `rows`."""
    rows = list(rows)
    out: dict[str, Any] = {}
    for split in ("dev", "heldout"):
        part = [r for r in rows if r.split == split]
        if not part:
            continue
        by_arm = {n: [r for r in part if r.strategy == n] for n in names}
        d: dict[str, Any] = {
            "sources": {
                n: {"all": sources(rs), "old": sources([r for r in rs if r.old])}
                for n, rs in by_arm.items()
                if rs
            }
        }
        if by_arm.get(BASELINE):
            base = by_arm[BASELINE]
            d["evidence_rank"] = {
                n: evidence_ranks(rs) for n, rs in by_arm.items() if rs and n != "full"
            }
            d["vs_retrieval"] = {
                n: versus(rs, base) for n, rs in by_arm.items() if rs and n != BASELINE
            }
        out[split] = d
    return out


def headline_gaps(strategies: Mapping[str, Any], arm: str = "generational") -> dict[str, Any]:
    """`arm` against each other arm and against the full reference, per half: the margins the
    issue sets floors on (strict match; old evidence beside it)."""
    out: dict[str, Any] = {}
    mine = strategies.get(arm)
    if not mine:
        return out
    for split in ("dev", "heldout"):
        me = mine.get(split)
        if not me:
            continue
        row: dict[str, Any] = {}
        for name, s in strategies.items():
            other = s.get(split)
            if name == arm or not other:
                continue
            if name == "full":
                row["share_of_full"] = _ratio(me["answer_in_context"], other["answer_in_context"])
                row["old_share_of_full"] = _ratio(me["old"], other["old"])
            else:
                row[f"minus_{name}"] = _diff(me["answer_in_context"], other["answer_in_context"])
        out[split] = row
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None
