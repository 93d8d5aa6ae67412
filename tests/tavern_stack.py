"""kioku serve in front of a scripted upstream, with a real SillyTavern pointed at it: the stack
the SillyTavern tests drive (`tests/tavern.py` drives the page).

The upstream answers as a chat model would for what SillyTavern asked: a reply in the speaking
character's name (SillyTavern strips the "Name: " label before it shows it), the continuation
of a continue, an impersonated line, the connection test's hello."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kioku.config import Settings
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.normal_form import normal_form
from kioku.profiles import Profile
from kioku.service.app import Service, create_app
from kioku.service.keys import create_key
from kioku.service.loopback import FakeUpstream, ServerThread, free_port
from kioku.store import Store
from tests.tavern import SillyTavern, need_sillytavern, wait_for
from tests.test_service_support import SERVICE_PROFILE, words

# small enough that 30 turns fold twice beside Seraphina's ~1,800-token card (every size is
# the rendered prompt's, card included)
PROFILE = replace(
    SERVICE_PROFILE,
    name="tavern-test",
    window=8192,
    trigger=2200,
    ceiling=2700,
    min_raw=200,
    headroom=300,
    connect_timeout_s=5.0,
    reply_timeout_s=30.0,
)
IMPERSONATED = "I lean on my staff and ask Seraphina about the old lantern."
SPEAKER = re.compile(r"only as ([^.\]]+)[.\]]")


class Script:
    """The upstream's replies, by what SillyTavern asked for: the character's replies carry the
    "Seraphina: " label SillyTavern strips before it shows them (in a group, the name of the
    member SillyTavern's nudge asks for)."""

    def __init__(self) -> None:
        self.n = itertools.count()

    def __call__(self, body: dict[str, Any]) -> str:
        k = next(self.n)
        last = str(body["messages"][-1]["content"])
        if "from the point of view of" in last:
            return IMPERSONATED
        if "[Continue the following message" in last:
            return f"She pauses, then adds a word about the river ({k})."
        if last.endswith("Hi"):
            return "Hello! The connection works."
        asked = SPEAKER.search(last)
        who = asked.group(1).strip() if asked else "Seraphina"
        return f"{who}: *She nods.* Reply {k}: {words(k, 25)}"


class Received:
    """The requests SillyTavern sent kioku (ASGI middleware): what it resent of its chat."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def recorded() -> Any:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                self.bodies.append(json.loads(b"".join(chunks) or b"{}"))
            return message

        return await self.app(scope, recorded, send)


@dataclass
class Stack:
    up: FakeUpstream
    store: Store
    svc: Service
    tavern: SillyTavern
    received: Received

    def idle(self) -> None:
        """Replies stored and summaries written (the embedded worker polls every 0.1 s)."""

        def settled() -> bool:
            return not self.svc._tasks and not any(
                self.store.jobs(c.id, "queued", "running") for c in self.store.conversations()
            )

        wait_for(settled, 30, "kioku to settle")

    def key(self, name: str) -> str:
        return self.store.find_conversation("tavern", name).id

    def rows(self, cid: str) -> list[tuple[int, str, str]]:
        """(seq, role, text) of the messages the client can see (not deleted)."""
        return [
            (e.seq, e.role, e.text) for e in self.store.entries(cid) if not e.message.is_empty()
        ]


@contextmanager
def running(
    tmp_path: Path,
    *,
    context: int = 60000,
    extension: bool = True,
    setup: Callable[[SillyTavern], None] | None = None,
    profile: Profile = PROFILE,
    card_as_sent: bool = False,
) -> Iterator[Stack]:
    """The stack on a fresh data folder. `context`: SillyTavern's context size; `extension`:
    installed and set up (else the test installs it); `setup`: more of the data folder
    (characters, groups) before SillyTavern starts; `card_as_sent`: kioku's ablation."""
    root = need_sillytavern()
    db = f"sqlite:///{tmp_path / 'kioku.db'}"
    store = Store.open(db)
    key = create_key(store, "tavern")[1]
    st_port = free_port()

    def make(tenant: str, store: Store) -> Kioku:
        return Kioku(store, profile=profile, tenant=tenant, layers=Layers(store))

    with FakeUpstream(reply=Script()) as up:
        settings = Settings(db=db, llm_url=up.url, cors_origins=(f"http://127.0.0.1:{st_port}",),
                            card_as_sent=card_as_sent)  # fmt: skip
        app = create_app(settings, store=store, make_kioku=make, worker_poll_s=0.1,
                         profile=profile)  # fmt: skip
        received = Received(app)
        with ServerThread(received) as server:
            tavern = SillyTavern(root, tmp_path / "tavern-data", server.url, key)
            tavern.port, tavern.url = st_port, f"http://127.0.0.1:{st_port}"
            tavern.configure(extension=extension, context=context)
            if setup is not None:
                setup(tavern)
            tavern.start()
            try:
                yield Stack(up, store, app.state.service, tavern, received)
            finally:
                tavern.stop()
                shutil.rmtree(tmp_path / "tavern-data", ignore_errors=True)


def same(a: str, b: str) -> bool:
    """The client shows the reply tidied: equal in kioku's normal form."""
    return normal_form(a) == normal_form(b)


def alternates(messages: list[dict[str, Any]]) -> bool:
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    return all(m["role"] == ("user" if k % 2 == 0 else "assistant") for k, m in enumerate(body))
