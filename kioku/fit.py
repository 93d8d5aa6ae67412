"""Can a message ever fit? Refuse one that cannot before it is stored.

A message is sent verbatim, so one larger than the window beside the system prompt and the
response reserve can never be answered, whatever memory does. Storing it anyway (as kioku once
did: "400 … stored as seq 0") leaves a row every later turn trips over, and each retry stored
another copy. The limit is the one `context.plan` applies to the message it answers (the card's
profile, its ceiling, the learned margin, the template's overhead), less a date line the
message may get in the window, so what passes here is never refused there for its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from kioku.budget import template_of, usable
from kioku.chat_messages import message_tokens
from kioku.dates import date_line
from kioku.errors import MessageTooLarge
from kioku.messages import Message
from kioku.profiles import Profile
from kioku.tokens import TokenCounter

LANGS = ("en", "ja", "zh")  # the languages `kioku.dates` writes dates in
# a day whose date line is as long as any (a Wednesday in September, two-digit day)
_LONGEST_DAY = date(2000, 9, 27)


def message_limit(
    system_prompt: str, profile: Profile, counter: TokenCounter, margin_share: float
) -> int:
    """The most tokens one message may have beside `system_prompt`, on the card's `profile`
    with the learned margin's share (`Conversation.message_limit` passes its own)."""
    budget = min(usable(profile.prompt_budget, margin_share), profile.ceiling)
    system_t = counter.count(system_prompt) if system_prompt else 0
    # the longest date line of any language (reading the conversation's language here would
    # fix it before the conversation's first message is stored)
    line_t = max(counter.count(date_line(_LONGEST_DAY, lang) + "\n") for lang in LANGS)
    return budget - system_t - template_of(counter).messages(2 if system_prompt else 1) - line_t


def refuse_if_never_fits(limit: int, tokens: Sequence[int]) -> None:
    """Raise `MessageTooLarge` (nothing stored) if a message of so many tokens is over `limit`
    (`message_limit`), so can never fit."""
    if not tokens:
        return
    largest = max(tokens)
    if largest > limit:
        raise MessageTooLarge(largest, limit)


def fitted(message: Message, limit: int, counter: TokenCounter, image_tokens: int) -> int:
    """The tokens of a message that can fit (`refuse_if_never_fits` otherwise)."""
    tokens = message_tokens(message, counter, image_tokens)
    refuse_if_never_fits(limit, [tokens])
    return tokens
