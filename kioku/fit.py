"""Can a message ever fit? Refuse one that cannot before it is stored.

A message is sent verbatim, so one larger than the window beside the system prompt and the
response reserve can never be answered, whatever memory does. Storing it anyway (as kioku once
did: "400 … stored as seq 0") leaves a row every later turn trips over, and each retry stored
another copy. The check lives in this one function so that the prompt allocator can own it; the
allocator's own check (`context.build`) stays the last word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kioku.context import MESSAGE_OVERHEAD
from kioku.errors import MessageTooLarge
from kioku.profiles import Profile

if TYPE_CHECKING:
    from kioku.engine import Conversation


def message_limit(profile: Profile, system_tokens: int) -> int:
    """The most tokens one message may have: the prompt budget less the system prompt and the
    template overhead of the two."""
    return profile.prompt_budget - system_tokens - 2 * MESSAGE_OVERHEAD


def refuse_if_never_fits(conv: Conversation, tokens: Sequence[int]) -> None:
    """Raise `MessageTooLarge` (nothing stored) if a message of so many tokens can never fit."""
    if not tokens:
        return
    largest = max(tokens)
    limit = message_limit(conv.kioku.profile, conv.system_tokens)
    if largest > limit:
        raise MessageTooLarge(largest, limit)
