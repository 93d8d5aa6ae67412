"""The narrow views of the store its callers take, as typing protocols.

`Store` is one object over every table (`kioku.store.conversations`); a function that needs a
part of it says which part by taking one of these, the way sqlite-utils gives a `Database` and its
`atomic()` block rather than a connection. `Store` satisfies each of them (checked by mypy below),
and a test double need only write the methods of the view it stands in for.

- `Events`: the event log and counters every layer writes to.
- `LogReads`: a conversation, its messages, its memory items and their edited versions.
- `TurnStore`: what a turn reads and writes (the message, its meta, the notes snapshot, a fold,
  the jobs it schedules).
- `JobStore`: what the worker needs to lease, run and finish summary jobs.
- `OperatorStore`: what an operator's correction of memory writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from kioku.job import Job, JobKind, JobStatus
from kioku.memory import ItemStatus, MemoryItem
from kioku.messages import LogEntry, Message

if TYPE_CHECKING:
    from kioku.store.conversations import ConversationInfo, Store

__all__ = ["Events", "JobStore", "LogReads", "OperatorStore", "TurnStore"]


class Events(Protocol):
    def log(
        self,
        conversation_id: str,
        event_name: str,
        outcome: str = "ok",
        *,
        duration_s: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_seq: int | None = None,
        last_seq: int | None = None,
        detail: str | None = None,
        at: float | None = None,
    ) -> None: ...

    def incr(self, conversation_id: str, name: str, by: int = 1) -> None: ...


class LogReads(Protocol):
    def conversation(self, conversation_id: str, tenant: str | None = None) -> ConversationInfo: ...

    def entries(
        self, conversation_id: str, first: int = 0, last: int | None = None
    ) -> list[LogEntry]: ...

    def tail(self, conversation_id: str, n: int, role: str | None = None) -> list[LogEntry]: ...

    def items(self, conversation_id: str, *statuses: ItemStatus) -> list[MemoryItem]: ...

    def changed_seqs(self, conversation_id: str, first: int, last: int) -> list[int]: ...

    def message_versions(self, conversation_id: str, seq: int) -> list[dict[str, Any]]: ...


class TurnStore(Events, LogReads, Protocol):
    def atomic(self) -> AbstractContextManager[Any]: ...

    def append(
        self,
        conversation_id: str,
        message: Message,
        tokens: int,
        meta: dict[str, Any] | None = None,
    ) -> LogEntry: ...

    def set_meta(self, conversation_id: str, seq: int, meta: dict[str, Any]) -> None: ...

    def notes_snapshot(self, conversation_id: str) -> str: ...

    def set_notes_snapshot(self, conversation_id: str, text: str, memory_version: int) -> None: ...

    def blobs(self, shas: Iterable[str]) -> dict[str, bytes]: ...

    def fold(
        self,
        conversation_id: str,
        *,
        activate: Sequence[int],
        retire: Sequence[int],
        raw_start: int,
        expect_raw_start: int | None = None,
        add: Sequence[MemoryItem] = (),
    ) -> int: ...

    def retire_items(self, conversation_id: str, ids: Sequence[int]) -> None: ...

    def jobs(self, conversation_id: str, *statuses: JobStatus) -> list[Job]: ...

    def enqueue_job(
        self,
        conversation_id: str,
        kind: JobKind,
        first_seq: int,
        last_seq: int,
        run_after: float,
        payload: dict[str, Any] | None = None,
    ) -> int: ...

    def cancel_jobs(self, conversation_id: str, up_to_seq: int) -> int: ...


class JobStore(Events, LogReads, Protocol):
    def claim_job(
        self,
        worker: str,
        now: float,
        lease_s: float = 30.0,
        conversation_id: str | None = None,
        delay_s: float | None = None,
    ) -> Job | None: ...

    def renew_job(self, job_id: int, worker: str, until: float) -> bool: ...

    def complete_job(
        self,
        job_id: int,
        conversation_id: str,
        item: MemoryItem | None,
        worker: str | None = None,
    ) -> int | None: ...

    def retry_job(
        self, job_id: int, run_after: float, error: str, worker: str | None = None
    ) -> bool: ...

    def finish_job(
        self,
        job_id: int,
        status: JobStatus = "done",
        error: str | None = None,
        worker: str | None = None,
    ) -> bool: ...

    def expire_dead_leases(self, now: float, alive: Callable[[str], bool]) -> int: ...

    # a revision the worker writes beside a job's own item (a chapter tidied of habits)
    def add_item(self, conversation_id: str, item: MemoryItem) -> int: ...


class OperatorStore(Events, LogReads, Protocol):
    def atomic(self) -> AbstractContextManager[Any]: ...

    def add_item(self, conversation_id: str, item: MemoryItem) -> int: ...


if TYPE_CHECKING:

    def _store_is_every_view(s: Store) -> tuple[TurnStore, JobStore, OperatorStore]:
        return s, s, s  # mypy checks that Store satisfies each protocol
