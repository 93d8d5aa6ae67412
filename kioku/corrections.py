"""An operator's corrections of memory: one line of a chapter or synopsis edited or retracted.

Memory items are never rewritten. A correction is a *revision*: a new item with the kind and
range of the item it corrects, carrying every operator edit so far in
`data["operator_edits"]` (`{"line", "text", "at"}`; `text` None: retracted), ready at once. The
next fold puts it in place of the old item (`policy._swap_revisions`, the path a re-summary takes
after a client edited a message), so the prompt changes at a fold, one cache break, as for any
memory change; until then the console shows it as pending. The old item stays in the table,
retired, so what memory said before the operator stepped in stays readable.

A line is a line of the item as the prompt shows it (`item_lines`): an extractive item's text,
an LLM item's rendered story. An extractive revision holds the corrected text itself; an LLM
item keeps its structure (threads, key lines, facts about the user) and the edits are applied
where it is rendered (`apply_edits`, in `memory.render_memory` and for the chronicler's input).

The operator's edit wins: when a client's edit under the item later has it re-summarized, the
re-summary carries the operator's edits over (`carry`): a retracted line stays out, a corrected
line replaces the line it corrected or, when the new summary no longer has it, is kept anyway.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kioku.errors import InputError, NotFound
from kioku.memory import MemoryItem
from kioku.operator_edits import OPERATOR_EDITS, apply_edits, edits_in
from kioku.rendering import render_story
from kioku.store.protocols import LogReads, OperatorStore
from kioku.structure import is_structured, record_from_data
from kioku.tokens import TokenCounter

MAX_LINE_CHARS = 2000


def edits_of(item: MemoryItem) -> list[dict[str, Any]]:
    """The operator's edits an item carries, oldest first."""
    return edits_in(item.data)


def rendered_story(item: MemoryItem, lang: str) -> str:
    """An LLM item's story as the prompt shows it, the operator's edits applied."""
    return apply_edits(render_story(record_from_data(item.data), lang).strip(), edits_of(item))


def item_lines(item: MemoryItem, lang: str = "en") -> list[str]:
    """The item's lines as the prompt shows them (blank lines left out)."""
    body = rendered_story(item, lang) if is_structured(item.data) else item.text
    return [ln for ln in body.strip().split("\n") if ln.strip()]


def pending(store: LogReads, conversation_id: str) -> dict[int, MemoryItem]:
    """The newest operator revision waiting for the next fold, by the id of the active item it
    corrects."""
    active = {i.id for i in store.items(conversation_id, "active")}
    out: dict[int, MemoryItem] = {}
    for r in store.items(conversation_id, "ready"):
        if edits_of(r) and len(r.replaces) == 1 and r.replaces[0] in active:
            old = out.get(r.replaces[0])
            if old is None or (r.id or 0) > (old.id or 0):
                out[r.replaces[0]] = r
    return out


def correct(
    store: OperatorStore,
    conversation_id: str,
    item_id: int,
    line: str,
    text: str | None,
    *,
    counter: TokenCounter,
    now: float,
    lang: str = "en",
) -> MemoryItem:
    """Edit (`text`) or retract (`text` None) one line of an active memory item; returns the
    revision that the next fold applies."""
    target = next((i for i in store.items(conversation_id, "active") if i.id == item_id), None)
    if target is None:
        raise NotFound(
            f"memory item {item_id} is not in memory now (a fold replaced it?): reload the memory"
        )
    base = pending(store, conversation_id).get(item_id, target)
    if text is not None:
        text = text.strip()
        if not text or "\n" in text or len(text) > MAX_LINE_CHARS:
            raise InputError(
                f"a corrected line is one line of 1 to {MAX_LINE_CHARS} characters; "
                "to remove the line, retract it"
            )
    wanted = line.strip()
    if wanted not in (ln.strip() for ln in item_lines(base, lang)):
        raise InputError(
            f"memory item {item_id} has no such line (it changed meanwhile?): reload the memory"
        )
    edit = {"line": wanted, "text": text, "at": now}
    data = {**dict(base.data or {}), OPERATOR_EDITS: [*edits_of(base), edit]}
    revised = replace(
        base,
        id=None,
        status="ready",
        ready_at=now,
        replaces=(item_id,),
        stale=False,
        data=data,
        text=base.text if is_structured(base.data) else apply_edits(base.text, [edit]),
    )
    before, after = ("\n".join(item_lines(i, lang)) for i in (base, revised))
    revised = replace(revised, tokens=base.tokens + counter.count(after) - counter.count(before))
    what = "retracted" if text is None else "corrected"
    with store.atomic():  # the revision, its log line and its counter, or none of them
        new_id = store.add_item(conversation_id, revised)
        store.log(
            conversation_id,
            "operator_edit",
            "pending",
            first_seq=target.first_seq,
            last_seq=target.last_seq,
            detail=f"item {item_id}: {what} a line; applies at the next fold (revision {new_id})",
            at=now,
        )
        store.incr(conversation_id, "operator_edits")
    return replace(revised, id=new_id)


def carry(old: MemoryItem, new: MemoryItem) -> MemoryItem:
    """A re-summary of `old` that keeps the operator's edits of it."""
    edits = edits_of(old)
    if not edits:
        return new
    data = {**dict(new.data or {}), OPERATOR_EDITS: edits}
    if is_structured(new.data):
        return replace(new, data=data)
    return replace(new, data=data, text=apply_edits(new.text, edits))
