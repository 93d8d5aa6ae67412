"""The boundary between the engine and the memory layers beside the log: one typed protocol.

The engine's core knows nothing of BM25, ledgers or n-grams. At a turn it asks the layers for
recall (whether the past is wanted, and what of it) and per-turn instructions; at a fold, for the notes the memory exchange shows; its
worker asks which phrases to keep out of a summary and tells them when a chapter was written.
The operator's surfaces (the proxy, the API, the CLI) read tic alerts, edit notes and search the
archive through the same object. It is passed once, to `Kioku(layers=...)`, and never changes.

`NoLayers` is the engine alone (every hook does nothing); `kioku.layers.Layers` is archive
recall, notes and the verbal-tic guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from kioku import notes as notes_layer
from kioku.errors import ConfigError

if TYPE_CHECKING:
    from kioku.archive import Hit
    from kioku.engine import Conversation
    from kioku.memory import Memory
    from kioku.messages import LogEntry
    from kioku.need import Recall
    from kioku.tics import TicAlert


class MemoryLayers(Protocol):
    def recall(
        self,
        conv: Conversation,
        entry: LogEntry,
        raw_start: int,
        window: Sequence[LogEntry],
        memory: Memory,
    ) -> Recall:
        """Whether the new message `entry` wants the past, why, and the past exchanges (all
        before `raw_start`) to show beside it (`kioku.need`): `window` (the raw window) and
        `memory` are what the prompt shows already, so nothing they hold is shown again."""
        ...

    def instructions(self, conv: Conversation) -> Sequence[str]:
        """Lines to add to this turn's user message (an anti-repetition line)."""
        ...

    def notes(self, conv: Conversation) -> str | None:
        """The notes for the memory exchange, rendered at a fold; None: no notes layer."""
        ...

    def avoid_phrases(self, conversation_id: str) -> Sequence[str]:
        """Phrases no summary may carry (verbal tics)."""
        ...

    def chapter_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        """A chapter over `entries` was stored (notes are extracted from them)."""
        ...

    def cut_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        """A forced or operator cut folded `entries` without a summary job (their notes are
        extracted now, inside the turn, so without a model)."""
        ...

    def tic_alerts(self, conversation_id: str) -> Sequence[TicAlert]:
        """Phrases the character repeats across its recent replies."""
        ...

    def after_reply(self, conversation_id: str, reply: LogEntry) -> Sequence[TicAlert]:
        """`tic_alerts` once `reply` is stored, ready for the next turn (the service calls it
        after the response, off the turn's path)."""
        ...

    def edit_notes(
        self, conv: Conversation, edited: str, base: str | None = None
    ) -> notes_layer.EditResult:
        """Apply an operator's edit of the notes text (diffed against `base`) and show it."""
        ...

    def search(self, conversation_id: str, query: str, k: int) -> Sequence[Hit]:
        """The archive's best `k` turns for `query`."""
        ...


class NoLayers:
    """The engine alone: no recollections, instructions, notes or tic guard. An operator's notes
    edit is still written to the ledger (it shows once a notes layer renders it)."""

    def recall(
        self,
        conv: Conversation,
        entry: LogEntry,
        raw_start: int,
        window: Sequence[LogEntry],
        memory: Memory,
    ) -> Recall:
        from kioku.need import Need, Recall

        return Recall(Need.off("recall is off"))

    def instructions(self, conv: Conversation) -> Sequence[str]:
        return ()

    def notes(self, conv: Conversation) -> str | None:
        return None

    def avoid_phrases(self, conversation_id: str) -> Sequence[str]:
        return ()

    def chapter_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        return None

    def cut_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        return None

    def tic_alerts(self, conversation_id: str) -> Sequence[TicAlert]:
        return ()

    def after_reply(self, conversation_id: str, reply: LogEntry) -> Sequence[TicAlert]:
        return ()

    def edit_notes(
        self, conv: Conversation, edited: str, base: str | None = None
    ) -> notes_layer.EditResult:
        result = notes_layer.apply_edit(conv.store, conv.id, edited, base=base)
        conv.refresh_notes()
        return result

    def search(self, conversation_id: str, query: str, k: int) -> Sequence[Hit]:
        raise ConfigError(
            "searching the archive needs the memory layers; they are off in this configuration"
        )


NO_LAYERS = NoLayers()
