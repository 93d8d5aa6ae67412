"""Where a sentence ends, in the languages kioku reads: after a full stop, question or
exclamation mark (ASCII or full-width), with the space that follows it.

Grounding splits a line and its sources by it, and recall splits a message by it; it lives
here so neither reaches into the other. Memory's lines and the count of how often the
conversation says each one (`kioku.worth`) split by `split_sentences`, so both cut alike.
"""

from __future__ import annotations

import re

SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
_SPLIT = re.compile(r"(?<=[。！？])|(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """A text's sentences (two characters or more), line by line."""
    out = []
    for line in text.splitlines():
        for piece in _SPLIT.split(line):
            sent = piece.strip()
            if len(sent) >= 2:
                out.append(sent)
    return out
