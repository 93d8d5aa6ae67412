"""`GET /v1/conversations/{id}/status`: what a front end shows beside the chat.

The SillyTavern extension (and the console) poll it while a chat is open: how much is stored,
where the raw window starts, whether a summary is being written (folding in progress), and the
cache breaks the client caused by changing the card, the profile and window in use, and where the
raw window starts as the client numbers its messages. A few small reads, so polling is cheap.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from kioku.service.api import ConversationId, _conversation
from kioku.service.auth import tenant_of
from kioku.service.cards import CARD_CHANGES

Tenant = Annotated[str, Depends(tenant_of)]

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])


class Folding(BaseModel):
    queued: int = Field(description="Summary jobs waiting (they run after the profile's delay).")
    running: int = Field(description="Summary jobs a worker is writing now.")
    kinds: list[str] = Field(description="chapter, synopsis, revision, … of those jobs.")


class StatusOut(BaseModel):
    id: str
    character: str
    messages: int
    raw_start: int
    memory_version: int
    folding: Folding
    card_changes: int = Field(description="Times the client changed the card: cache breaks.")
    counters: dict[str, int]
    profile: str = Field("", description="The model profile the conversation runs on.")
    window: int = Field(0, description="The profile's context window, in tokens.")
    shown: int = Field(0, description="Messages a client shows (deleted ones not counted).")
    raw_start_position: int = Field(
        0, description="Where the raw window starts, as the client numbers its messages."
    )


@router.get(
    "/{conversation_id}/status",
    response_model=StatusOut,
    summary="Sizes, folding in progress, client-caused cache breaks",
)
def status(request: Request, tenant: Tenant, conversation_id: ConversationId) -> StatusOut:
    conv = _conversation(request, tenant, conversation_id)
    info = conv.info()
    jobs = conv.store.jobs(conv.id, "queued", "running")
    counters = conv.store.counters(conv.id)
    shown = conv.store.positions(conv.id, [info.raw_start, info.next_seq])
    return StatusOut(
        id=info.id,
        character=info.character,
        messages=info.next_seq,
        raw_start=info.raw_start,
        memory_version=info.memory_version,
        folding=Folding(
            queued=sum(1 for j in jobs if j.status == "queued"),
            running=sum(1 for j in jobs if j.status == "running"),
            kinds=sorted({j.kind for j in jobs}),
        ),
        card_changes=counters.get(CARD_CHANGES, 0),
        counters=counters,
        profile=conv.profile.name,
        window=conv.profile.window,
        shown=shown[info.next_seq],
        raw_start_position=shown[info.raw_start],
    )
