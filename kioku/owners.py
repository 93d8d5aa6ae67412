"""Who holds a lease, and whether that holder can still be alive.

A lease (a summary job's, a turn lock's row on SQLite) names its holder `host:pid:token`, with a
token made once per process: a pid alone is reused (a restarted container's server is pid 1
again). The host is the host name and the process's pid namespace, since two containers may share
a host name and see each other's pids as nothing. A holder on this host whose process is gone,
or a zombie its parent has not reaped yet, holds nothing any more: its lease is taken over at
once instead of when it runs out. A holder on another host, or a name of another form (a worker
named on the command line), may be alive; its lease decides.
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import cache

_LIVE_TOKENS: set[str] = set()  # the tokens made in this process (several owners in tests)


@cache
def this_host() -> str:
    """The host as a holder name gives it: its name, and the pid namespace where pids mean
    what they mean here."""
    try:
        ns = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}@{ns}"


def new_owner(*parts: object) -> str:
    """A holder name for this process, `host:pid:token` (plus `parts`, such as a thread)."""
    token = uuid.uuid4().hex[:8]
    _LIVE_TOKENS.add(token)
    name = f"{this_host()}:{os.getpid()}:{token}"
    return ":".join([name, *(str(p) for p in parts)])


def forget(name: str) -> None:
    """This process no longer holds anything as `name` (its holder was stopped)."""
    fields = name.split(":")
    if len(fields) >= 3:
        _LIVE_TOKENS.discard(fields[2])


def may_be_alive(name: str) -> bool:
    """False only when `name` surely names a holder that is gone: one of this host whose process
    ended (or is a zombie), or one of this process that is no longer live."""
    fields = name.split(":")
    if len(fields) < 3 or fields[0] != this_host():
        return True
    try:
        pid = int(fields[1])
    except ValueError:
        return True
    if pid == os.getpid():
        return fields[2] in _LIVE_TOKENS  # else a process before this one had our pid
    return _process_runs(pid)


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet holds nothing any more
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
