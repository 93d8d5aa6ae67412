"""A server a test runs as a child process (llama.cpp, SillyTavern): its log, waiting until it
answers, and stopping it however it behaves."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kioku.service.loopback import wait_until_answers

READY_TIMEOUT_S = 120.0


class ChildServer:
    """Subclasses set `name` and `log`, then `launch` their command."""

    name = "server"
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def launch(
        self, args: Sequence[str], ready_url: str, *, cwd: Path | None = None, poll_s: float = 0.25
    ) -> None:
        """Start `args` with its output in `log`; return once `ready_url` answers 200."""
        with self.log.open("wb") as out:
            proc = self.proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        if wait_until_answers(
            ready_url,
            alive=lambda: proc.poll() is None,
            timeout_s=READY_TIMEOUT_S,
            poll_s=poll_s,
            request_timeout_s=2,
        ):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {proc.returncode}:\n{self.tail()}")
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {READY_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to open connections."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
