"""What happened to a summary, in words: the compaction log's outcomes, the serve log's lines,
and the mark of a stand-in.

A chapter is written by the model, or an extractive stand-in holds its range because the model's
summary failed: the chronicler gave up on its replies (refused, cut at max_tokens, not in the
chronicler's format, not borne out by the messages), the model could not be reached (timed
out, down) when an operator cut, or the summaries were late when the prompt reached its
ceiling. Why is stored with the item (`data["fallback"]`), so the console and the SillyTavern
panel can say it; each event on the way has an outcome that reads as what it is, so neither the
serve log nor `kioku stats` calls a fallback "ok". No I/O here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from kioku.errors import ModelError, ModelTimeout, ModelUnavailable, UpstreamError
from kioku.generations import STAND_IN

# data key of an extractive item written because the model's summary failed:
# {"reason": one of REASONS, "detail": what the last rejection or error said}
FALLBACK = "fallback"

REASONS: Mapping[str, str] = {
    "refusal": "the model refused",
    "truncated": "the replies were cut at max_tokens (length)",
    "unparseable": "the replies were not in the chronicler's format",
    "ungrounded": "the replies' lines were not borne out by the messages they cite",
    "no_room": "the prompt alone fills the model's window",
    "timeout": "the model timed out",
    "upstream_down": "the model's server could not be reached",
    "model_error": "the model failed",
    "error": "the job failed",  # not the model: the database, a bug (see the log's traceback)
    "late": "the summaries were late at the prompt's ceiling",
}

# what each event of a summary's way (`Summary.events`) was, as its log row's outcome
_EVENT_OUTCOMES: Mapping[str, str] = {
    "fallback": "fell back",
    "refusal": "rejected",
    "truncated": "rejected",
    "unparseable": "rejected",
    "ungrounded": "rejected",
    "retry": "asked again",
    "compress": "asked to shorten",
    "no_room": "not sent",
    "salvaged": "kept its whole lines",
    "trimmed": "trimmed",
    "over_target": "over target",
    "tics_removed": "removed",
    "corrected": "corrected",
    "replaced": "replaced",
}


def event_outcome(event: str) -> str:
    """The outcome a summary event's log row says (an event with no word of its own: "ok")."""
    if event.startswith("dropped_"):
        return "dropped"
    return _EVENT_OUTCOMES.get(event, "ok")


def why(reason: str) -> str:
    """A reason code in words ("unparseable" → "the replies were not in the chronicler's
    format"); an unknown code as it is."""
    return REASONS.get(reason, reason)


def reason_of(error: BaseException) -> str:
    """The reason code of a model error: a timeout, a server that is down, or another failure
    of the model; "error" for anything else (the database, a bug)."""
    if isinstance(error, ModelTimeout):
        return "timeout"
    if isinstance(error, UpstreamError):
        return "timeout" if error.status == 504 else "upstream_down"
    if isinstance(error, ModelUnavailable):
        return "upstream_down"
    return "model_error" if isinstance(error, ModelError) else "error"


# the model errors a failed job records ("ModelTimeout: …", `Worker._failed`), by reason
_ERROR_REASONS: Mapping[str, str] = {
    "ModelTimeout": "timeout",
    "ModelUnavailable": "upstream_down",
    "UpstreamError": "upstream_down",
    "ModelError": "model_error",
}


def reason_of_failure(error: str) -> str | None:
    """The reason code of a job's recorded error, when a model error caused it."""
    return _ERROR_REASONS.get(error.split(":", 1)[0].strip())


def fallback_data(reason: str, detail: str = "") -> dict[str, str]:
    """What a stand-in stores under `data["fallback"]`."""
    return {"reason": reason, "detail": detail[:500]}


def stand_in(data: Mapping[str, Any] | None) -> str | None:
    """Why an item is an extractive stand-in for the model's summary, in words; None for an
    item the model wrote, or one extractive by choice (no chronicler model configured)."""
    if not isinstance(data, Mapping):
        return None
    fb = data.get(FALLBACK)
    if isinstance(fb, Mapping) and fb.get("reason"):
        return why(str(fb["reason"]))
    if data.get(STAND_IN):
        return why("late")
    grounding = data.get("grounding")
    if isinstance(grounding, Mapping) and grounding.get("extractive"):
        return why("model_error")  # stored before the reason was: the model's summary failed
    return None


def dropped(events: Iterable[str], data: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Lines grounding dropped, by reason: from a summary's events ("dropped_name", …), or for
    a fallback, whose replies were all rejected, from the groundings of those replies."""
    counts = Counter(e.removeprefix("dropped_") for e in events if e.startswith("dropped_"))
    grounding = data.get("grounding") if isinstance(data, Mapping) else None
    if not counts and isinstance(grounding, Mapping) and grounding.get("extractive"):
        for attempt in grounding.get("attempts") or ():
            by_reason = attempt.get("dropped") if isinstance(attempt, Mapping) else None
            if isinstance(by_reason, Mapping):
                counts.update({str(k): int(v) for k, v in by_reason.items()})
    return dict(sorted(counts.items()))


def dropped_text(counts: Mapping[str, int]) -> str:
    """ "; grounding dropped 3 lines (name 2, author 1)", or "" when none was."""
    if not counts:
        return ""
    n = sum(counts.values())
    each = ", ".join(f"{k} {v}" for k, v in counts.items())
    return f"; grounding dropped {n} line{'s' if n != 1 else ''} ({each})"
