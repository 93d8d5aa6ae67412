"""The engine alone: memory layers that do nothing (`Kioku`'s default)."""

from __future__ import annotations

from collections.abc import Sequence

from kioku.errors import ConfigError
from kioku.messages import LogEntry
from kioku.recall.archive import Hit
from kioku.recall.need import Need, Recall
from kioku.tics import TicAlert
from kioku.turn_state import TurnState

__all__ = ["NO_LAYERS", "NoLayers"]


class NoLayers:
    """No recollections, instructions, notes or tic guard (`kioku.hooks.MemoryLayers`). An
    operator's notes edit is still written to the ledger (`Conversation.edit_notes`; it shows
    once a notes layer renders it)."""

    def recall(self, turn: TurnState, entry: LogEntry) -> Recall:
        return Recall(Need.off("recall is off"))

    def instructions(self, turn: TurnState) -> Sequence[str]:
        return ()

    def notes(self, turn: TurnState) -> str | None:
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

    def search(self, conversation_id: str, query: str, k: int) -> Sequence[Hit]:
        raise ConfigError(
            "searching the archive needs the memory layers; they are off in this configuration"
        )

    def conversation_deleted(self, conversation_id: str) -> None:
        return None


NO_LAYERS = NoLayers()
