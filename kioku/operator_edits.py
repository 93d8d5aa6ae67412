"""An operator's edits of a memory item's lines, as values: the edits an item's data carries, and
the text they make of the text they edit.

`kioku.corrections` writes the edits (a revision of the item, through the store); memory's
rendering and the chronicler's input apply them with these functions, which need no store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["OPERATOR_EDITS", "Edit", "apply_edits", "edits_in"]

OPERATOR_EDITS = "operator_edits"

Edit = Mapping[str, Any]


def edits_in(data: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The operator's edits an item's data carries, oldest first."""
    return [dict(e) for e in (data or {}).get(OPERATOR_EDITS) or []]


# where a line says it came from: "- #12 ", "[12] ", or nothing on a message's further line
_FROM = re.compile(r"^(?:- )?(?:#\d+ |\[\d+\] )?")


def _said(line: str) -> str:
    return _FROM.sub("", line.strip(), count=1)


def _find(lines: Sequence[str], target: str) -> int | None:
    """The line an edit names: the same line, or else the same words under another way of
    saying where they came from (memory once showed a message's further lines with the seq)."""
    at = next((i for i, ln in enumerate(lines) if ln.strip() == target), None)
    if at is None and (said := _said(target)):
        at = next((i for i, ln in enumerate(lines) if _said(ln) == said), None)
    return at


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """`text` with each edit applied in order: the line it names is replaced or removed; a
    corrected line whose original is gone is kept at the end (the operator's edit wins)."""
    lines = text.split("\n")
    for e in edits:
        at = _find(lines, str(e["line"]).strip())
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
