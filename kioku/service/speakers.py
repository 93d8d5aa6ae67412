"""Group chats: who said each line, when several characters share one conversation.

In a SillyTavern group chat every member replies in the same chat, and SillyTavern writes each
character message as `Name: text` in the request (its default "character names" behaviour), so
the model can tell the members apart. The extension names the members
(`X-Kioku-Speakers`); kioku then stores each assistant message as its speaker's (the author the
chronicler, the notes and recall see) and keeps the text as sent, label included: the raw
window must go on telling the model who spoke. A reply kioku stores gets its speaker's label
too when the model left it out, which is how SillyTavern sends that reply back next turn.
"""

from __future__ import annotations

from collections.abc import Sequence


def speaker_of(text: str, speakers: Sequence[str]) -> str | None:
    """The member whose `Name:` label opens `text` (the longest name, so "Mika" never takes
    "Mika Rose"'s line), or None."""
    head = text.lstrip()
    found = [s for s in speakers if s and head.startswith(f"{s}:")]
    return max(found, key=len) if found else None


def labelled(text: str, name: str) -> str:
    """`text` as a group chat shows it: opening with `name: `."""
    if not name or text.lstrip().startswith(f"{name}:"):
        return text
    return f"{name}: {text}" if text else text
