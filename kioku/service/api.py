"""The REST API an operator (and the console) uses: conversations, messages, memory, notes, cut,
tic alerts, the compaction log.

Every route takes the tenant from the API key; a conversation of another tenant answers 404,
exactly like one that does not exist. Reads never create anything.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from kioku import notes as notes_layer
from kioku.engine import Conversation, Kioku
from kioku.errors import BadParameter, NotFound, StoreError
from kioku.ids import is_valid_id, key_for
from kioku.memory import MemoryItem
from kioku.outcomes import stand_in
from kioku.revisions import versions
from kioku.service.auth import tenant_of
from kioku.service.limits import StrictJSONRoute
from kioku.structure import is_structured, merge_threads

if TYPE_CHECKING:
    from kioku.service.state import Service

MAX_SEQ = 2**62

ConversationId = Annotated[str, Path(min_length=1, max_length=200)]
Tenant = Annotated[str, Depends(tenant_of)]


class ConversationOut(BaseModel):
    id: str
    character: str
    messages: int
    raw_start: int
    memory_version: int
    last_activity: float | None = Field(None, description="When its last message was stored.")


class ConversationList(BaseModel):
    data: list[ConversationOut]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` for the next page; null on the last page."
    )


class PartOut(BaseModel):
    kind: str
    text: str
    speaker: str | None = None
    ref: str | None = Field(
        None, description="Media: its blob's sha256; tool call/result: call id."
    )
    name: str | None = Field(None, description="Tool call/result: the function.")


class MessageOut(BaseModel):
    seq: int
    role: str
    author: str
    at: str | None
    text: str
    parts: list[PartOut]
    deleted: bool
    edited: bool = Field(description="An earlier version exists (see …/versions).")


class MessagePage(BaseModel):
    data: list[MessageOut]
    next_after: int | None


class VersionOut(BaseModel):
    seq: int
    role: str
    author: str
    text: str
    change: str
    replaced_at: float


class VersionList(BaseModel):
    data: list[VersionOut]


class ItemOut(BaseModel):
    id: int
    kind: str
    first_seq: int
    last_seq: int
    text: str
    tokens: int
    source: str
    model: str
    prompt_version: str
    stale: bool
    stand_in: str | None = Field(
        None,
        description="Why an extractive stand-in holds this range in place of the model's "
        "summary (the model's replies failed, it could not be reached, or summaries were "
        "late); null when the model wrote it or no chronicler model is configured.",
    )
    data: dict[str, Any]


class MemoryOut(BaseModel):
    synopsis: ItemOut | None
    chapters: list[ItemOut]
    notes: str = Field(description="The notes as the prompt shows them (rendered at a fold).")
    notes_editable: str = Field(description="The notes in force, one editable line each.")
    threads: list[dict[str, Any]]
    key_lines: list[dict[str, Any]]
    raw_start: int
    memory_version: int
    ready: list[ItemOut] = Field(
        default_factory=list,
        description="Items written and waiting for their fold (a synopsis waits for the next "
        "chapter's, so the two share one cache break).",
    )


class NotesIn(BaseModel):
    text: str = Field(max_length=200_000)
    base: str | None = Field(
        None, max_length=200_000, description="The text the edit started from (default: now)."
    )


class NotesOut(BaseModel):
    added: int
    changed: int
    retracted: int
    notes_editable: str


class CutOut(BaseModel):
    raw_start: int
    memory_version: int
    reasons: list[str]


class TicOut(BaseModel):
    phrase: str
    count: int
    window: int
    kind: str = "phrase"


class TicsOut(BaseModel):
    alerts: list[TicOut]


class LogRow(BaseModel):
    id: int
    event: str
    outcome: str
    duration_s: float | None
    input_tokens: int | None
    output_tokens: int | None
    first_seq: int | None
    last_seq: int | None
    detail: str | None
    at: float


class LogOut(BaseModel):
    data: list[LogRow]


router = APIRouter(prefix="/v1/conversations", tags=["conversations"], route_class=StrictJSONRoute)


def _kioku(request: Request, tenant: str) -> Kioku:
    service: Service = request.app.state.service
    return service.kioku(tenant)


def _conversation(request: Request, tenant: str, conversation_id: str) -> Conversation:
    kk = _kioku(request, tenant)
    # ids are per tenant: another tenant's conversation of the same id is another row
    try:
        return Conversation(kk, kk.store.find_conversation(tenant, conversation_id).id)
    except NotFound:
        if is_valid_id(conversation_id):
            raise
    # a chat name kept under an encoded id (`kioku.ids.key_for`) is found by the name too
    return Conversation(kk, kk.store.find_conversation(tenant, key_for(conversation_id)).id)


def _item(i: MemoryItem) -> ItemOut:
    return ItemOut(
        id=i.id or 0,
        kind=i.kind,
        first_seq=i.first_seq,
        last_seq=i.last_seq,
        text=i.text,
        tokens=i.tokens,
        source=i.source,
        model=i.model,
        prompt_version=i.prompt_version,
        stale=i.stale,
        stand_in=stand_in(i.data),
        data=dict(i.data or {}),
    )


@router.get(
    "", response_model=ConversationList, summary="The tenant's conversations, latest activity first"
)
def list_conversations(
    request: Request,
    tenant: Tenant,
    q: Annotated[
        str | None, Query(max_length=200, description="Only ids or characters containing this.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Conversations per page.")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=400, description="`next_cursor` of the page before.")
    ] = None,
) -> ConversationList:
    kk = _kioku(request, tenant)
    page, after = kk.store.conversation_page(
        tenant, limit=limit, query=q, before=_cursor(cursor) if cursor else None
    )
    return ConversationList(
        data=[
            ConversationOut(
                id=c.id,
                character=c.character,
                messages=c.messages,
                raw_start=c.raw_start,
                memory_version=c.memory_version,
                last_activity=c.last_activity,
            )
            for c in page
        ],
        next_cursor=_encode_cursor(after) if after else None,
    )


def _encode_cursor(after: tuple[float, str]) -> str:
    raw = json.dumps([after[0], after[1]], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor(text: str) -> tuple[float, str]:
    try:
        at, key = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return float(at), str(key)
    except (ValueError, TypeError) as e:
        raise BadParameter("cursor is not a `next_cursor` kioku gave", "cursor") from e


@router.get("/{conversation_id}/messages", response_model=MessagePage, summary="The log, paged")
def messages(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    after: Annotated[int, Query(ge=-1, le=MAX_SEQ, description="Messages after this seq.")] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> MessagePage:
    conv = _conversation(request, tenant, conversation_id)
    page, more = conv.store.message_page(conv.id, after, limit)
    data = [
        MessageOut(
            seq=p.entry.seq,
            role=p.entry.role,
            author=p.entry.message.author,
            at=p.at,
            text=p.entry.text,
            parts=[PartOut(**part.to_json()) for part in p.entry.message.parts],
            deleted=p.deleted,
            edited=p.edited,
        )
        for p in page
    ]
    return MessagePage(data=data, next_after=page[-1].entry.seq if more else None)


@router.get(
    "/{conversation_id}/messages/{seq}/versions",
    response_model=VersionList,
    summary="Earlier contents of one message (edits, deletions, regenerations)",
)
def message_versions(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    seq: Annotated[int, Path(ge=0, le=MAX_SEQ)],
) -> VersionList:
    conv = _conversation(request, tenant, conversation_id)
    return VersionList(
        data=[
            VersionOut(
                seq=r["seq"],
                role=r["role"],
                author=r["author"],
                text=r["text"],
                change=r["change"],
                replaced_at=r["replaced_at"],
            )
            for r in versions(conv.store, conv.id, seq)
        ]
    )


@router.get("/{conversation_id}/memory", response_model=MemoryOut, summary="Memory with ranges")
def memory(request: Request, tenant: Tenant, conversation_id: ConversationId) -> MemoryOut:
    conv = _conversation(request, tenant, conversation_id)
    info = conv.info()
    both = conv.store.items(conv.id, "active", "ready")
    active = [i for i in both if i.status == "active"]
    synopsis = next((i for i in active if i.kind == "synopsis"), None)
    chapters = [i for i in active if i.kind == "chapter"]
    ordered = ([synopsis] if synopsis else []) + chapters
    key_lines = [
        {**line, "item_id": i.id}
        for i in ordered
        if is_structured(i.data)
        for line in (i.data.get("key_lines") or [])
        if isinstance(line, dict)
    ]
    return MemoryOut(
        synopsis=_item(synopsis) if synopsis else None,
        chapters=[_item(c) for c in chapters],
        notes=conv.store.notes_snapshot(conv.id),
        notes_editable=notes_layer.render_editable(notes_layer.notes(conv.store, conv.id)),
        threads=[t.__dict__ for t in merge_threads(ordered)],
        key_lines=key_lines,
        raw_start=info.raw_start,
        memory_version=info.memory_version,
        ready=[_item(i) for i in both if i.status == "ready"],
    )


@router.put("/{conversation_id}/notes", response_model=NotesOut, summary="Edit the notes")
def put_notes(
    request: Request, tenant: Tenant, conversation_id: ConversationId, body: NotesIn
) -> NotesOut:
    conv = _conversation(request, tenant, conversation_id)
    result = conv.edit_notes(body.text, base=body.base)
    return NotesOut(
        added=len(result.added),
        changed=len(result.changed),
        retracted=len(result.retracted),
        notes_editable=notes_layer.render_editable(notes_layer.notes(conv.store, conv.id)),
    )


@router.post(
    "/{conversation_id}/cut", response_model=CutOut, summary="区切り: fold all, start anew"
)
def cut(request: Request, tenant: Tenant, conversation_id: ConversationId) -> CutOut:
    conv = _conversation(request, tenant, conversation_id)
    try:
        report = conv.cut()
    except StoreError as e:
        raise StoreError(f"{e}; a turn folded meanwhile: press cut again") from e
    info = conv.info()
    return CutOut(
        raw_start=info.raw_start, memory_version=info.memory_version, reasons=list(report.reasons)
    )


@router.get("/{conversation_id}/tics", response_model=TicsOut, summary="Verbal-tic alerts")
def tics(request: Request, tenant: Tenant, conversation_id: ConversationId) -> TicsOut:
    conv = _conversation(request, tenant, conversation_id)
    kk = conv.kioku
    alerts = kk.layers.tic_alerts(conv.id)
    return TicsOut(
        alerts=[
            TicOut(phrase=a.phrase, count=a.count, window=a.window, kind=a.kind) for a in alerts
        ]
    )


@router.get("/{conversation_id}/log", response_model=LogOut, summary="The compaction log")
def compaction_log(request: Request, tenant: Tenant, conversation_id: ConversationId) -> LogOut:
    conv = _conversation(request, tenant, conversation_id)
    return LogOut(
        data=[
            LogRow(**{k: r[k] for k in LogRow.model_fields})
            for r in conv.store.log_entries(conv.id)
        ]
    )


# the chat-completions protocol (issue 13) --------------------------------------------------------


class ChoiceOut(BaseModel):
    choice: int
    role: str
    author: str
    text: str
    parts: list[PartOut]


class ChoiceList(BaseModel):
    data: list[ChoiceOut]


@router.get(
    "/{conversation_id}/messages/{seq}/choices",
    response_model=ChoiceList,
    summary="The other choices of a reply asked for with n > 1 (choice 0 is the stored reply)",
)
def reply_choices(
    request: Request,
    tenant: Tenant,
    conversation_id: ConversationId,
    seq: Annotated[int, Path(ge=0, le=MAX_SEQ)],
) -> ChoiceList:
    conv = _conversation(request, tenant, conversation_id)
    return ChoiceList(
        data=[
            ChoiceOut(
                choice=n,
                role=m.role,
                author=m.author,
                text=m.text,
                parts=[PartOut(**p.to_json()) for p in m.parts],
            )
            for n, m in enumerate(conv.store.choices(conv.id, seq), start=1)
        ]
    )
