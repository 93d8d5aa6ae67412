"""A request's leading system messages: the card kioku keeps, and what it moves.

SillyTavern sends its card as several system messages: the main prompt, world info, the
description, personality, scenario, the example dialogue (one message per line, each named
`example_user` or `example_assistant`, after an `[Example Chat]` separator), the new-chat
marker. kioku keeps them as one system prompt, the prefix-cache base, except:

- **volatile parts** (the extension lists them in `X-Kioku-Volatile`: world-info entries a
  keyword triggered, extension prompts placed in the card) change from turn to turn, and any
  change in the card makes the model read the whole prompt again. They go after the chat
  (`kioku.client_parts`), where a change costs only themselves;
- **example dialogue** keeps its speakers: a named example's text is written after its
  speaker's name (`Alex: …`, `Mika: …`), since joining it into the system prompt drops
  the `name` (and most chat templates ignore it anyway). While SillyTavern pushes examples out
  as the chat grows (its default, *gradual push-out*, which the extension reports in
  `X-Kioku-Examples`), kioku keeps the examples the card had when the chat began
  (`pinned`): SillyTavern trims them to fit its own context size, which is not the window kioku
  fits the prompt to, and each trim was a cache break. It drops the lines that no longer fit
  dialogue by dialogue, so the request's example lines are a subsequence of the stored ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kioku.models import ChatMessage

EXAMPLE_NAMES = {"example_user": "user", "example_assistant": "assistant"}
JOIN = "\n\n"


@dataclass(frozen=True)
class LeadingMessage:
    text: str
    name: str = ""


@dataclass(frozen=True)
class Card:
    """The card as kioku keeps it (`text`: its blocks joined), which of its blocks are example
    dialogue, and the parts that go after the chat."""

    blocks: tuple[str, ...] = ()
    examples: tuple[int, ...] = ()  # indices of the blocks that are example dialogue
    volatile: tuple[ChatMessage, ...] = ()
    labels: tuple[str, ...] = ()  # the example speakers' labels ("Alex: ", "Mika: ")

    @property
    def text(self) -> str | None:
        return JOIN.join(self.blocks) if self.blocks else None


def speaker(name: str, user: str, character: str) -> str:
    side = EXAMPLE_NAMES.get(name)
    if side == "user":
        return user or "User"
    if side == "assistant":
        return character or "Character"
    return name


def card_of(
    leading: Sequence[LeadingMessage],
    volatile: frozenset[int] = frozenset(),
    *,
    user: str = "",
    character: str = "",
) -> Card:
    """The card from the request's leading system messages; `volatile`: their indices the
    client marked as changing from turn to turn."""
    blocks: list[str] = []
    examples: list[int] = []
    moved: list[ChatMessage] = []
    labels = tuple(f"{speaker(n, user, character)}: " for n in EXAMPLE_NAMES)
    for k, m in enumerate(leading):
        if k in volatile:
            moved.append(ChatMessage("system", m.text))
            continue
        named = m.name in EXAMPLE_NAMES
        separator = not m.name and k + 1 < len(leading) and leading[k + 1].name in EXAMPLE_NAMES
        text = m.text
        if m.name:
            who = speaker(m.name, user, character)
            if not text.lstrip().startswith(f"{who}:"):  # a group's examples carry it already
                text = f"{who}: {text}"
        if (named or separator) and examples and examples[-1] == len(blocks) - 1:
            blocks[-1] = f"{blocks[-1]}\n{text}"  # one block of example dialogue
        else:
            if named or separator:
                examples.append(len(blocks))
            blocks.append(text)
    return Card(tuple(blocks), tuple(examples), tuple(moved), labels)


def pinned(stored: str | None, card: Card) -> str | None:
    """The card to keep while the client pushes its example dialogue out: the stored card,
    when it is this card with more of the same examples than the request still has, else the
    request's card. SillyTavern's push-out drops the example lines that no longer fit its
    context, dialogue by dialogue (a later dialogue's first line may still fit), so the
    request's example lines are a subsequence of the stored ones, never new ones."""
    new = card.text
    if not stored or new is None or stored == new:
        return new
    blocks = list(card.blocks)
    if card.examples:
        first, last = card.examples[0], card.examples[-1]
        shown = JOIN.join(blocks[first : last + 1])
        cuts = [(first, last + 1)]
    else:  # all pushed out: they were before the new-chat marker, or at the end
        shown = ""
        cuts = [(len(blocks) - 1, len(blocks) - 1), (len(blocks), len(blocks))]
    for lo, hi in cuts:
        head = JOIN.join(blocks[:lo]) + JOIN if lo > 0 else ""
        tail = JOIN + JOIN.join(blocks[hi:]) if hi < len(blocks) else ""
        if len(stored) <= len(head) + len(tail) or not stored.startswith(head):
            continue
        if not stored.endswith(tail):
            continue
        kept = stored[len(head) : len(stored) - len(tail)]
        if (
            len(kept) > len(shown)
            and _subsequence(shown.split("\n"), kept.split("\n"))
            and any(f"\n{label}" in f"\n{kept}" for label in card.labels)
        ):
            return stored
    return new


def _subsequence(part: Sequence[str], whole: Sequence[str]) -> bool:
    """Whether `part`'s lines all appear in `whole`, in order (blank ones aside)."""
    it = iter(line for line in whole if line.strip())
    return all(any(line == w for w in it) for line in part if line.strip())
