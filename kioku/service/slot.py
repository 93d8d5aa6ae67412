"""A conversation's slot in one serving process: its turn lock here (the store's lock spans
processes), its cached `Conversation`, and what the proxy learned of its client so far. A slot
is kept per store key, never per name: a rename leaves it as it is, and the old name leads to
another key (`kioku.service.turns.Gate.enter`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kioku.engine import Conversation
from kioku.models import ChatMessage

__all__ = ["Slot"]


@dataclass
class Slot:
    """Per conversation in this process: its turn lock here and the cached `Conversation`."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conv: Conversation | None = None
    system: str | None = None
    character: str = ""
    last_prompt: tuple[ChatMessage, ...] | None = None
    user: str | None = None  # the name user messages are stored under (generation.user_name)
    transcripts: bool | None = None  # its client sends transcripts (generation.is_side)
    lone: str | None = None  # the last lone message taken for a connection test (generation)

    def clear(self) -> None:
        """Forget what was cached (the lock stays): a new conversation under this key."""
        self.conv = self.system = self.last_prompt = self.user = None
        self.transcripts = self.lone = None
        self.character = ""
