"""A real conversation replayed with summaries that never come: does every turn still answer?

The jam of issue 21: a summary job whose worker is gone (or hangs) holds its conversation, no
summary is ever written, and the ceiling's forced cuts pile stand-in chapters into memory. On
36c9307 memory then grew until it alone passed the window and every turn failed. Here a chapter
job is held by a worker elsewhere that never finishes and no worker runs at all, while the
conversation's user turns are replayed through `prepare` (its replies recorded as they were): a
turn that raises is a failed turn. Reported: failed turns, memory at its largest against its
share of the window, forced cuts and extractive synopses.

    kioku bench stuck --format locomo --conversation 7 --window 3072 --json
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kioku.datasets import load
from kioku.engine import Kioku
from kioku.errors import KiokuError
from kioku.messages import Message
from kioku.profiles import MEMORY_FRAME_TOKENS, get_profile
from kioku.store import Store


def run(
    data: Path | None,
    fmt: str | None,
    *,
    speaker: str | None = None,
    conversation: int = 0,
    profile: str = "local-8k",
    window: int | None = None,
) -> dict[str, Any]:
    transcript = load(data, fmt, speaker=speaker, conversation=conversation)
    prof = replace(get_profile(profile, window), summary_delay_s=0.0)
    kk = Kioku(Store.open("sqlite://"), profile=prof)
    conv = kk.conversation(
        "stuck",
        system_prompt=transcript.system_prompt or "You are a friend.",
        character=transcript.character,
    )
    # a chapter job taken by a worker on another host that never finishes: its lane is busy
    kk.store.enqueue_job(conv.id, "chapter", 0, 0, run_after=0)
    kk.store.claim_job("elsewhere:1:stuck", time.time(), 10**9)
    turns = failed = largest = 0
    first_error = None
    for m in transcript.messages:
        if m.role != "user":
            conv.record(Message.assistant(m.text, author=m.author or transcript.character))
            continue
        turns += 1
        try:
            prompt = conv.prepare(Message.user(m.text, author=m.author or "user", at=m.at))
        except KiokuError as e:
            failed += 1
            first_error = first_error or f"turn {turns}: {type(e).__name__}: {str(e)[:200]}"
            continue
        largest = max(largest, prompt.account.parts["memory"])
    p = kk.card_profile(conv.info().system_prompt)
    share = p.synopsis_tokens + p.major_gc + 2 * p.chapter_tokens + MEMORY_FRAME_TOKENS
    counters = kk.store.counters(conv.id)
    return {
        "data": {"format": fmt, "speaker": speaker, "conversation": conversation},
        "profile": p.name,
        "messages": len(transcript.messages),
        "user_turns": turns,
        "failed_turns": failed,
        "first_error": first_error,
        "memory_tokens_max": largest,
        "memory_share_tokens": share,
        "forced_cuts": counters.get("forced_cuts", 0),
        "stand_in_synopses": counters.get("stand_in_synopses", 0),
    }
