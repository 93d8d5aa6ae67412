"""Test doubles shared by the engine tests."""

from __future__ import annotations

from sqlalchemy import insert

from kioku.engine import Kioku
from kioku.errors import ModelUnavailable
from kioku.layers import Layers
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.store import schema as s
from kioku.summarizer import ExtractiveSummarizer, Summary, SummaryTask
from kioku.tokens import ScriptEstimator


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class FlakySummarizer:
    """Extractive summaries, but fails on the calls whose index is in `fail_on`.
    Records every task it got."""

    def __init__(self, fail_on: set[int] | None = None, always_fail: bool = False) -> None:
        self.inner = ExtractiveSummarizer(ScriptEstimator())
        self.fail_on = fail_on or set()
        self.always_fail = always_fail
        self.tasks: list[SummaryTask] = []

    def summarize(self, task: SummaryTask) -> Summary:
        n = len(self.tasks)
        self.tasks.append(task)
        if self.always_fail or n in self.fail_on:
            raise ModelUnavailable("scripted failure")
        return self.inner.summarize(task)


def store_unchecked_conversation(store: Store, conversation_id: str, tenant: str) -> None:
    """A conversation row written past `ensure_conversation`'s id check, as one stored before
    ids had a charset was."""
    with store.atomic() as conn:
        conn.execute(
            insert(s.conversations).values(
                id=conversation_id,
                public_id=conversation_id,
                tenant=tenant,
                character="",
                system_prompt="",
                profile="x",
                next_seq=0,
                raw_start=0,
                memory_version=0,
                created_at=0.0,
            )
        )


PROFILE = LOCAL_8K.scaled(4096)  # a window small enough that a test folds in a few turns


def layered() -> tuple[Kioku, Clock]:
    """An engine with every layer on (recall, notes, the tic guard) on an in-memory store, a
    4,096 window, and the clock its test moves."""
    clock = Clock()
    store = Store.open("sqlite://")
    return Kioku(store, profile=PROFILE, clock=clock, layers=Layers(store)), clock
