"""The REST routes an operator's console needs beside the API in `api`: archive search, the
whole transcript with times, correcting or retracting a line of memory, the pending summary
jobs.

Like every route, each takes the tenant from the API key, answers 404 for another tenant's
conversation, and reads without creating anything. A correction is stored append-only and
reaches the prompt at the next fold (`kioku.corrections`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from kioku import corrections
from kioku.context import RECALL_KEY
from kioku.engine import Conversation, Kioku
from kioku.messages import LogEntry
from kioku.no_layers import NoLayers
from kioku.service.auth import tenant_of
from kioku.service.limits import StrictJSONRoute

MAX_SEQ = 2**62

ConversationId = Annotated[str, Path(min_length=1, max_length=200)]
Tenant = Annotated[str, Depends(tenant_of)]

router = APIRouter(prefix="/v1/conversations", tags=["console"], route_class=StrictJSONRoute)


class Hit(BaseModel):
    seq: int
    score: float
    role: str
    author: str
    at: str | None = Field(description="The message's own time, when the client sent one.")
    stored_at: float | None = Field(description="When kioku stored it (Unix seconds).")
    text: str


class SearchOut(BaseModel):
    query: str
    hits: list[Hit]


class RecallNote(BaseModel):
    """The turn's account of recall (`kioku.recall.need`): whether this message was shown the past,
    why, and what it got."""

    on: bool
    why: str
    cue: str | None = Field(None, description="What in the message points at the past.")
    standout: float | None = Field(
        None, description="The best hit's score ÷ the background of the search."
    )
    got: list[list[int]] = Field(default_factory=list, description="Seq ranges shown.")
    tokens: int = 0


class TranscriptLine(BaseModel):
    seq: int
    role: str
    author: str
    at: str | None
    stored_at: float | None
    text: str
    parts: list[dict[str, Any]]
    deleted: bool
    recall: RecallNote | None = Field(None, description="A user turn's account of recall.")


class TranscriptOut(BaseModel):
    data: list[TranscriptLine]
    first: int | None = Field(description="Seq of the first message on this page.")
    last: int | None = Field(description="Seq of the last message on this page.")
    total: int = Field(description="Messages in the conversation.")


class JobOut(BaseModel):
    id: int
    kind: str
    first_seq: int
    last_seq: int
    status: str
    attempts: int
    run_after: float


class JobsOut(BaseModel):
    data: list[JobOut]


class EditOut(BaseModel):
    line: str
    text: str | None = Field(description="The corrected line; null: retracted.")
    at: float


class PendingOut(BaseModel):
    id: int
    lines: list[str]
    edits: list[EditOut]


class ItemLines(BaseModel):
    id: int
    kind: str
    first_seq: int
    last_seq: int
    lines: list[str] = Field(description="The item's lines as the prompt shows them now.")
    edits: list[EditOut] = Field(description="Operator edits already in the prompt.")
    pending: PendingOut | None = Field(description="An operator edit waiting for the next fold.")


class LinesOut(BaseModel):
    items: list[ItemLines]


class LineEdit(BaseModel):
    line: str = Field(min_length=1, max_length=20_000, description="The line as shown now.")
    text: str | None = Field(
        None, max_length=corrections.MAX_LINE_CHARS, description="New text; null retracts it."
    )


def _conversation(request: Request, tenant: str, conversation_id: str) -> Conversation:
    kk: Kioku = request.app.state.service.kioku(tenant)
    # ids are per tenant: another tenant's conversation of the same id is another row (404)
    return Conversation(kk, kk.store.find_conversation(tenant, conversation_id).id)


def _line(e: LogEntry, stored: dict[int, float]) -> TranscriptLine:
    m = e.message
    note = (e.meta or {}).get(RECALL_KEY)
    return TranscriptLine(
        seq=e.seq,
        role=m.role,
        author=m.author,
        at=m.at.isoformat() if m.at else None,
        stored_at=stored.get(e.seq),
        text=m.text,
        parts=[p.to_json() for p in m.parts],
        deleted=m.is_empty(),
        recall=RecallNote(**note) if isinstance(note, dict) else None,
    )


@router.get("/{conversation_id}/search", response_model=SearchOut, summary="Search the archive")
def search(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    q: Annotated[str, Query(min_length=1, max_length=2000, description="What to look for.")],
    k: Annotated[int, Query(ge=1, le=100)] = 10,
) -> SearchOut:
    conv = _conversation(request, tenant, conversation_id)
    kk = conv.kioku
    if isinstance(kk.layers, NoLayers):  # the layers are off: no archive index to search
        return SearchOut(query=q, hits=[])
    hits = kk.layers.search(conv.id, q, k)
    found = {e.seq: e for e in conv.store.entries_at(conv.id, [h.seq for h in hits])}
    stored: dict[int, float] = {}
    if found:
        stored = conv.store.stored_at(conv.id, min(found), max(found))
    lines = [_line(found[h.seq], stored) for h in hits if h.seq in found]
    scores = {h.seq: round(h.score, 3) for h in hits}
    return SearchOut(
        query=q,
        hits=[
            Hit(
                seq=x.seq,
                score=scores[x.seq],
                role=x.role,
                author=x.author,
                at=x.at,
                stored_at=x.stored_at,
                text=x.text,
            )
            for x in lines
        ],
    )


@router.get(
    "/{conversation_id}/transcript",
    response_model=TranscriptOut,
    summary="The whole transcript with times, a page at a time, forwards or backwards",
)
def transcript(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    after: Annotated[
        int | None, Query(ge=-1, le=MAX_SEQ, description="Messages after this seq.")
    ] = None,
    before: Annotated[
        int | None,
        Query(ge=0, le=MAX_SEQ, description="Messages before this seq (default: the newest)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> TranscriptOut:
    conv = _conversation(request, tenant, conversation_id)
    total = conv.info().next_seq
    if after is not None:
        first = after + 1
    else:
        end = total if before is None else min(before, total)
        first = max(0, end - limit)
    last = min(total - 1, first + limit - 1)
    if before is not None and after is None:
        last = min(last, before - 1)
    entries = conv.store.entries(conv.id, first, last) if last >= first else []
    stored = conv.store.stored_at(conv.id, first, last) if entries else {}
    return TranscriptOut(
        data=[_line(e, stored) for e in entries],
        first=entries[0].seq if entries else None,
        last=entries[-1].seq if entries else None,
        total=total,
    )


@router.get("/{conversation_id}/jobs", response_model=JobsOut, summary="Summary jobs not yet done")
def jobs(request: Request, tenant: Tenant, conversation_id: ConversationId) -> JobsOut:
    conv = _conversation(request, tenant, conversation_id)
    return JobsOut(
        data=[
            JobOut(
                id=j.id,
                kind=j.kind,
                first_seq=j.first_seq,
                last_seq=j.last_seq,
                status=j.status,
                attempts=j.attempts,
                run_after=j.run_after,
            )
            for j in conv.store.jobs(conv.id, "queued", "running")
        ]
    )


def _edits(item: Any) -> list[EditOut]:
    return [EditOut(**e) for e in corrections.edits_of(item)]


@router.get(
    "/{conversation_id}/memory/lines",
    response_model=LinesOut,
    summary="Memory line by line, with the operator's edits and those waiting for the fold",
)
def memory_lines(request: Request, tenant: Tenant, conversation_id: ConversationId) -> LinesOut:
    conv = _conversation(request, tenant, conversation_id)
    lang = conv.lang
    waiting = corrections.pending(conv.store, conv.id)
    items = []
    for i in conv.store.items(conv.id, "active"):
        assert i.id is not None
        p = waiting.get(i.id)
        items.append(
            ItemLines(
                id=i.id,
                kind=i.kind,
                first_seq=i.first_seq,
                last_seq=i.last_seq,
                lines=corrections.item_lines(i, lang),
                edits=_edits(i),
                pending=PendingOut(
                    id=p.id or 0, lines=corrections.item_lines(p, lang), edits=_edits(p)
                )
                if p is not None
                else None,
            )
        )
    return LinesOut(items=items)


@router.post(
    "/{conversation_id}/memory/{item_id}/lines",
    response_model=PendingOut,
    summary="Correct or retract one line of a memory item (applies at the next fold)",
)
def correct_line(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    item_id: Annotated[int, Path(ge=1, le=MAX_SEQ)],
    body: LineEdit,
) -> PendingOut:
    conv = _conversation(request, tenant, conversation_id)
    kk = conv.kioku
    revised = corrections.correct(
        conv.store,
        conv.id,
        item_id,
        body.line,
        body.text,
        counter=kk.counter,
        now=kk.clock(),
        lang=conv.lang,
    )
    return PendingOut(
        id=revised.id or 0,
        lines=corrections.item_lines(revised, conv.lang),
        edits=_edits(revised),
    )
