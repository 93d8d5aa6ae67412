"""The running service for the service tests: kioku serve (uvicorn in a thread, SQLite in a temp
dir) in front of a fake OpenAI-compatible upstream that records every request it got.

No tests here; the fixtures are imported by the test_service_* modules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kioku.config import Settings
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.profiles import Profile
from kioku.service.app import Service, create_app
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, ServerThread, default_reply
from kioku.store import Store

# Small enough that a test reaches folds in a few dozen messages; timeouts short enough that
# the timeout test is quick.
SERVICE_PROFILE = Profile(
    name="service-test",
    window=4096,
    response_reserve=256,
    trigger=800,
    ceiling=1100,
    min_raw=150,
    headroom=250,
    chapter_tokens=120,
    synopsis_tokens=150,
    major_gc=300,
    summary_chunk=400,
    notes_tokens=60,
    summary_delay_s=0.0,
    connect_timeout_s=2.0,
    reply_timeout_s=2.0,
)

VOCAB = ["river", "lantern", "orchard", "violin", "harbor", "meadow", "pebble", "thunder",
         "saffron", "willow"]  # fmt: skip


def words(i: int, n: int = 30) -> str:
    """A distinct, deterministic line of `n` words: message `i` of a test transcript."""
    return " ".join(VOCAB[(i * 7 + k) % len(VOCAB)] for k in range(n)) + f" (line {i})."


@dataclass
class Harness:
    url: str
    up: FakeUpstream
    store: Store
    svc: Service
    keys: dict[str, str] = field(default_factory=dict)

    def key(self, tenant: str) -> str:
        if tenant not in self.keys:
            self.keys[tenant] = create_key(self.store, tenant)[1]
        return self.keys[tenant]

    def openai(self, tenant: str = "acme", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.key(tenant), max_retries=0, **kw
        )

    def http(self, tenant: str | None = "acme", **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key(tenant)}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, **{"timeout": 30, **kw})

    def idle(self, timeout_s: float = 10.0) -> None:
        """Wait until replies being stored after their responses are stored."""
        end = time.monotonic() + timeout_s
        while self.svc._tasks and time.monotonic() < end:
            time.sleep(0.01)
        assert not self.svc._tasks, "the service did not settle"

    def run_jobs(self) -> int:
        return self.svc.kioku("acme").worker.run_until_idle()

    def texts(self, conversation_id: str) -> list[str]:
        self.idle()
        return [e.text for e in self.store.entries(conversation_id)]


def make_kioku(tenant: str, store: Store) -> Kioku:
    return Kioku(store, profile=SERVICE_PROFILE, tenant=tenant, layers=Layers(store))


@contextmanager
def running(db: str, **settings: Any) -> Iterator[Harness]:
    """kioku serve on `db` in front of a fresh fake upstream; `settings` change `Settings`."""
    store = Store.open(db)
    with FakeUpstream() as up:
        app = create_app(
            Settings(db=db, llm_url=up.url, **settings),
            store=store,
            make_kioku=make_kioku,
            worker=False,
            profile=SERVICE_PROFILE,
        )
        with ServerThread(app) as server:
            yield Harness(server.url, up, store, app.state.service)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('service')) / 'kioku.db'}"
    with running(db) as h:
        yield h


@pytest.fixture
def service(harness: Harness) -> Iterator[Harness]:
    """The module's service with the fake upstream back to its defaults after each test."""
    yield harness
    harness.idle()
    harness.up.reply = default_reply
    harness.up.fail = None
    harness.up.error = None
    harness.up.garbage = None
    harness.up.delay_s = 0.0
    harness.up.chunk_delay_s = 0.0
