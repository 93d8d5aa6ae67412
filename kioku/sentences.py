"""Where a sentence ends, in the languages kioku reads: after a full stop, question or
exclamation mark (ASCII or full-width), with the space that follows it.

Grounding splits a line and its sources by it, and recall splits a message by it; it lives
here so neither reaches into the other.
"""

from __future__ import annotations

import re

SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
