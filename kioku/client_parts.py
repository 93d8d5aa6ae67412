"""What a client adds to its own prompt each turn, placed where it put it and counted.

A stateless client builds a prompt of its own around the chat, and some of it is not the card
and not the chat: SillyTavern's Author's Note and world-info entries "in-chat @ depth N" (system
messages N messages from the end of the chat), its post-history instructions and nudges (after
the last message), and the card's parts that change from turn to turn (keyword-triggered
world info, vector-storage results: the extension marks them). None of it is stored: it is the
client's, sent again with every request. kioku keeps each where the client meant it:

- an in-chat part at its depth: before the last `depth` messages of kioku's prompt (raw window
  and new message), as the client counted them in its own;
- a volatile card part after the chat, where a change re-reads only itself: in the card, one
  entry triggered by a keyword made the model read the whole prompt again (SillyTavern's
  defaults changed the card on 30 of 43 turns, issue 22). On a continue it goes before the
  reply being continued, which must stay last;
- what came after the last message (post-history instructions, a continue or group nudge)
  last, in order.

Every part is counted in the prompt's tokens like the rest (`kioku.context`): the budget holds
what is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kioku.models import ChatMessage
from kioku.tokens import TokenCounter


@dataclass(frozen=True)
class ClientParts:
    injections: tuple[tuple[int, ChatMessage], ...] = ()  # (depth, message), in request order
    volatile: tuple[ChatMessage, ...] = ()  # card parts that change from turn to turn
    after: tuple[ChatMessage, ...] = ()  # after the last message of the chat
    continuing: bool = False  # the last message is a reply being continued

    def __bool__(self) -> bool:
        return bool(self.injections or self.volatile or self.after)

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        return (*(m for _, m in self.injections), *self.volatile, *self.after)

    def tokens(self, counter: TokenCounter, per_message: float) -> int:
        """What the parts add to the prompt: their text and a message's template each (an
        upper bound: merged into a neighbour, a part costs less)."""
        ms = self.messages
        return sum(counter.count(m.content) for m in ms) + round(per_message * len(ms))


NO_PARTS = ClientParts()


def place(chat: Sequence[ChatMessage], parts: ClientParts) -> list[ChatMessage]:
    """`chat` (the raw window and the new message, oldest first) with the client's parts in
    place (see the module docstring)."""
    out = list(chat)
    # deepest first, so a shallower part's position is counted among the chat's own messages
    for depth, m in sorted(parts.injections, key=lambda p: -p[0]):
        at = max(0, len(out) - _chat_after(out, depth))
        out.insert(at, m)
    tail = list(parts.volatile)
    if parts.continuing and out:
        out[-1:-1] = tail
    else:
        out.extend(tail)
    out.extend(parts.after)
    return out


def _chat_after(out: Sequence[ChatMessage], depth: int) -> int:
    """How many of `out`'s last messages to leave after a part at `depth`: `depth` messages
    of the chat, and any parts already placed among them."""
    n = seen = 0
    for m in reversed(out):
        if seen == depth:
            break
        n += 1
        if m.role != "system":
            seen += 1
    return n
