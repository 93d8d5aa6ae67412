"""kioku (記憶): long-term memory for one LLM conversation far longer than the model's window."""

from kioku.engine import Conversation, Kioku, Reply
from kioku.errors import KiokuError
from kioku.messages import LogEntry, Message, Part
from kioku.profiles import CLOUD_1M, LOCAL_8K, LOCAL_64K, Profile, get_profile
from kioku.store import Store

__version__ = "0.1.0"

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
