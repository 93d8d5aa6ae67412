"""Importing a conversation that happened elsewhere, as if it had happened live.

A file is replayed turn by turn through the engine (user messages through `prepare`, replies
through `record`, the worker run between turns) so the imported conversation ends with the same
memory it would have had — chapters, major GCs and all — not one giant backlog.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress

from kioku.datasets import Transcript, load
from kioku.errors import InputError
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


def replay(
    kk: Kioku, conversation_id: str, transcript: Transcript, progress: bool = True
) -> dict[str, Any]:
    conv = kk.conversation(
        conversation_id,
        system_prompt=transcript.system_prompt or None,
        character=transcript.character,
    )
    before = conv.info().next_seq
    plan = turns(transcript.messages)
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
            kk.worker.run_until_idle(conversation_id, ahead_s=kk.profile.summary_delay_s)
            bar.advance(task)
    info = conv.info()
    return {
        "conversation": conversation_id,
        "imported": info.next_seq - before,
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
    progress: bool = True,
) -> dict[str, Any]:
    transcript = read(path, fmt, speaker=speaker, index=index)
    cid = conversation_id or Path(path).stem
    return replay(kk, cid, transcript, progress=progress)
