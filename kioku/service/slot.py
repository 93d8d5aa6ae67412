"""A conversation's slot in one serving process: its turn lock here (the store's lock spans
processes), its cached `Conversation`, and what the proxy learned of its client so far. A slot
is kept per store key, never per name: a rename leaves it as it is, and the old name leads to
another key (`kioku.service.turns.Gate.enter`).

Its methods are its only writers (a test holds every other module to reading it): each says
what the turn learned or why the cache is stale, so a reader finds every change in one file."""

from __future__ import annotations

import asyncio

from kioku.engine import Conversation
from kioku.models import ChatMessage

__all__ = ["Slot"]


class Slot:
    """Per conversation in this process: its turn lock here and the cached `Conversation`."""

    __slots__ = (
        "_lock",
        "_conv",
        "_system",
        "_char",
        "_sent",
        "_user",
        "_transcripts",
        "_lone",
    )

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._conv: Conversation | None = None
        self._system: str | None = None
        self._char = ""
        self._sent: tuple[ChatMessage, ...] | None = None
        self._user: str | None = None
        self._transcripts: bool | None = None
        self._lone: str | None = None

    @property
    def lock(self) -> asyncio.Lock:
        """This process's turn lock (the store's lock spans processes)."""
        return self._lock

    @property
    def conv(self) -> Conversation | None:
        """The cached conversation, None until a turn opens it or after it went stale."""
        return self._conv

    @property
    def system(self) -> str | None:
        """The card (system prompt) the cached conversation was opened with."""
        return self._system

    @property
    def character(self) -> str:
        """The conversation's character, as stored when it was opened."""
        return self._char

    @property
    def last_prompt(self) -> tuple[ChatMessage, ...] | None:
        """The prompt the last turn sent upstream (for the prefix-reuse metric)."""
        return self._sent

    @property
    def user(self) -> str | None:
        """The name user messages are stored under (`generation.user_name`), None unread."""
        return self._user

    @property
    def transcripts(self) -> bool | None:
        """Whether its client sends whole transcripts (`generation.is_side`), None unread."""
        return self._transcripts

    @property
    def lone(self) -> str | None:
        """The last lone message taken for a connection test (`generation.refuse_a_switch`)."""
        return self._lone

    def clear(self) -> None:
        """Forget what was cached (the lock stays): a new conversation under this key, or the
        old one deleted."""
        self._conv = self._system = self._sent = self._user = None
        self._transcripts = self._lone = None
        self._char = ""

    def forget_log(self) -> None:
        """The log changed outside a turn (a sync, a forgotten message): the next turn reopens
        the conversation instead of trusting its cached view."""
        self._conv = None

    def forget_client(self) -> None:
        """Another process ran the last turn: what was read of the client may have changed."""
        self._transcripts = self._user = None

    def open(self, conv: Conversation, system: str | None) -> None:
        """The conversation a turn opened, with the card it was opened with."""
        self._conv = conv
        self._system = system
        self._char = conv.info().character

    def remember_prompt(self, messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        """Keep the prompt a turn sends upstream; the one before it is returned."""
        before, self._sent = self._sent, messages
        return before

    def learn_user(self, name: str) -> None:
        """The name its user messages are stored under."""
        self._user = name

    def learn_transcripts(self, sends: bool) -> None:
        """Whether its client sends whole transcripts."""
        self._transcripts = sends

    def note_lone(self, text: str | None) -> None:
        """A lone message taken for a connection test; None: a stored turn came between."""
        self._lone = text
