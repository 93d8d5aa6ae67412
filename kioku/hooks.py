"""The boundary between the engine and the memory layers beside the log: typed protocols.

The engine's core knows nothing of BM25, ledgers or n-grams. Two kinds of caller talk to the
layers, and each sees only its part:
- `TurnHooks`, what a turn and the worker call. At a turn the engine asks for recall (whether
  the past is wanted, and what of it) and per-turn instructions; at a fold, for the notes the
  memory exchange shows; the worker asks which phrases to keep out of a summary and tells the
  layers when a chapter was written. Every turn hook takes the turn's `TurnState`, read once,
  never the conversation itself.
- `OperatorQueries`, what the operator's surfaces (the API, the console, the CLI) call: tic
  alerts, a search of the archive, and the news that a conversation was deleted. (An operator's edit of the notes is the ledger's:
  `Conversation.edit_notes`.)

`MemoryLayers` is both, as `Kioku(layers=...)` takes it (once; it never changes).
`kioku.no_layers.NoLayers` is the engine alone (every hook does nothing);
`kioku.layers.Layers` is archive recall, notes and the verbal-tic guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kioku.messages import LogEntry
    from kioku.recall.archive import Hit
    from kioku.recall.need import Recall
    from kioku.tics import TicAlert
    from kioku.turn_state import TurnState


class TurnHooks(Protocol):
    def recall(self, turn: TurnState, entry: LogEntry) -> Recall:
        """Whether the new message `entry` wants the past, why, and the past exchanges (all
        before the raw window) to show beside it (`kioku.recall.need`): the turn's raw window and
        memory are what the prompt shows already, so nothing they hold is shown again."""
        ...

    def instructions(self, turn: TurnState) -> Sequence[str]:
        """Lines to add to this turn's user message (an anti-repetition line)."""
        ...

    def notes(self, turn: TurnState) -> str | None:
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

    def after_reply(self, conversation_id: str, reply: LogEntry) -> Sequence[TicAlert]:
        """The tic alerts once `reply` is stored, ready for the next turn (the service calls it
        after the response, off the turn's path)."""
        ...


class OperatorQueries(Protocol):
    def tic_alerts(self, conversation_id: str) -> Sequence[TicAlert]:
        """Phrases the character repeats across its recent replies."""
        ...

    def search(self, conversation_id: str, query: str, k: int) -> Sequence[Hit]:
        """The archive's best `k` turns for `query`."""
        ...

    def conversation_deleted(self, conversation_id: str) -> None:
        """The conversation was deleted (`kioku.service.deletion`): forget what is cached of
        it, so a new conversation under the same key starts from nothing."""
        ...


class MemoryLayers(TurnHooks, OperatorQueries, Protocol):
    """The memory layers as the engine takes them: the turn hooks and the operator queries."""
