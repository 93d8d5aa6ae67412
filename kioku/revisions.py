"""Edits under memory: message versions, stale items, their stand-ins, and the re-summary.

A stateless client (SillyTavern) can edit, delete or regenerate any message it shows. The log
stays append-only in its seqs: the old content goes to `message_versions` and the `messages` row
keeps its seq with the new content (a deleted message: no parts, `superseded` = 1, skipped by
the raw window and by every summary). The coverage invariant (every seq before the raw window is
covered by active memory exactly once) is untouched, because ranges never move:

- a memory item whose range holds a changed message is marked `stale` and a `revision` job is
  queued; the worker re-summarizes that range (a chapter from the corrected log, a synopsis from
  its stale text plus the corrections) and the revision replaces the stale item at the next fold
  (`policy._swap_revisions`), one cache break as for any fold;
- until then the prompt shows a stand-in: a stale chapter becomes the corrected messages of its
  range when they fit a small budget, otherwise (and for a synopsis) its text followed by the
  corrected messages;
- a ready item (written, not yet in the prompt) that covers a changed message is retired: the
  policy schedules that range again.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kioku.chat_messages import message_tokens
from kioku.corrections import carry
from kioku.generations import chapter_task, synopsis_task
from kioku.lang import detect_lang
from kioku.memory import MemoryItem
from kioku.messages import Message
from kioku.profiles import DEFAULT_IMAGE_TOKENS, Profile
from kioku.rendering import render_story
from kioku.scenes import scenes_in
from kioku.store import Job, Store
from kioku.store.edits import ChangeKind, Revised, Rewrite
from kioku.store.protocols import LogReads
from kioku.structure import is_structured, record_from_data
from kioku.summarizer import SummaryTask, render_lines, stored_lines
from kioku.tokens import ScriptEstimator, TokenCounter
from kioku.transcript import render_transcript

NOTE: Mapping[str, Mapping[str, str]] = {
    "en": {
        "raw": "(This part was edited and is being summarized again; the corrected messages:)",
        "errata": "Corrections (these messages changed after the above was written; they win):",
        "deleted": "deleted; disregard what it said",
    },
    "ja": {
        "raw": "(この部分は編集されたため要約し直しています。修正後のメッセージ:)",
        "errata": "訂正(以下のメッセージは上の要約の後に変更された。こちらが正しい):",
        "deleted": "削除済み。その内容は無視すること",
    },
    "zh": {
        "raw": "(这部分已被编辑,正在重新总结;修改后的消息:)",
        "errata": "更正(以下消息在上文写成后被修改,以此为准):",
        "deleted": "已删除;请忽略其内容",
    },
}


@dataclass(frozen=True)
class Change:
    """One stored message's new content; `message` None deletes it."""

    seq: int
    message: Message | None
    kind: ChangeKind = "edit"
    meta: Mapping[str, Any] | None = None


def revise(
    store: Store,
    conversation_id: str,
    changes: Sequence[Change],
    counter: TokenCounter,
    *,
    delay_s: float = 0.0,
    now: float | None = None,
    image_tokens: int = DEFAULT_IMAGE_TOKENS,
) -> Revised:
    """Apply edits and deletions in one transaction: versions kept, items marked stale, revision
    jobs queued. `now` is the engine's clock (jobs run after `now + delay_s`). A `Conversation`
    revises through `Conversation.revise`, which also forgets what it cached of the log."""
    now = time.time() if now is None else now
    rewrites = [
        Rewrite(
            ch.seq,
            ch.message,
            message_tokens(ch.message, counter, image_tokens) if ch.message is not None else 0,
            ch.kind,
            ch.meta,
        )
        for ch in changes
    ]
    return store.rewrite_messages(conversation_id, rewrites, run_after=now + delay_s, now=now)


def changed_seqs(store: LogReads, conversation_id: str, first: int, last: int) -> list[int]:
    """Seqs in [first, last] that have an older version (edited, deleted or regenerated)."""
    return store.changed_seqs(conversation_id, first, last)


def versions(store: LogReads, conversation_id: str, seq: int) -> list[dict[str, Any]]:
    """Earlier contents of one message, oldest first."""
    return store.message_versions(conversation_id, seq)


# the prompt until the revision lands ---------------------------------------------------------


def _body(item: MemoryItem, lang: str, changed: Collection[int] = ()) -> str:
    """The stale item's text without its lines taken from a changed message: what the user
    deleted or edited away is not shown again, even until the re-summary."""
    if changed:
        lines = stored_lines(item)
        kept = [ln for ln in lines if ln.seq not in changed]
        if len(kept) < len(lines):
            return render_lines(kept, scenes_in(item.data), lang).strip()
    if is_structured(item.data):
        return render_story(record_from_data(item.data), lang).strip()
    return item.text.strip()


def _errata(store: LogReads, conversation_id: str, item: MemoryItem, lang: str) -> str:
    note = NOTE.get(lang, NOTE["en"])
    lines: list[str] = []
    for seq in changed_seqs(store, conversation_id, item.first_seq, item.last_seq):
        entry = store.entries(conversation_id, seq, seq)
        if not entry or entry[0].message.is_empty():
            lines.append(f"#{seq} ({note['deleted']})")
        else:
            lines.append(render_transcript(entry, lang))
    return "\n\n".join([note["errata"], *lines])


def stand_in(
    store: LogReads,
    conversation_id: str,
    item: MemoryItem,
    profile: Profile,
    counter: TokenCounter | None = None,
    lang: str = "en",
) -> MemoryItem:
    """What the prompt shows for a stale item: a chapter's corrected messages when they fit
    half of the room the profile leaves above its ceiling, else the stale text plus the
    corrected messages. Same id, kind and range, so the policy and the fold see the item."""
    counter = counter or ScriptEstimator()
    note = NOTE.get(lang, NOTE["en"])
    text = ""
    if item.kind == "chapter":
        entries = store.entries(conversation_id, item.first_seq, item.last_seq)
        if sum(e.tokens for e in entries) <= max(0, profile.prompt_budget - profile.ceiling) // 2:
            text = f"{note['raw']}\n\n{render_transcript(entries, lang)}"
    if not text:
        changed = changed_seqs(store, conversation_id, item.first_seq, item.last_seq)
        body = _body(item, lang, changed)
        text = f"{body}\n\n{_errata(store, conversation_id, item, lang)}"
    return replace(item, text=text, data={}, tokens=counter.count(text))


def stand_ins(
    store: LogReads,
    conversation_id: str,
    items: Sequence[MemoryItem],
    profile: Profile,
    counter: TokenCounter,
    lang: str = "en",
) -> list[MemoryItem]:
    return [
        stand_in(store, conversation_id, i, profile, counter, lang) if i.stale else i for i in items
    ]


# the worker's side ---------------------------------------------------------------------------


def revision_task(
    store: LogReads,
    job: Job,
    profile: Profile,
    character: str = "",
    avoid_phrases: Sequence[str] = (),
) -> SummaryTask | None:
    """The re-summary of a stale item, or None when the item is no longer in memory."""
    cid = job.conversation_id
    target = revision_target(store, job)
    if target is None:
        return None
    if target.kind == "chapter":
        entries = store.entries(cid, target.first_seq, target.last_seq)
        lang = detect_lang([e.text for e in entries[:20]])
        task = chapter_task(
            entries, profile, lang=lang, character=character, avoid_phrases=avoid_phrases
        )
        # the memory before it, so the chronicler reuses the ids of open threads
        active = store.items(cid, "active")
        return replace(
            task,
            previous=next((i for i in active if i.kind == "synopsis"), None),
            chapters=tuple(
                i for i in active if i.kind == "chapter" and i.last_seq < target.first_seq
            ),
        )
    # A synopsis may span thousands of messages: it is rewritten from its own stale text with
    # the corrections, as a major GC folds a chapter.
    lang = detect_lang([target.text])
    source = stand_in(store, cid, target, profile, lang=lang)
    return synopsis_task(
        None, [source], profile, lang=lang, character=character, avoid_phrases=avoid_phrases
    )


def revision_target(store: LogReads, job: Job) -> MemoryItem | None:
    """The active item a revision job rewrites: the stale item it was queued for, or the
    revision that already replaced it (an edit came while an earlier revision was running)."""
    active = store.items(job.conversation_id, "active")
    wanted = job.payload.get("item_id")
    return next((i for i in active if i.id == wanted), None) or next(
        (i for i in active if i.span == (job.first_seq, job.last_seq)), None
    )


def revised_item(store: LogReads, job: Job, item: MemoryItem) -> MemoryItem:
    """A revision covers exactly the range of the item it replaces (it is discarded at the
    fold if that item is gone by then)."""
    target = revision_target(store, job)
    old = target.id if target is not None and target.id is not None else job.payload["item_id"]
    item = replace(item, first_seq=job.first_seq, last_seq=job.last_seq, replaces=(int(old),))
    if target is not None:
        item = carry(target, item)  # an operator's edit of the item outlives its re-summary
    return item
