"""What one turn is decided and built from, as a value read once: the conversation's row, its raw
window, its memory and the summaries waiting for their fold, with the numbers the turn runs on.

The engine reads it at the start of a turn (`Conversation.view`) and again only when a fold moved
the raw window; the compactor decides on it and the memory layers answer from it (`kioku.hooks`),
so neither holds the conversation nor reads back what a turn left on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kioku.memory import Memory, MemoryItem
from kioku.messages import LogEntry
from kioku.profiles import Profile
from kioku.store import ConversationInfo
from kioku.tokens import TokenCounter

__all__ = ["TurnState"]


@dataclass(frozen=True)
class TurnState:
    info: ConversationInfo
    window: list[LogEntry]  # the raw window as read, newest last
    memory: Memory
    ready: list[MemoryItem]  # summaries written and waiting for their fold
    profile: Profile  # the engine's profile fitted to the conversation's card
    counter: TokenCounter
    lang: str

    @property
    def conversation_id(self) -> str:
        return self.info.id

    def before(self, entry: LogEntry) -> list[LogEntry]:
        """The raw window in front of `entry` as the prompt shows it (a message a client
        deleted keeps its seq with no content: nothing to show)."""
        return [e for e in self.window if e.seq < entry.seq and not e.message.is_empty()]
