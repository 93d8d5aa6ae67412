"""Branches: a conversation that starts as another one up to a message, with its memory.

SillyTavern's *Branch* and *Checkpoint* make a new chat file holding the chat up to message N
(the metadata names the parent: `main_chat`). Each is a chat of its own from then on. Before
issue 22 kioku met the branch as a stranger: its first request carried the whole history, so
memory was written again from nothing, and the branch's name ("Branch #60 - …") was refused.

A branch now starts with its parent's state up to where the two part (`branch_point`: one past
the last parent message of the longest run the branch's transcript shares with the parent):
the parent's messages below it, copied with their seqs, and the parent's memory cut there
(`inherited`): memory items that cover seqs below it exactly once, shared as they were written,
never summarized again. An item that reaches past the branch point (a synopsis over the whole
chat, say) is replaced by the items it folded, as far as they stay below it; where none does,
the branch's raw window starts earlier and that stretch is summarized in the branch. The
invariant holds in the branch from its first turn: every seq before its raw window is covered
by its memory exactly once. The notes taken from the shared messages come along; what the
parent learned after the branch point does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kioku.align import opcodes
from kioku.memory import MemoryItem, coverage_gaps
from kioku.sync import Incoming, Logged, line_key

if TYPE_CHECKING:
    from kioku.store import Store


@dataclass(frozen=True)
class Inheritance:
    upto: int  # the parent's messages below this seq are the branch's too
    raw_start: int  # the branch's raw window starts here
    active: tuple[MemoryItem, ...]  # the parent's items the branch's memory shares
    ready: tuple[MemoryItem, ...] = ()  # the parent's written chapters not yet in its prompt

    def __post_init__(self) -> None:
        problems = coverage_gaps(self.active, self.raw_start)
        if problems or self.raw_start > self.upto:
            raise ValueError(f"a branch's memory must cover its start exactly: {problems}")


def branch_point(parent: Sequence[Logged], transcript: Sequence[Incoming]) -> int | None:
    """One past the last parent message of the longest run of messages the branch's
    transcript shares with the parent's log (its visible messages, oldest first); None when
    they share none. The longest run, not the last: a short line the branch says later
    ("ok") may match a later parent message by chance."""
    if not parent or not transcript:
        return None
    ops = opcodes([x.key for x in parent], [m.key for m in transcript])
    runs = [(i2 - i1, -i1, i2) for tag, i1, i2, _, _ in ops if tag == "equal"]
    if not runs:
        return None
    _, _, end = max(runs)
    return parent[end - 1].seq + 1


def inherited(items: Iterable[MemoryItem], upto: int) -> Inheritance:
    """The parent's memory that a branch at `upto` shares (see the module docstring):
    `items` are all of the parent's, any status."""
    everything = list(items)
    by_id = {i.id: i for i in everything if i.id is not None}

    def below(item: MemoryItem, depth: int = 0) -> list[MemoryItem]:
        if item.last_seq < upto:
            return [item]
        if item.first_seq >= upto or depth > 64:
            return []
        folded = sorted((by_id[r] for r in item.replaces if r in by_id), key=_start)
        return [x for f in folded for x in below(f, depth + 1)]

    candidates = sorted(
        (x for i in everything if i.status == "active" for x in below(i)), key=_start
    )
    chain: list[MemoryItem] = []
    expected = 0
    for item in candidates:
        if item.first_seq != expected:
            break
        chain.append(item)
        expected = item.last_seq + 1
    ready = tuple(
        i
        for i in sorted(everything, key=_start)
        if i.status == "ready"
        and i.kind == "chapter"
        and not i.replaces
        and not i.stale
        and i.first_seq >= expected
        and i.last_seq < upto
    )
    return Inheritance(upto, expected, tuple(chain), ready)


def _start(item: MemoryItem) -> tuple[int, int]:
    return (item.first_seq, -item.last_seq)


def start_branch(
    store: Store, parent: str, child: str, transcript: Sequence[Incoming]
) -> Inheritance | None:
    """Start the empty conversation `child` (a store key) as a branch of `parent` where the
    branch's first transcript parts from it; None (nothing copied) when they share nothing."""
    info = store.conversation(parent)
    visible = [
        Logged(seq, role, line_key(role, text))
        for seq, role, text in store.visible_tail(parent, max(1, info.next_seq))
    ]
    upto = branch_point(visible, transcript)
    if not upto:
        return None
    inh = inherited(store.items(parent), upto)
    with store.atomic():
        copied = store.copy_branch(
            parent, child, upto=upto, raw_start=inh.raw_start, active=inh.active, ready=inh.ready
        )
        store.log(
            child,
            "branch",
            "started",
            first_seq=0,
            last_seq=upto - 1,
            detail=(
                f"branched from {info.public_id!r} at #{upto}: {copied} messages and "
                f"{len(inh.active)} memory items (up to #{inh.raw_start - 1}) shared"
                + (f", {len(inh.ready)} written chapters" if inh.ready else "")
            ),
        )
        store.incr(child, "branch_shared_items", len(inh.active))
    return inh
