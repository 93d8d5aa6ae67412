"""Importing a conversation that happened elsewhere, as if it had happened live.

A file is replayed turn by turn through the engine (user messages through `prepare`, replies
through `record`, the worker run between turns) so the imported conversation ends with the same
memory it would have had — chapters, major GCs and all — not one giant backlog.

An import cannot damage a conversation: into one that already has messages it writes only with
`append` (and then only what the conversation does not already end with), and a file whose
messages the conversation already starts with changes nothing, so importing the same file twice
is harmless. Messages keep their times and authors as the file gives them; a SillyTavern chat
imported under its chat id (the file name) and tenant is the conversation the kioku extension
continues.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress

from kioku.datasets import Transcript, load
from kioku.errors import InputError, NotFound
from kioku.messages import Message

if TYPE_CHECKING:  # reading a file needs no engine: a bad file fails before one is built
    from kioku.engine import Kioku


def turns(messages: tuple[Message, ...]) -> list[tuple[list[Message], list[Message]]]:
    """User messages with the replies that follow them; replies that open the file count as a
    turn with no user message."""
    out: list[tuple[list[Message], list[Message]]] = []
    users: list[Message] = []
    replies: list[Message] = []
    for m in messages:
        if m.role == "user":
            if replies:
                out.append((users, replies))
                users, replies = [], []
            users.append(m)
        else:
            replies.append(m)
    if users or replies:
        out.append((users, replies))
    return out


def keys(messages: Sequence[Message]) -> list[str]:
    """What makes two messages the same message (as when a client's transcript is synced)."""
    from kioku.sync import line_key  # here: reading a file opens no database stack

    return [line_key(m.role, m.text) for m in messages]


def overlap(log: Sequence[str], file: Sequence[str]) -> int:
    """How many of the file's first messages the log already ends with."""
    for k in range(min(len(log), len(file)), 0, -1):
        if list(log[len(log) - k :]) == list(file[:k]):
            return k
    return 0


def already_there(log: Sequence[str], file: Sequence[str]) -> bool:
    """The conversation starts with the whole file: it was imported before."""
    return len(file) <= len(log) and list(log[: len(file)]) == list(file)


def replay(
    kk: Kioku,
    conversation_id: str,
    transcript: Transcript,
    progress: bool = True,
    *,
    skip: int = 0,
) -> dict[str, Any]:
    """Replay the transcript's messages after the first `skip`."""
    conv = kk.conversation(
        conversation_id,
        system_prompt=transcript.system_prompt or None,
        character=transcript.character,
    )
    before = conv.info().next_seq
    plan = turns(transcript.messages[skip:])
    # the dataset's own labels (a dialogue id, a session) travel with each message
    meta = {
        id(m): dict(md) for m, md in zip(transcript.messages, transcript.meta, strict=False) if md
    }
    # progress on stderr: stdout holds the result (JSON with --json)
    with Progress(transient=True, disable=not progress, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"importing {conversation_id}", total=len(plan))
        for users, replies in plan:
            for m in users[:-1]:
                conv.append(m, meta.get(id(m)))
            if users:
                conv.prepare_for(conv.append(users[-1], meta.get(id(users[-1]))))
            for r in replies:
                conv.append(r, meta.get(id(r)))
            kk.worker.run_until_idle(conv.id, ahead_s=kk.profile.summary_delay_s)
            bar.advance(task)
    info = conv.info()
    return {
        "conversation": conversation_id,
        "tenant": kk.tenant,
        "imported": info.next_seq - before,
        "already_there": skip,
        "messages": info.next_seq,
        "raw_start": info.raw_start,
        "memory_version": info.memory_version,
        "counters": kk.store.counters(conversation_id),
    }


def read(
    path: Path | str, fmt: str | None, *, speaker: str | None = None, index: int = 0
) -> Transcript:
    """The conversation to import (the format sniffed when `fmt` is None): read and checked
    before any database is opened, so a bad file leaves nothing behind."""
    transcript = load(path, fmt, speaker=speaker, conversation=index)
    if not transcript.messages:
        raise InputError(f"{path}: no messages to import")
    return transcript


def import_transcript(
    kk: Kioku,
    path: Path | str,
    fmt: str | None,
    *,
    conversation_id: str | None = None,
    speaker: str | None = None,
    index: int = 0,
    append: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Import a file into the conversation `conversation_id` (default: the file's name, which
    for SillyTavern is the chat id its extension sends) of `kk`'s tenant."""
    transcript = read(path, fmt, speaker=speaker, index=index)
    cid = conversation_id or Path(path).stem
    return import_into(kk, cid, transcript, append=append, progress=progress)


def import_into(
    kk: Kioku,
    conversation_id: str,
    transcript: Transcript,
    *,
    append: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay a file's conversation into `conversation_id`, unless that would damage it: a
    conversation that already holds the file is left as it is, and one that holds something
    else is written to only with `append` (see the module docstring)."""
    cid = conversation_id
    try:
        existing = kk.store.find_conversation(kk.tenant, cid)
    except NotFound:
        existing = None
    skip = 0
    if existing is not None and existing.next_seq:
        log = keys([e.message for e in kk.store.entries(existing.id)])
        file = keys(transcript.messages)
        if already_there(log, file):
            skip = len(transcript.messages)
        elif append:
            skip = overlap(log, file)
        else:
            more = len(file) - len(log) if file[: len(log)] == log else None
            hint = (
                f"the file continues it with {more} new message(s): pass --append to add them"
                if more
                else "pass --append to add the file's messages after them, or --conversation "
                "NEW_ID to import it as a conversation of its own"
            )
            raise InputError(
                f"conversation {cid!r} already has {existing.next_seq} messages and the file "
                f"is not a part of it; nothing was imported: {hint}"
            )
    return replay(kk, cid, transcript, progress=progress, skip=skip)
