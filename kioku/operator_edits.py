"""An operator's edits of a memory item's lines, as values: the edits an item's data carries, and
the text they make of the text they edit.

`kioku.corrections` writes the edits (a revision of the item, through the store); memory's
rendering and the chronicler's input apply them with these functions, which need no store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["OPERATOR_EDITS", "Edit", "apply_edits", "edits_in"]

OPERATOR_EDITS = "operator_edits"

Edit = Mapping[str, Any]


def edits_in(data: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The operator's edits an item's data carries, oldest first."""
    return [dict(e) for e in (data or {}).get(OPERATOR_EDITS) or []]


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """`text` with each edit applied in order: the line it names is replaced or removed; a
    corrected line whose original is gone is kept at the end (the operator's edit wins)."""
    lines = text.split("\n")
    for e in edits:
        target = str(e["line"]).strip()
        at = next((i for i, ln in enumerate(lines) if ln.strip() == target), None)
        new = e.get("text")
        if at is None:
            if new:
                lines.append(str(new))
            continue
        if new is None:
            del lines[at]
        else:
            indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
            lines[at] = indent + str(new)
    return "\n".join(lines)
