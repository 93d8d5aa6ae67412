"""A summary job as a value: what kind of summary, over which seqs, in which state.

The queue that stores, leases and retries jobs is `kioku.store.jobs`; this module is the value
the policy decides with and the worker runs, so neither needs the store to name a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DEFAULT_LEASE_S", "Job", "JobKind", "JobStatus"]

# chapter: a raw range; synopsis: a major GC; rolling: the rolling baseline's rewrite;
# revision: the re-summary of an item a client's edit made stale
JobKind = Literal["chapter", "synopsis", "rolling", "revision"]
JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]

# A lease is renewed every third of it while the job runs: a worker that died is replaced
# within this long (at once on its own host), however long a summary takes.
DEFAULT_LEASE_S = 30.0


@dataclass(frozen=True)
class Job:
    id: int
    conversation_id: str
    kind: JobKind
    first_seq: int
    last_seq: int
    status: JobStatus
    attempts: int
    run_after: float
    payload: dict[str, Any]
    error: str = ""  # what its last failed try raised ("ModelTimeout: …"), until it is done
