"""One turn's storage side: the request's messages synced with the log (or, for a branch's
first turn, the branch started from its parent), the prompt built, the reply recorded.

`kioku.service.proxy` runs the turn around it (the turn lock, the upstream, the response). A side
request (quiet, impersonate, a Test Message) gets a `Turn` too, one that stores nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kioku import chat_messages
from kioku.branches import start_branch
from kioku.context import Prompt
from kioku.engine import Conversation, Kioku
from kioku.errors import UpstreamError
from kioku.messages import LogEntry
from kioku.models import Completion
from kioku.service import generation as gen
from kioku.service.card_parts import pinned
from kioku.service.cards import note_card, stored_card
from kioku.service.chat_request import Split
from kioku.service.speakers import labelled
from kioku.service.turns import REQUEST_META
from kioku.sync import Synced, SyncPlan, replace_reply, sync

if TYPE_CHECKING:
    from kioku.service.slot import Slot
    from kioku.service.state import Service


@dataclass
class Turn:
    tenant: str
    conv: Conversation
    synced: Synced
    prompt: Prompt
    started: float
    character: str = ""
    media: Mapping[str, Any] = field(default_factory=dict)  # blob hash -> content part
    side: bool = False  # a side request (quiet, impersonate, Test Message): nothing is stored
    extend: int | None = None  # a continue: the stored reply the new text extends
    conversation_id: str = ""  # as the client named it (the store's key may differ)
    group: bool = False  # a group chat: a reply is stored with its speaker's label

    @property
    def entry(self) -> LogEntry:
        return self.synced.entry

    @property
    def regenerate(self) -> int | None:
        return self.synced.plan.regenerate


@dataclass(frozen=True)
class Request:
    """What the request's headers say about the turn, besides the conversation."""

    stateful: bool | None = None
    character: str = ""
    generation: gen.Generation | None = None
    user: str | None = None
    examples: str = ""  # X-Kioku-Examples
    speakers: tuple[str, ...] = ()  # X-Kioku-Speakers: a group chat's characters
    parent: str | None = None  # X-Kioku-Parent: the conversation this one branched from


def start_turn(
    svc: Service,
    slot: Slot,
    tenant: str,
    conversation_id: str,
    key: str,
    split: Split,
    req: Request,
    started: float,
    *,
    fresh: bool = False,
) -> Turn:
    """Store what is new and build the prompt (runs in a thread, holding the turn lock of the
    store's `key`, which the name `conversation_id` leads to or a new conversation gets).
    `fresh`: another process ran the last turn, so what this one cached may be stale. A new
    conversation is created with its first messages (a branch with its parent's too) in one
    transaction: a request refused for its content leaves nothing."""
    kk = svc.kioku(tenant)
    if fresh:  # what this process read of the conversation may have changed since
        slot.forget_client()
    known = slot.conv is not None and not fresh
    stored = slot.system if known else stored_card(kk.store, key, tenant)
    if known or stored is not None:
        return _turn(svc, slot, tenant, conversation_id, key, split, req, started, stored, known)
    try:
        with kk.store.atomic():
            return _turn(svc, slot, tenant, conversation_id, key, split, req, started, None, False)
    except BaseException:
        slot.clear()  # what it cached of a conversation that was never stored
        raise


def _turn(
    svc: Service,
    slot: Slot,
    tenant: str,
    conversation_id: str,
    key: str,
    split: Split,
    req: Request,
    started: float,
    stored: str | None,
    known: bool,
) -> Turn:
    kk = svc.kioku(tenant)
    generation = req.generation
    card = split.system
    if req.examples == "gradual":  # the client trims its examples: keep those the card had
        card = pinned(stored, split.card)
    if not known or (card is not None and card != slot.system):
        if stored is None and req.parent:
            branch_from(kk, tenant, req.parent, conversation_id, key, split, card, req.character)
        opened = kk.conversation(
            conversation_id, system_prompt=card, character=req.character, key=key
        )
        note_card(kk.store, opened.id, stored, card)
        slot.open(opened, card)
    conv = slot.conv
    assert conv is not None
    transcripts = gen.sends_transcripts(conv, slot)
    if gen.is_side(generation, split, req.stateful, transcripts):
        gen.refuse_a_switch(slot, split)
        return side_turn(tenant, conv, split, slot.character, started, conversation_id)
    synced = sync(
        conv,
        split.chat,
        stateful=req.stateful,
        character=slot.character,
        blobs=split.blobs,
        user=gen.user_name(conv, slot, req.user),
        named=generation is not None,
        cast=req.speakers,
    )
    slot.note_lone(None)
    if req.stateful is False or (req.stateful is None and len(split.chat) > 1):
        gen.note_transcript(conv, slot)
    extend = None
    continuing = generation == gen.Generation.CONTINUE and synced.entry.role == "assistant"
    if continuing:
        extend = synced.entry.seq
    parts = dataclasses.replace(split.parts, continuing=continuing)
    prompt = conv.prepare_for(synced.entry, parts)
    media = chat_messages.media_of(conv.store.blobs(chat_messages.refs_of(prompt.messages)))
    return Turn(
        tenant,
        conv,
        synced,
        prompt,
        started,
        req.character or slot.character,
        media,
        extend=extend,
        conversation_id=conversation_id,
        group=bool(req.speakers),
    )


def start_side(
    svc: Service, tenant: str, conversation_id: str, split: Split, character: str, started: float
) -> Turn:
    """A side request: the conversation's memory when it exists, nothing created or stored."""
    key = svc.conversation_key(tenant, conversation_id) if conversation_id else None
    conv = Conversation(svc.kioku(tenant), key or "")  # "": none, its memory is empty
    return side_turn(tenant, conv, split, character, started, conversation_id)


def side_turn(
    tenant: str,
    conv: Conversation,
    split: Split,
    character: str,
    started: float,
    conversation_id: str = "",
) -> Turn:
    """A side request's turn: its images come from the request itself (nothing of it is
    stored) or, for the raw window's, from the store."""
    prompt, entry = gen.side_prompt(conv, split, character)
    refs = chat_messages.refs_of(prompt.messages)
    blobs = {**conv.store.blobs(refs - split.blobs.keys()), **split.blobs}
    media = chat_messages.media_of({r: blobs[r] for r in refs if r in blobs})
    return Turn(
        tenant,
        conv,
        Synced(entry, SyncPlan()),
        prompt,
        started,
        character,
        media,
        side=True,
        conversation_id=conversation_id,
    )


def finish_turn(
    turn: Turn, completion: Completion, others: Sequence[Completion] = (), request: str = ""
) -> LogEntry | None:
    """Record the reply (a regeneration replaces the old one) with the name of the request it
    answers and, with n > 1, the other choices beside it; a reply with neither text nor tool
    calls is not stored."""
    conv = turn.conv
    if turn.side:
        return None
    if not completion.text.strip() and not completion.tool_calls:
        conv.store.log(conv.id, "reply", "not_stored", detail="no text and no tool calls")
        return None
    meta = {REQUEST_META: request} if request else None
    if turn.group and turn.extend is None:
        completion = dataclasses.replace(completion, text=labelled(completion.text, turn.character))
    if turn.extend is not None:
        entry = gen.continued(conv, turn.extend, completion)
    elif turn.regenerate is not None:
        entry = replace_reply(conv, turn.regenerate, completion, turn.character, meta)
    else:
        entry = conv.record(completion, author=turn.character, meta=meta)
    if others or turn.regenerate is not None:
        alternatives = [chat_messages.reply_message(c, turn.character) for c in others]
        conv.store.set_choices(conv.id, entry.seq, alternatives)
    conv.store.incr(conv.id, "turns")
    return entry


def store_reply(
    turn: Turn,
    completion: Completion,
    others: Sequence[Completion],
    request: str,
    end: Callable[[int | None], None],
) -> LogEntry | None:
    """The reply, its counters and the turn's end (`end(reply seq)`, which names the request
    that got the reply in the turn lock) as one transaction; PostgreSQL's lock is let go once
    it has committed."""
    with turn.conv.store.atomic():
        reply = finish_turn(turn, completion, others, request)
        end(reply.seq if reply is not None else None)
    return reply


def note_failure(turn: Turn, error: UpstreamError) -> None:
    """The upstream failed this turn: logged on the conversation and counted."""
    conv = turn.conv
    if turn.side:
        return  # nothing of a side request is stored, not even its failure
    conv.store.log(
        conv.id,
        "upstream",
        error.kind,
        first_seq=turn.entry.seq,
        last_seq=turn.entry.seq,
        detail=error.message[:500],
    )
    conv.store.incr(conv.id, "upstream_errors")


def note_interrupted(turn: Turn, relayed: int) -> None:
    """The stream ended before a reply (the client hung up, or the upstream broke): the user
    message stays stored, and the log says how far the relay got."""
    conv = turn.conv
    conv.store.log(
        conv.id,
        "stream",
        "interrupted",
        first_seq=turn.entry.seq,
        last_seq=turn.entry.seq,
        detail=f"{relayed} chars relayed",
    )


def branch_from(
    kk: Kioku,
    tenant: str,
    parent: str,
    name: str,
    key: str,
    split: Split,
    card: str | None,
    character: str,
) -> None:
    """A new conversation that the client says branched from `parent` (SillyTavern's branch or
    checkpoint): created under `key`, and started with the parent's messages and memory up to
    where the two part (`kioku.branches`), all in one transaction (the caller's, which stores
    the request's messages too): a branch exists whole or not at all. A parent kioku does not
    know, or one the branch shares nothing with, leaves a conversation like any other."""
    parent_key = kk.store.conversation_key(tenant, parent)
    if parent_key is None or parent_key == key:
        return
    with kk.store.atomic():
        child = kk.conversation(name, system_prompt=card, character=character, key=key)
        if child.info().next_seq:
            return
        if start_branch(kk.store, parent_key, child.id, split.chat) is not None:
            child.refresh_notes()
