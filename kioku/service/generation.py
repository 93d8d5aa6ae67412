"""Generation types: which requests are turns of the conversation, and what each one stores.

A front end sends more than turns. SillyTavern asks for a new reply (normal), another version of
the last one (swipe, regenerate), more of the last one (continue), a reply written as the user
(impersonate), and side requests of its own and of its extensions (quiet: a summary, an image
prompt; its "Test Message" button sends a one-message chat). Storing them all as chat damages
the log: an impersonated text becomes the character's reply, "Hi" from Test Message becomes a
turn of a 2,000-message conversation. The kioku extension for SillyTavern names the type of
every request in the `X-Kioku-Generation` header:

| type | kioku |
|---|---|
| normal, group_chat | syncs the transcript, stores the reply as a new message |
| swipe, regenerate | syncs; the reply replaces the last reply to the same message |
| continue | syncs; the reply extends the last reply (no new turn) |
| impersonate, quiet | answered with memory (card, memory, raw window, then the request's own new part); nothing is stored, not even a new conversation |
| any other word | a turn, as normal (SillyTavern and its extensions add types) |

A one-message request without a card (SillyTavern's Test Message) is answered as sent, without
the conversation's memory: it only checks that the connection works.

Without the header, a request with one message and no card, to a conversation whose client
sends whole transcripts, is taken for a side request too (SillyTavern's Test Message): such a
client never sends a turn that way. `X-Kioku-Mode: stateful` stores it anyway. A client that
switched to single messages would lose every turn so, silently: a lone message with another text
right after one taken for a Test Message is refused with 409 (`refuse_a_switch`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

from kioku import chat_messages
from kioku.client_parts import place
from kioku.context import Account, Prompt
from kioku.engine import Conversation
from kioku.errors import BadParameter, ModeUnclear, NotFound, SyncConflict
from kioku.messages import LogEntry
from kioku.models import ChatMessage, Completion
from kioku.revisions import Change
from kioku.sync import Incoming, diff, log_tail, to_message

if TYPE_CHECKING:
    from kioku.service.chat_request import Split
    from kioku.service.slot import Slot

GENERATION_HEADER = "x-kioku-generation"
USER_HEADER = "x-kioku-user"
# a store counter, raised once per process and conversation: its client sends transcripts
TRANSCRIPT_CLIENT = "transcript_client"


class Generation(StrEnum):
    NORMAL = "normal"
    SWIPE = "swipe"
    REGENERATE = "regenerate"
    CONTINUE = "continue"
    IMPERSONATE = "impersonate"
    QUIET = "quiet"


SIDE = frozenset({Generation.QUIET, Generation.IMPERSONATE})
# SillyTavern's name for a group member's turn, which is a normal turn of the group's chat
ALIASES = {"group_chat": Generation.NORMAL}
_WORD = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")


def generation_of(value: str | None) -> Generation | None:
    """The header's value; None when absent (a client without the extension). A type kioku
    does not know (SillyTavern adds some, extensions name their own) is a turn like `normal`:
    its reply is stored, and the next transcript corrects the log if the client did not keep
    it. A value that is not one word is refused."""
    if value is None or not value.strip():
        return None
    word = value.strip().lower()
    if not _WORD.fullmatch(word):
        raise BadParameter(
            f"X-Kioku-Generation {value!r} is not a generation type: send one word, such as "
            "normal, group_chat, swipe, regenerate, continue, impersonate or quiet",
            "X-Kioku-Generation",
        )
    try:
        return Generation(word)
    except ValueError:
        return ALIASES.get(word, Generation.NORMAL)


def is_side(
    generation: Generation | None,
    split: Split,
    stateful: bool | None,
    transcripts: bool,
) -> bool:
    """Whether a request is answered without storing anything (see the module docstring).
    `transcripts`: the conversation's client is known to send whole transcripts."""
    if generation in SIDE:
        return True
    return (
        generation in (None, Generation.NORMAL)
        and stateful is None
        and transcripts
        and split.system is None
        and len(split.chat) == 1
    )


def refuse_a_switch(slot: Slot, split: Split) -> None:
    """A lone message taken for a connection test (`is_side`): one is answered, and the same
    text again (Test Message pressed twice); another text right after it says the client now
    sends its turns one message at a time, and every one would be lost: `ModeUnclear` (409,
    nothing stored) says which header to send. A stored turn in between starts over."""
    text = split.chat[0].text
    if slot.lone is not None and slot.lone != text:
        raise ModeUnclear(
            "this conversation's client sent whole transcripts, so a lone message without a "
            "system prompt is taken for a connection test (SillyTavern's Test Message) and not "
            "stored; the last one was not stored either. To send one message at a time and "
            "let kioku keep the history, send the header X-Kioku-Mode: stateful (then send "
            "your last message again); to send the whole chat, send it with its system prompt; "
            "for a request that stores nothing, X-Kioku-Generation: quiet"
        )
    slot.note_lone(text)


def sends_transcripts(conv: Conversation, slot: Slot) -> bool:
    """Whether this conversation's client sends whole transcripts (read once per process)."""
    if slot.transcripts is None:
        slot.learn_transcripts(conv.store.counters(conv.id).get(TRANSCRIPT_CLIENT, 0) > 0)
    return bool(slot.transcripts)


def note_transcript(conv: Conversation, slot: Slot) -> None:
    """Remember that the client sent a transcript (one write per process and conversation)."""
    if not slot.transcripts:
        conv.store.incr(conv.id, TRANSCRIPT_CLIENT)
        slot.learn_transcripts(True)


def user_name(conv: Conversation, slot: Slot, given: str | None) -> str:
    """The name user messages are stored under: the one the client gives (the extension sends
    the persona's name), else the one the conversation already uses (an imported chat keeps
    its user's name), else "user" (`kioku.sync.to_message`)."""
    if given:
        slot.learn_user(given)
    elif slot.user is None:
        last = conv.store.tail(conv.id, 1, role="user")
        slot.learn_user(last[0].message.author if last else "")
    return slot.user or ""


# side requests --------------------------------------------------------------------------------


def side_prompt(conv: Conversation, split: Split, character: str) -> tuple[Prompt, LogEntry]:
    """The prompt for a side request, and the entry it answers: the conversation's memory and
    raw window up to what the request shows, then the request's own new messages. Reads only.
    A conversation that does not exist (or a transcript of another chat) gets the request's
    messages as they are."""
    if len(split.chat) == 1 and split.system is None:
        # SillyTavern's Test Message ("Hi", nothing else): a check that the connection answers,
        # which the conversation's memory would only make slow on a local model
        return as_sent(split), _entry(0, split.chat[-1], character)
    try:
        info = conv.info()
    except NotFound:
        return as_sent(split), _entry(0, split.chat[-1], character)
    if len(split.chat) == 1:
        new: Sequence[Incoming] = split.chat
        turn = None
    else:
        try:
            plan = diff(log_tail(conv, 2 * len(split.chat) + 16), split.chat, named=True)
        except SyncConflict:
            return as_sent(split), _entry(info.next_seq, split.chat[-1], character)
        new, turn = plan.appends, plan.turn
    window = conv.raw_window(info)
    if new:
        extra = [_entry(info.next_seq + k, m, character) for k, m in enumerate(new)]
        entry = extra[-1]
        window = [*window, *extra[:-1]]
    else:
        assert turn is not None  # diff names the turn when nothing is new
        entry = conv.store.entries(conv.id, turn, turn)[0]
    if split.system is not None:
        info = dataclasses.replace(info, system_prompt=split.system)
    prompt = conv.prompt_for(
        entry, info=info, window=window, memory=conv.memory(), client=split.parts
    )
    return prompt, entry


def _entry(seq: int, m: Incoming, character: str) -> LogEntry:
    message = to_message(m, character)
    return LogEntry(seq, message, 0)


def as_sent(split: Split) -> Prompt:
    """The request's own messages, for a side request kioku has no memory for."""
    messages = [ChatMessage("system", split.system)] if split.system is not None else []
    messages += place([chat_messages.chat_message(to_message(m)) for m in split.chat], split.parts)
    account = Account(parts={}, reserve=0, window=0, raw_messages=len(split.chat) - 1)
    return Prompt(messages=tuple(messages), account=account)


# continue -------------------------------------------------------------------------------------


def join_continuation(text: str, more: str) -> str:
    """The last reply with its continuation, joined as SillyTavern joins them (a space unless
    one side already has whitespace; a client's other choice reads the same in normal form)."""
    if not more:
        return text
    if not text or text[-1].isspace() or more[0].isspace():
        return text + more
    return f"{text} {more}"


def continued(conv: Conversation, seq: int, reply: Completion) -> LogEntry:
    """A continue: the stored reply `seq` grows by the new text (the old text is kept as a
    version, like an edit), and by the tools the continuation calls. A cut continuation is
    marked as `Conversation.record` marks one."""
    [old] = conv.store.entries(conv.id, seq, seq)
    grown = dataclasses.replace(reply, text=join_continuation(old.text, reply.text))
    message = chat_messages.reply_message(grown, author=old.message.author)
    meta = {"finish_reason": "length"} if reply.truncated else None
    done = conv.revise([Change(seq, message, "continue", meta)])
    conv.store.incr(conv.id, "continuations")
    if reply.truncated:
        conv.store.incr(conv.id, "truncated_replies")
    return done.entries[0]
