"""Builds the corpus's cases that come from data, not from hand (run by hand, with the shared
datasets and fixtures: `KIOKU_SHARED=… PYTHONPATH=. python -m tests.cases.build`).

- grounding: every line the real small model wrote in the kept chronicler reply logs
  (`fixtures/chronicler-small-model/`), as the chronicler checked it, with the messages it
  cites and their neighbours (`check.NEAR`); a line whose verdict on those alone differs
  from its verdict on the whole span is left out (its case would not be self-contained).
- need: LoCoMo's own evaluation questions: each asks about one of the two speakers by name.

Writes `grounding.fixture.jsonl` and `need.locomo.jsonl` beside this file; their lines are
then part of `grounding.jsonl` and `need.jsonl`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from kioku.grounding import check as check_mod
from kioku.grounding.check import NEAR, Evidence, Statement, Verdict
from tests.cases.corpus import HERE, need_outcome, verdict


def _source_json(s: check_mod.Source) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": s.seq, "author": s.author, "role": s.role}
    if s.day:
        out["day"] = s.day.isoformat()
    out["pieces"] = [[p.kind, p.speaker, p.text, p.raw] for p in s.pieces]
    return out


def grounding_from_fixtures() -> list[dict[str, Any]]:
    from kioku.errors import BadSummary
    from kioku.grounding.evidence import known_threads, task_evidence
    from kioku.grounding.records import ground_record, record_from_reply
    from kioku.profiles import LOCAL_8K
    from kioku.reply_format import looks_like_json, parse_lines
    from kioku.structure import parse_record
    from kioku.summarizer import SummaryTask
    from tests.test_chronicler_fixture import FIXTURES, entries_of, recorded, transcript

    seen: list[tuple[Statement, Verdict, Evidence, str]] = []
    real = Evidence.check

    def spy(self: Evidence, st: Statement) -> Verdict:
        v = real(self, st)
        seen.append((st, v, self, spy.name))  # type: ignore[attr-defined]
        return v

    out: list[dict[str, Any]] = []
    Evidence.check = spy  # type: ignore[method-assign]
    try:
        for name in FIXTURES:
            t = transcript(name)
            spy.name = name  # type: ignore[attr-defined]
            for rec in recorded(name):
                task = SummaryTask(
                    "chapter",
                    LOCAL_8K.chapter_tokens,
                    entries_of(t, rec.first, rec.last),
                    lang=t.lang,
                    character=t.character,
                    user_name=t.user,
                    window_tokens=LOCAL_8K.window,
                )
                ev, th = task_evidence(task), known_threads(task)
                for text in rec.replies:
                    start = len(seen)
                    try:
                        if looks_like_json(text):
                            ground_record(parse_record(text, None), ev, th)
                        else:
                            record_from_reply(parse_lines(text), ev, th)
                    except BadSummary:
                        continue
                    # the outermost check of each line (a line without a seq checks again,
                    # citing each candidate: the first call's verdict is the line's)
                    depth_seen = seen[start:]
                    out += _cases(depth_seen, name, t.lang)
    finally:
        Evidence.check = real  # type: ignore[method-assign]
    return out


_DONE: set[tuple[str, str, tuple[int, ...]]] = set()


def _cases(
    checked: list[tuple[Statement, Verdict, Evidence, str]], name: str, lang: str
) -> list[dict[str, Any]]:
    out = []
    for st, v, ev, _ in checked:
        key = (st.text, v.reason or "ok", st.seqs)
        if key in _DONE or not st.seqs and not st.span_wide and v.ok:
            continue  # a located line's own verdict is its first call's
        _DONE.add(key)
        cited = set(st.seqs) | set(v.seqs)
        near = {n for s in cited for n in range(s - NEAR, s + NEAR + 1)} & set(ev.sources)
        if not near:
            near = set(sorted(ev.sources)[: 2 * NEAR + 1])
        case: dict[str, Any] = {
            "lang": lang,
            "source": f"fixture:{name}",
            "kind": st.kind,
            "line": st.text,
        }
        if st.seqs:
            case["seqs"] = list(st.seqs)
        for f in ("author", "subject"):
            if getattr(st, f):
                case[f] = getattr(st, f)
        if st.verbatim:
            case["verbatim"] = True
        if st.span_wide:
            case["span_wide"] = True
        case["users"] = list(ev.user_names)
        case["characters"] = list(ev.character_names)
        if ev.memory_text:
            case["memory"] = ev.memory_text
        if v.reason == "prompt":
            case["prompt"] = v.detail.split('"')[1]
        case["sources"] = [_source_json(ev.sources[s]) for s in sorted(near)]
        case["verdict"] = v.reason or "ok"
        case["rule"] = v.reason or "grounded"
        case["why"] = v.detail
        if (verdict(case).reason or "ok") == case["verdict"]:
            out.append(case)
    return out


def need_from_locomo(per_conversation: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    from tests.conftest import shared_file

    path = Path(shared_file("datasets", "locomo", "locomo10.json"))
    data = json.loads(path.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    out = []
    for conv in data:
        c = conv["conversation"]
        people = [c["speaker_a"], c["speaker_b"]]
        qs = [q["question"] for q in conv["qa"] if q.get("category") != 5]
        named = [q for q in qs if any(p in q for p in people)]
        for q in rng.sample(named, min(per_conversation, len(named))):
            whom = min((p for p in people if p in q), key=q.index)
            case = {"lang": "en", "source": "locomo", "message": q, "about": whom, "wants": True}
            o = need_outcome(case)
            case["rule"] = o.rule
            if not o.right:
                case["known"] = f"the rule takes {o.got['about']!r} for the one asked about"
            out.append(case)
    return out


def main() -> None:
    g = grounding_from_fixtures()
    (HERE / "grounding.fixture.jsonl").write_text(
        "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in g), encoding="utf-8"
    )
    n = need_from_locomo()
    (HERE / "need.locomo.jsonl").write_text(
        "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in n), encoding="utf-8"
    )
    print(len(g), "grounding cases,", len(n), "need cases")


if __name__ == "__main__":
    main()
