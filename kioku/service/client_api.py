"""The REST routes a front end with a chat of its own calls beside the proxy (the SillyTavern
extension does): rename a conversation, sync it with the client's whole chat, summarize now,
re-summarize a chapter, and read seqs as the client numbers its messages.

- **rename**: SillyTavern renames a chat file; the extension tells kioku, and the
  conversation goes on under the new name with all it has (`kioku.store.chats`).
- **sync**: a stateless client resends only what fits its own context. An edit or a delete
  further back never reached kioku (issue 22: with SillyTavern's context at 1,500 tokens, the
  model kept reading a message the user had corrected). The extension sends the whole chat
  when the user edits or deletes a message, and kioku brings its log in line exactly as a
  turn's sync does (`kioku.sync`: versions kept, memory over a change marked stale and
  re-summarized), without calling the model. It waits for the conversation's turn like a turn.
- **summarize**: the summaries due soon written now (queued jobs lose their delay; with none
  queued, a chapter of the raw window beyond the profile's minimum is scheduled). A chapter
  enters the prompt when the chat needs the room, as always; Cut folds at once.
- **resummarize**: one chapter written again from its messages; until it is, the prompt shows
  the messages (`kioku.revisions`).
- **delete a message** (`DELETE …/messages/{seq}`, operator scope): what the user takes back
  is gone from what every model reads (`kioku.takeback`); the log keeps it as a version.
- **positions**: a message's number among the messages the client shows. kioku keeps a deleted
  message's seq (seqs never move), SillyTavern renumbers: after a delete, seq 40 may be message
  38 there.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from kioku.chronicle_prompt import chapter_ranges
from kioku.engine import Conversation
from kioku.errors import InputError, NotFound
from kioku.ids import key_for
from kioku.messages import MEDIA_KINDS, render_parts
from kioku.normal_form import normal_form
from kioku.service.api import MAX_SEQ, ConversationId, _conversation
from kioku.service.auth import tenant_of
from kioku.service.chat_request import ChatMessageIn, split_messages
from kioku.service.limits import StrictJSONRoute
from kioku.service.turns import Replay, Ticket, name_request
from kioku.store.turns import HeldTurn
from kioku.sync import SyncPlan, apply, diff, forget, log_tail

if TYPE_CHECKING:
    from kioku.service.slot import Slot
    from kioku.service.state import Service

Tenant = Annotated[str, Depends(tenant_of)]
# a rename waits this long for a turn in flight, then 409 turn_in_progress: a client that gives
# up sooner (the SillyTavern extension: after 20 s) would not know that the rename happened
RENAME_WAIT_S = 10.0

router = APIRouter(prefix="/v1/conversations", tags=["clients"], route_class=StrictJSONRoute)


class RenameIn(BaseModel):
    id: str = Field(min_length=1, max_length=1000, description="The conversation's new name.")


class RenameOut(BaseModel):
    id: str = Field(description="The id it is kept under now (`kioku.ids`).")
    previous: str


class SyncIn(BaseModel):
    messages: list[ChatMessageIn] = Field(
        min_length=1, description="The client's whole chat, oldest first, as it shows it."
    )


class SyncOut(BaseModel):
    edited: list[int]
    deleted: list[int]
    appended: list[int]
    stale: list[int] = Field(description="Memory items the changes made stale.")


class SummarizeOut(BaseModel):
    hurried: int = Field(description="Queued summary jobs that now run without their delay.")
    scheduled: list[list[int]] = Field(description="Chapter ranges scheduled now.")


class ForgetOut(BaseModel):
    seq: int
    deleted: bool = Field(description="False: it was deleted already (nothing changed).")
    stale: list[int] = Field(description="Memory items over it, now written again.")
    retracted: list[int] = Field(
        description="Notes ledger entries that retract the notes it was the source of."
    )


class PositionsOut(BaseModel):
    positions: dict[int, int] = Field(description="seq → its number among shown messages.")


def _service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


@router.post("/{conversation_id}/rename", response_model=RenameOut, summary="Rename")
async def rename(
    request: Request, tenant: Tenant, conversation_id: ConversationId, body: RenameIn
) -> RenameOut:
    """The conversation's key stays; the name moves, in one transaction, holding the
    conversation's turn: a turn in flight ends first, under the name it started with, and
    from the commit on the old name is unknown (a turn under it starts a new conversation)."""
    svc = _service(request)
    conv = await run_in_threadpool(_conversation, request, tenant, conversation_id)
    old = conv.info().public_id
    new = key_for(body.id.strip())
    raw = await request.body()
    named = name_request(None, raw, tenant=tenant, conversation=old, shape="rename")

    def run(held: HeldTurn, _: Slot) -> RenameOut:
        with svc.store.atomic():
            svc.store.rename_conversation(tenant, old, new)
            svc.store.log(held.conversation, "rename", "ok", detail=f"{old!r} → {new!r}")
        return RenameOut(id=new, previous=old)

    held = await svc.gate.enter(
        tenant, old, named, time.time(), then=run, create=False, wait_s=RENAME_WAIT_S
    )
    if isinstance(held, Replay):  # pragma: no cover - a rename stores no reply to replay
        raise NotFound(f"no conversation {old!r}; `kioku memory` lists them")
    try:
        svc.gate.forget(tenant, old)
        out: RenameOut = held.value
        return out
    finally:
        await held.finish(None)


@router.post(
    "/{conversation_id}/sync",
    response_model=SyncOut,
    summary="Bring the log in line with the client's whole chat (edits and deletes anywhere)",
)
async def sync_chat(
    request: Request, tenant: Tenant, conversation_id: ConversationId, body: SyncIn
) -> SyncOut:
    svc = _service(request)
    found = await run_in_threadpool(_conversation, request, tenant, conversation_id)
    cid = found.info().public_id
    split = split_messages(body.messages)
    raw = await request.body()
    named = name_request(None, raw, tenant=tenant, conversation=cid, shape="sync")

    def run(held: HeldTurn, slot: Slot) -> SyncOut:
        conv = Conversation(found.kioku, held.conversation)  # the key the name leads to now
        plan = diff(log_tail(conv, 2 * len(split.chat) + 16), split.chat, named=True)
        if plan.regenerate is not None:  # the whole chat: a reply it no longer shows is gone
            plan = SyncPlan(
                edits=plan.edits,
                deletes=(*plan.deletes, plan.regenerate),
                appends=plan.appends,
                turn=plan.turn,
            )
        plan = _media_kept(conv, plan)
        if not plan.changes and not plan.appends:
            return SyncOut(edited=[], deleted=[], appended=[], stale=[])
        synced = apply(conv, plan, user=slot.user or "")
        slot.forget_log()
        return SyncOut(
            edited=[e.seq for e in plan.edits],
            deleted=list(plan.deletes),
            appended=list(synced.appended),
            stale=list(synced.stale),
        )

    held = await svc.gate.enter(tenant, cid, named, time.time(), then=run, create=False)
    if isinstance(held, Replay):  # the same sync already ran while this one waited
        return SyncOut(edited=[], deleted=[], appended=[], stale=[])
    assert isinstance(held, Ticket)
    try:
        out: SyncOut = held.value
        return out
    finally:
        await held.finish(None)


def _media_kept(conv: Conversation, plan: SyncPlan) -> SyncPlan:
    """The plan without the "edits" that only leave out a message's images: the extension
    sends each message's text, kioku keeps what the requests carried (an image part too)."""
    if not plan.edits:
        return plan
    stored = {e.seq: e for e in conv.store.entries_at(conv.id, [e.seq for e in plan.edits])}
    kept = []
    for edit in plan.edits:
        old = stored.get(edit.seq)
        parts = old.message.parts if old is not None else ()
        if old is not None and any(p.kind in MEDIA_KINDS for p in parts):
            words = render_parts(
                [p for p in parts if p.kind not in MEDIA_KINDS], old.message.author
            )
            if normal_form(words) == normal_form(edit.message.text):
                continue
        kept.append(edit)
    return dataclasses.replace(plan, edits=tuple(kept))


@router.post("/{conversation_id}/summarize", response_model=SummarizeOut, summary="Summarize now")
def summarize(request: Request, tenant: Tenant, conversation_id: ConversationId) -> SummarizeOut:
    conv = _conversation(request, tenant, conversation_id)
    now = conv.kioku.clock()
    store = conv.store
    hurried = store.hurry_jobs(conv.id, now)
    pending = store.jobs(conv.id, "queued", "running")
    if any(j.kind in ("chapter", "rolling") for j in pending):
        return SummarizeOut(hurried=hurried, scheduled=[])
    ranges = _unsummarized(conv)
    for lo, hi in ranges:
        store.enqueue_job(conv.id, "chapter", lo, hi, now)
    if ranges:
        store.log(conv.id, "summarize", "scheduled", detail=f"asked for: {ranges}")
    return SummarizeOut(hurried=hurried, scheduled=[list(r) for r in ranges])


def _unsummarized(conv: Conversation) -> list[tuple[int, int]]:
    """Chapter-sized ranges of the raw window beyond the profile's minimum raw history (and
    beyond the chapters already written for it)."""
    info = conv.info()
    profile = conv.profile
    start = info.raw_start
    ready = sorted(
        (i for i in conv.store.items(conv.id, "ready") if i.kind == "chapter"),
        key=lambda i: i.first_seq,
    )
    for r in ready:
        if r.first_seq == start:
            start = r.last_seq + 1
    entries = [e for e in conv.store.entries(conv.id, start) if not e.message.is_empty()]
    kept = 0
    cut = len(entries)
    while cut > 0 and kept < profile.min_raw:
        cut -= 1
        kept += entries[cut].tokens
    backlog = entries[:cut]
    # the same cut as a fold's: a chapter's prompt must fit the model's context too, which a
    # small local model's does not at summary_chunk alone
    groups = chapter_ranges(backlog, profile, conv.kioku.counter, conv.lang)
    return [(g[0].seq, g[-1].seq) for g in groups]


@router.post(
    "/{conversation_id}/memory/{item_id}/resummarize",
    response_model=SyncOut,
    summary="Write a chapter again from its messages",
)
def resummarize(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    item_id: Annotated[int, Path(ge=1, le=MAX_SEQ)],
) -> SyncOut:
    conv = _conversation(request, tenant, conversation_id)
    item = next((i for i in conv.store.items(conv.id, "active") if i.id == item_id), None)
    if item is None:
        raise NotFound(f"memory item {item_id} is not in memory now (a fold replaced it?)")
    if item.kind != "chapter":
        raise InputError(
            "only a chapter is written again from its messages; a synopsis is rewritten at "
            "the next major GC"
        )
    stale = conv.store.resummarize(conv.id, item.first_seq, conv.kioku.clock())
    conv.forget_raw_window()
    conv.store.log(conv.id, "resummarize", "queued", first_seq=item.first_seq,
                   last_seq=item.last_seq, detail=f"item {item_id}")  # fmt: skip
    return SyncOut(edited=[], deleted=[], appended=[], stale=list(stale))


@router.get(
    "/{conversation_id}/positions",
    response_model=PositionsOut,
    summary="Seqs as the client numbers its messages (deleted ones not counted)",
)
def positions(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    seq: Annotated[list[int], Query(max_length=1000)],
) -> PositionsOut:
    conv = _conversation(request, tenant, conversation_id)
    if any(q < 0 or q > MAX_SEQ for q in seq):
        raise InputError("a seq is a number from 0")
    return PositionsOut(positions=conv.store.positions(conv.id, seq))


@router.delete(
    "/{conversation_id}/messages/{seq}",
    response_model=ForgetOut,
    summary="Delete one message: every note, recollection and chapter line it was the source "
    "of goes with it (the log keeps it as a version)",
)
async def forget_message(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    seq: Annotated[int, Path(ge=0, le=MAX_SEQ)],
) -> ForgetOut:
    svc = _service(request)
    found = await run_in_threadpool(_conversation, request, tenant, conversation_id)
    cid = found.info().public_id
    named = name_request(None, b"", tenant=tenant, conversation=cid, shape=f"forget\0{seq}")

    def run(
        held: HeldTurn, slot: Slot
    ) -> ForgetOut:  # the conversation's turn: never beside a reply
        conv = Conversation(found.kioku, held.conversation)  # the key the name leads to now
        done = forget(conv, seq)
        slot.forget_log()
        return ForgetOut(
            seq=seq, deleted=done.deleted, stale=list(done.stale), retracted=list(done.retracted)
        )

    held = await svc.gate.enter(tenant, cid, named, time.time(), then=run, create=False)
    if isinstance(held, Replay):  # the same delete already ran while this one waited
        return ForgetOut(seq=seq, deleted=False, stale=[], retracted=[])
    assert isinstance(held, Ticket)
    try:
        out: ForgetOut = held.value
        return out
    finally:
        await held.finish(None)
