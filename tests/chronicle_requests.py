"""What a scripted chronicler double reads from a request: the chapter transcript carries no
message numbers (a 1.5B model filled them in line by line), so a double that cites messages,
as a real model could only guess at, learns them from `ChatRequest.seqs`."""

from __future__ import annotations

from kioku.models import ChatRequest


def span(request: ChatRequest) -> tuple[int, int]:
    """The first and last message the request shows."""
    assert request.seqs, "not a chronicler request over messages"
    return request.seqs[0], request.seqs[-1]


def numbered(request: ChatRequest) -> str:
    """The request's last message with each transcript header given its "#seq · " back (a
    header is a line of the transcript that is not a part's indented line), in the form older
    prompts showed."""
    text = request.messages[-1].content
    lines = text.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Messages")) + 1
    seqs = iter(request.seqs)
    out = lines[:start]
    fresh = True  # a header follows the section's title or a blank line
    for i, ln in enumerate(lines[start:], start):
        if ln.startswith("Now list"):
            out += lines[i:]
            break
        if fresh and ln and not ln.startswith(" "):
            ln = f"#{next(seqs)} · {ln}"
        fresh = ln == ""
        out.append(ln)
    return "\n".join(out)
