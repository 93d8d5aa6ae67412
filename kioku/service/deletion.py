"""Deleting a conversation, as `kioku delete` and `DELETE /v1/conversations/{id}` do it.

A delete is a turn of its own: it waits for the conversation's turn lock (`Gate.enter`), so a
turn in flight finishes first, and a turn that arrives during the delete waits for it and then
starts a new conversation under the same id. Inside the lock the store removes every row of the
conversation in one transaction (`kioku.store.removal`), the turn lock's own record included;
what this process cached of it (the slot's conversation, the recall index, tic state) is
dropped before the lock is let go. The command line takes the same lock through a `Gate` of
its own, across processes (the store's lock: an advisory lock on PostgreSQL, the lock row on
SQLite), so it is safe while `kioku serve` runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from kioku.hooks import MemoryLayers
from kioku.service.api import ConversationId, _conversation
from kioku.service.auth import tenant_of
from kioku.service.limits import StrictJSONRoute
from kioku.service.slot import Slot
from kioku.service.turns import Gate, Ticket, name_request
from kioku.store.turns import HeldTurn

if TYPE_CHECKING:
    from kioku.service.state import Service

Tenant = Annotated[str, Depends(tenant_of)]
log = logging.getLogger("kioku.service")
# a delete that has not had the turn after this long is waiting for one in flight: say so
WAITING_NOTE_S = 0.2

router = APIRouter(prefix="/v1/conversations", tags=["conversations"], route_class=StrictJSONRoute)


@dataclass(frozen=True)
class Deleted:
    conversation: str  # the id the tenant named it by
    rows: dict[str, int]  # rows deleted per table

    @property
    def total(self) -> int:
        return sum(self.rows.values())


async def delete_conversation(
    gate: Gate,
    tenant: str,
    conversation_id: str,
    layers: MemoryLayers | None = None,
    waiting: Callable[[], None] | None = None,
) -> Deleted:
    """Wait for the conversation's turn, then delete every row of it (NotFound if the tenant
    has none by that id, also when another delete took it while this one waited). `waiting()`
    is called once when the turn is not had at once (a turn is in flight)."""
    # a name of its own: a delete is never a replay of another request
    request = name_request(
        None, uuid.uuid4().hex.encode(), tenant=tenant, conversation=conversation_id
    )

    def run(held: HeldTurn, slot: Slot) -> Deleted:
        key = held.conversation  # the key its name leads to once the turn is held
        rows = gate.store.delete_conversation(key)
        slot.clear()  # what it cached of the conversation: the next turn reads the store
        gate.forget(tenant, conversation_id)
        if layers is not None:
            layers.conversation_deleted(key)
        return Deleted(conversation_id, rows)

    # a name unknown once the turn is held (another delete took it meanwhile): NotFound
    entering = asyncio.ensure_future(
        gate.enter(tenant, conversation_id, request, time.time(), then=run, create=False)
    )
    if waiting is not None:
        done, _ = await asyncio.wait({entering}, timeout=WAITING_NOTE_S)
        if not done:
            waiting()
    held = await entering
    assert isinstance(held, Ticket)  # a new request name is never replayed
    try:
        deleted: Deleted = held.value
        return deleted
    finally:
        await held.finish(None)


class DeletedOut(BaseModel):
    id: str = Field(description="The id it had; it is free again.")
    deleted: dict[str, int] = Field(description="Rows deleted, per table.")


@router.delete(
    "/{conversation_id}",
    response_model=DeletedOut,
    summary="Delete a conversation: its log, memory, notes, index, jobs, events and media",
)
async def delete(request: Request, tenant: Tenant, conversation_id: ConversationId) -> DeletedOut:
    svc: Service = request.app.state.service
    conv = await run_in_threadpool(_conversation, request, tenant, conversation_id)
    cid = conv.info().public_id
    kk = svc.kioku(tenant)

    def waiting() -> None:
        log.warning("deleting %r of tenant %r: waiting for its turn in flight", cid, tenant)

    done = await delete_conversation(svc.gate, tenant, cid, kk.layers, waiting)
    log.warning("deleted %r of tenant %r: %s rows", cid, tenant, done.total)
    return DeletedOut(id=done.conversation, deleted=done.rows)
