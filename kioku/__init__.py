"""kioku (記憶): long-term memory for one LLM conversation far longer than the model's window.

The names below are imported on first use, not with the package: `kioku --help` and a command
that fails on bad input never load the database or HTTP stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kioku.engine import Conversation, Kioku, Reply
    from kioku.errors import KiokuError
    from kioku.messages import LogEntry, Message, Part
    from kioku.profiles import CLOUD_1M, LOCAL_8K, LOCAL_64K, Profile, get_profile
    from kioku.store import Store

# the one version: pyproject.toml reads it, and the SillyTavern extension's manifest.json (both
# copies) must say the same (tests/test_cli_small.py)
__version__ = "0.2.0"

_WHERE = {
    "Conversation": "kioku.engine",
    "Kioku": "kioku.engine",
    "Reply": "kioku.engine",
    "KiokuError": "kioku.errors",
    "LogEntry": "kioku.messages",
    "Message": "kioku.messages",
    "Part": "kioku.messages",
    "CLOUD_1M": "kioku.profiles",
    "LOCAL_8K": "kioku.profiles",
    "LOCAL_64K": "kioku.profiles",
    "Profile": "kioku.profiles",
    "get_profile": "kioku.profiles",
    "Store": "kioku.store",
}

__all__ = [
    "CLOUD_1M",
    "LOCAL_8K",
    "LOCAL_64K",
    "Conversation",
    "Kioku",
    "KiokuError",
    "LogEntry",
    "Message",
    "Part",
    "Profile",
    "Reply",
    "Store",
    "get_profile",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kioku' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
