"""`kioku serve` as a process a test kills with SIGKILL and starts again, many times, quickly.

A parent imports kioku once (and builds the command line once), then forks `kioku serve` on
each line it reads: a restart costs a fork and the server's own start, not the seconds the
imports and the command tree take (1.7 s a restart when the child ran the CLI from scratch,
which made a hundred kills cost three minutes). The forked server is killed with SIGKILL all the
same; the parent ignores SIGCHLD so the kernel reaps it at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kioku.service.loopback import free_port, wait_until_answers

ROOT = Path(__file__).resolve().parent.parent

ZYGOTE = """
import json, os, signal, sys
import typer.main, uvicorn
from kioku.cli import app, register_extensions
# what `kioku serve` imports when it runs, imported here once
import kioku.chronicler, kioku.config, kioku.counters, kioku.layers, kioku.service.app
import kioku.service.serving, kioku.tls, uvicorn.lifespan.on, uvicorn.loops.auto, uvicorn.protocols.http.auto
import uvicorn.protocols.websockets.auto
try:
    import uvicorn.loops.uvloop, uvicorn.protocols.http.httptools_impl
except ImportError:
    pass
register_extensions()
kioku.tls.tls_context()  # loaded once, shared by every fork
command = typer.main.get_command(app)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
for line in sys.stdin:
    args, log = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            command.main(args=args, prog_name="kioku")
        finally:
            os._exit(0)
    print(pid, flush=True)
"""


@dataclass
class Server:
    """`kioku serve --db DB --upstream UPSTREAM` plus `args`, on a port of its own."""

    db: str
    upstream: str
    log: Path
    key: str = ""
    args: Sequence[str] = ("--no-worker",)
    port: int = field(default_factory=free_port)
    pid: int | None = None
    zygote: subprocess.Popen[str] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def start(self) -> None:
        if self.zygote is None:
            self.zygote = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        assert self.zygote.stdin is not None and self.zygote.stdout is not None
        args = ["serve", "--db", self.db, "--upstream", self.upstream, "--port", str(self.port)]
        self.zygote.stdin.write(json.dumps([[*args, *self.args], str(self.log)]) + "\n")
        self.zygote.stdin.flush()
        self.pid = int(self.zygote.stdout.readline())
        self.starts += 1
        if wait_until_answers(f"{self.url}/healthz", alive=self.alive, poll_s=0.01):
            return
        if not self.alive():
            raise RuntimeError(f"kioku serve exited: {self.log.read_text()[-2000:]}")
        raise RuntimeError("kioku serve did not start")

    def kill(self) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        while self.alive():
            time.sleep(0.002)

    def restart(self) -> None:
        if self.alive():
            self.kill()
        self.start()

    def stop(self) -> None:
        """Kill it (a graceful stop would wait for summaries a test left hanging) and its
        parent."""
        if self.alive():
            self.kill()
        if self.zygote is not None:
            self.zygote.kill()
            self.zygote.wait(10)
            for pipe in (self.zygote.stdin, self.zygote.stdout):
                if pipe is not None:
                    pipe.close()
