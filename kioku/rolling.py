"""The rolling-rewrite baseline (seeds 002/004): one summary, rewritten at every fold.

kioku is measured against it (`Kioku(strategy="rolling")`, the evaluation's `rolling` arms):
past the trigger, the synopsis and the raw messages to fold are rewritten into a new synopsis,
and no chapter is ever kept. It shares kioku's policy steps for applying what is ready and for
the ceiling's forced cut; only what it schedules differs, and it never runs a major GC.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kioku.policy import (
    Decision,
    JobPlan,
    Plan,
    State,
    cut_at_ceiling,
    fold_ready,
    pending_jobs,
    trigger_cut,
    waiting,
)


def decide(state: State) -> Decision:
    plan = cut_at_ceiling(state, fold_ready(state, just_in_time=False))
    return schedule_rewrite(state, plan).decision(state)


def schedule_rewrite(state: State, plan: Plan) -> Plan:
    """Past the trigger, with no rewrite on its way: one job folding the synopsis (and any
    stand-in chapters a forced cut left) with the raw messages up to the cut."""
    pending = pending_jobs(state, plan)
    busy = (
        any(j.kind in ("chapter", "rolling") for j in pending)
        or waiting(state, plan, "chapter")
        or waiting(state, plan, "synopsis")
    )
    cut = None if busy else trigger_cut(state, plan)
    if cut is None:
        return plan
    p = state.profile
    payload: dict[str, Any] = {"synopsis_id": plan.synopsis.id if plan.synopsis else None}
    job = JobPlan("rolling", plan.start, cut - 1, state.now + p.summary_delay_s, payload)
    reason = f"trigger: prompt {plan.prompt(state)} > {state.trigger}, rolling rewrite to {cut - 1}"
    return replace(plan, schedule=(*plan.schedule, job), reasons=(*plan.reasons, reason))
