"""Card changes: prefix-cache breaks the client causes.

The character card (the request's leading system messages) is the base of the upstream's prefix
cache: when one byte of it changes, the whole prompt is read again. kioku keeps everything after
the card stable, but the card is the client's. SillyTavern, for one, builds it anew each turn
and may insert, drop or reorder the example dialogue, expand `{{random}}` or the time, or add a
world-info entry that a keyword triggered. Each change is counted per conversation
(`card_changes`, in `/metrics` as `kioku_card_changes_total` and in the console) and logged
with where the two versions first differ, so the user can find the setting that causes it
(docs/sillytavern.md lists them).
"""

from __future__ import annotations

from kioku.errors import NotFound
from kioku.store import Store

CARD_CHANGES = "card_changes"
EXCERPT = 60


def stored_card(store: Store, key: str, tenant: str) -> str | None:
    """The card a tenant's conversation (by its store key) has now, or None when it does not
    exist yet."""
    try:
        return store.conversation(key, tenant=tenant).system_prompt
    except NotFound:
        return None


def first_difference(old: str, new: str) -> int:
    n = min(len(old), len(new))
    return next((k for k in range(n) if old[k] != new[k]), n)


def note_card(store: Store, conversation_id: str, old: str | None, new: str | None) -> bool:
    """Count and log a card change (`old` → `new`); a first card, or none sent, is not one."""
    if not old or new is None or new == old:
        return False
    at = first_difference(old, new)
    store.incr(conversation_id, CARD_CHANGES)
    store.log(
        conversation_id,
        "card",
        "changed",
        detail=(
            f"the client changed the card ({len(old)} → {len(new)} chars, first difference "
            f"at char {at}: {old[at : at + EXCERPT]!r} → {new[at : at + EXCERPT]!r}); "
            "the upstream reads the whole prompt again"
        ),
    )
    return True
