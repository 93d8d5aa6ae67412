"""The window a `kioku serve` process builds turns for, and how it follows the upstream's.

`kioku serve --window auto` asks the upstream its size at start (`kioku.service.discovery`);
this keeps it right afterwards, in two ways:

- **A refusal for size** (`learn`): the upstream refused a prompt kioku built to fit, so the
  window was a wrong guess. That turn answers with an error naming `--window` and the size the
  server said; the window shrinks to what the refusal teaches (`kioku.service.oversize`) for
  the next turns, logged once per size. One wrong guess costs one turn, not the conversation.
- **The upstream changed** (`watch`, every `Settings.window_probe_s`): asked again, the upstream
  answers another size than it did (llama-server restarted with another `-c`, Ollama loaded the
  model with its `num_ctx`, the upstream was down at start); the window follows it, up or down.
  Only a change in what the upstream says moves it, so a size learned from a refusal is not
  undone by a server that keeps saying the wrong one.

Memory already made stays as it is: a smaller window cuts the raw window at the next turn (the
ceiling), and folds follow the new sizes from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Protocol

from kioku.errors import UpstreamError
from kioku.service.oversize import learned_window

if TYPE_CHECKING:
    from kioku.config import Settings
    from kioku.engine import Kioku
    from kioku.profiles import Profile

log = logging.getLogger("kioku.service")


class Served(Protocol):
    """What the keeper reads and resizes of the service that holds it (`Service`)."""

    profile: Profile
    settings: Settings

    def engines(self) -> list[Kioku]: ...


class WindowKeeper:
    def __init__(self, svc: Served, *, own_profile: bool) -> None:
        """`own_profile`: the service built its profile and engines from its settings (not a
        test's), so a new size is built from the named profile, never from a scaled one."""
        self.svc = svc
        self.own_profile = own_profile
        self._lock = threading.RLock()
        self._task: asyncio.Task[None] | None = None

    @property
    def size(self) -> int:
        return self.svc.profile.window

    def fit(self, kk: Kioku) -> None:
        """A new engine runs on the window the service learned, when that is smaller."""
        if kk.profile.window > self.size:
            kk.reprofile(self._profile_for(kk.profile, self.size))

    def _profile_for(self, profile: Profile, size: int) -> Profile:
        if self.own_profile:
            return self.svc.settings.with_(window=size).profile_obj
        return profile.scaled(size)

    def resize(self, size: int) -> int:
        """Build the next turns for `size` tokens; the size before."""
        with self._lock:
            svc = self.svc
            before = svc.profile.window
            if size == before:
                return before
            svc.profile = self._profile_for(svc.profile, size)
            svc.settings = svc.settings.with_(window=size)
            for kk in svc.engines():
                kk.reprofile(self._profile_for(kk.profile, size))
            return before

    def learn(self, error: UpstreamError, sent_tokens: int) -> None:
        """The upstream refused a prompt of `sent_tokens` (kioku's count) for its size: shrink
        the window for the next turns and say so in the error, with the size the server said
        and the flag that sets it from the start."""
        said = error.oversize
        if said is None:
            return
        with self._lock:
            size = learned_window(self.size, sent_tokens, said)
            before = self.resize(size) if size < self.size else self.size
        now = self.size
        told = f"its context is {said.limit} tokens" if said.limit else "it did not say its size"
        flag = said.limit or now
        if now < before:
            log.warning(
                "the upstream refused a %d-token prompt for its size (%s): kioku now keeps "
                "prompts within a %d-token window (was %d); pass --window %d to kioku serve to "
                "start with it",
                sent_tokens,
                told,
                now,
                before,
                flag,
            )
        error.message += (
            f" ({told}). kioku keeps the next turns within a {now}-token window; to start with "
            f"the server's size, pass --window {flag} to kioku serve"
        )

    # the upstream changed -------------------------------------------------------------------

    def start(self) -> None:
        every = self.svc.settings.window_probe_s
        if every and self.svc.settings.llm_url and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.watch(every))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def watch(self, every_s: float) -> None:
        from kioku.profiles import get_profile
        from kioku.service.discovery import find_window

        s = self.svc.settings
        told = s.window  # what the upstream said at start
        while True:
            await asyncio.sleep(every_s)
            url = s.llm_url
            assert url is not None
            try:
                found = await asyncio.to_thread(
                    find_window, url, model=s.llm_model, api_key=s.api_key
                )
            except Exception:  # never let a probe take the service down
                log.exception("asking the upstream its window failed")
                continue
            found = found.within(get_profile(s.profile).window)
            if found.size is None or found.size == told:
                continue
            told = found.size
            before = self.resize(found.size)
            log.warning(
                "the upstream changed: %s (was %d); the next turns are built for it",
                found.line(),
                before,
            )
            if found.warning:
                log.warning("%s", found.warning)
