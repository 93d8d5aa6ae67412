"""What one `kioku serve` process holds: the store, the upstream, a `Kioku` per tenant, a slot
per conversation (`kioku.service.slot`), the turn gate, keys and metrics, and the embedded
worker. The app (`kioku.service.app`) builds one; its routers read it from the request."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.concurrency import run_in_threadpool

from kioku.config import Settings, build_kioku
from kioku.engine import Kioku
from kioku.errors import ConfigError
from kioku.profiles import Profile
from kioku.service.keys import KeyRing
from kioku.service.metrics import Metrics
from kioku.service.slot import Slot
from kioku.service.turns import Gate
from kioku.service.upstream import KEEPALIVE_S, Upstream
from kioku.service.window import WindowKeeper
from kioku.store import Store

__all__ = ["MAX_SLOTS", "WORKER_TENANT", "Service"]

MAX_SLOTS = 10_000
WORKER_TENANT = "-worker-"  # the embedded worker's Kioku never opens a conversation


class Service:
    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        upstream: Upstream | None = None,
        make_kioku: Callable[[str, Store], Kioku] | None = None,
        worker: bool = True,
        worker_poll_s: float = 1.0,
        profile: Profile | None = None,
    ) -> None:
        self.settings = settings
        self.profile = profile or settings.profile_obj
        self.store = store or Store.open(settings.db)
        if upstream is None:
            if not settings.llm_url:
                raise ConfigError("no upstream: pass --upstream URL (or set KIOKU_LLM_URL)")
            upstream = Upstream(
                settings.llm_url,
                self.profile,
                api_key=settings.api_key,
                model=settings.llm_model,
            )
        self.upstream = upstream
        self._make = make_kioku or (
            lambda tenant, store: build_kioku(self.settings.with_(tenant=tenant), store=store)
        )
        self.keys = KeyRing(self.store)
        self.metrics = Metrics()
        self.keepalive_s = KEEPALIVE_S  # upstream silence before a streamed keep-alive comment
        self.worker = worker
        self.worker_poll_s = worker_poll_s
        self._tenants: dict[str, Kioku] = {}
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[str, str], Slot] = OrderedDict()
        self._worker_kk: Kioku | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # the window turns are built for, resized when the upstream says (or shows) another
        self.window = WindowKeeper(self, own_profile=profile is None and make_kioku is None)
        # a request waits for the conversation's turn at most as long as one turn can take
        self.gate = Gate(
            self.store,
            wait_s=self.profile.reply_timeout_s + self.profile.connect_timeout_s,
            spawn=self.spawn,
            slot=self.slot,
        )

    def conversation_key(self, tenant: str, conversation_id: str) -> str | None:
        """The store's key of a tenant's conversation, None if it has none by that id."""
        return self.store.conversation_key(tenant, conversation_id)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run work after a response (kept until done; `close` waits for it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def kioku(self, tenant: str) -> Kioku:
        with self._lock:
            kk = self._tenants.get(tenant)
            if kk is None:
                kk = self._tenants[tenant] = self._make(tenant, self.store)
                self.window.fit(kk)
            return kk

    def engines(self) -> list[Kioku]:
        """Every `Kioku` this process built (the tenants' and the embedded worker's)."""
        with self._lock:
            return [*self._tenants.values(), *([self._worker_kk] if self._worker_kk else [])]

    def slot(self, tenant: str, conversation: str) -> Slot:
        """The slot of the conversation whose store key is `conversation` (never a name)."""
        key = (tenant, conversation)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = Slot()
            if len(self._slots) > MAX_SLOTS:
                for k in list(self._slots)[: MAX_SLOTS // 10]:
                    if not self._slots[k].lock.locked():
                        del self._slots[k]
        else:
            self._slots.move_to_end(key)
        return slot

    def start(self) -> None:
        if self.worker and self._worker_kk is None:
            self._worker_kk = self._make(WORKER_TENANT, self.store)
            self.window.fit(self._worker_kk)
            self._worker_kk.start_background(self.worker_poll_s)
        self.window.start()

    async def close(self) -> None:
        await self.window.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._worker_kk is not None:
            await run_in_threadpool(self._worker_kk.close)
            self._worker_kk = None
        await self.upstream.aclose()
