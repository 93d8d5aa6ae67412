"""A conversation's slot in one serving process: its turn lock here (the store's lock spans
processes), its cached `Conversation`, and what the proxy learned of its client so far."""

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
