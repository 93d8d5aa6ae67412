"""One exception tree for everything kioku raises on purpose.

    KiokuError
    ├── ConfigError            a profile, URL or option that cannot work; fix the configuration
    ├── InputError             bad input from a caller (empty message, unknown role); nothing was lost
    │   ├── MessageTooLarge    one message cannot fit the window even alone; refused, not stored
    │   ├── CardTooLarge       a system prompt that leaves no room for the minimum raw window
    │   ├── BadParameter       one named header or field is wrong (`param` names it)
    │   ├── SyncConflict       a client's transcript shares nothing with the log it names
    │   ├── NameTaken          a rename to a conversation id another conversation has (409)
    │   ├── ModeUnclear        lone messages to a transcript client's conversation (409)
    │   ├── RequestTooLarge    a body or a message list over the service's limits (413)
    │   ├── NotJSON            a body sent without a JSON content type (415)
    │   └── KeyReused          an Idempotency-Key sent again with a different request (422)
    ├── TurnInProgress         another turn of the conversation still runs (409); retry later
    ├── Unauthorized           no API key, or an unknown or revoked one (HTTP 401)
    ├── Forbidden              a key without the scope a request needs (HTTP 403)
    ├── NotFound               no such conversation / item (or it belongs to another tenant)
    ├── StoreError             the database refused; the transaction was rolled back
    │   ├── FoldRefused        a fold would break the coverage invariant; nothing was changed
    │   ├── NameMoved          a name went to another key while a request waited (taken again)
    │   └── LeaseLost          a worker finished a job another worker took over; not stored
    ├── ContextOverflow        the prompt cannot be made to fit; raised instead of sending it
    └── ModelError             the chat model failed
        ├── ModelTimeout       no answer within the profile's timeout
        ├── ModelUnavailable   connection refused / 5xx after retries
        ├── TruncatedReply     finish_reason == "length"; carries the partial completion
        ├── UpstreamError      the proxy's upstream failed; carries the HTTP status to answer
        ├── BadEvalReply       an evaluation prompt's reply stayed unusable after retries
        └── BadSummary         the summarizer's output failed a guard (refusal, unparseable, cut)
            ├── BadNotes       the notes extractor's reply could not be parsed strictly
            └── Ungrounded     most lines of a reply are not borne out by what they cite

Every message says what to do next.
"""

from __future__ import annotations

from typing import Any


class KiokuError(Exception):
    """Base of every error kioku raises on purpose."""


class ConfigError(KiokuError):
    pass


class InputError(KiokuError):
    pass


class MessageTooLarge(InputError):
    def __init__(self, tokens: int, limit: int, seq: int | None = None) -> None:
        self.tokens = tokens
        self.limit = limit
        self.seq = seq
        where = f" (stored as seq {seq})" if seq is not None else "; nothing was stored"
        super().__init__(
            f"message is {tokens} tokens but at most {limit} fit in the window beside the "
            f"response reserve{where}; split it or use a profile with a larger window"
        )


class CardTooLarge(InputError):
    """A system prompt (the character card) so large that the minimum raw window and a minimal
    memory no longer fit beside it: refused when the card is first seen, nothing stored."""

    def __init__(self, tokens: int, limit: int, profile: Any) -> None:
        self.tokens = tokens
        self.limit = limit
        super().__init__(
            f"the system prompt is {tokens} tokens but at most {limit} fit in profile "
            f"{profile.name} (window {profile.window}, response reserve "
            f"{profile.response_reserve}, minimum raw window {profile.min_raw}); shorten the "
            "card or use a profile with a larger window (--profile / --window)"
        )


class BadParameter(InputError):
    """One named part of a request is wrong: `param` names it (a header, a field), as in
    OpenAI's error object, and `code` says how."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class SyncConflict(InputError):
    """A stateless client sent a transcript that matches nothing in the conversation's log
    (another chat under the same conversation id?); nothing was stored."""


class NameTaken(InputError):
    pass


class ModeUnclear(InputError):
    """A client that sent whole transcripts now sends lone messages: kioku cannot tell its turns
    from connection tests, so it stores nothing and says which header decides (409)."""


class Unauthorized(KiokuError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Forbidden(KiokuError):
    """The key is good but may not do this (its scopes); nothing was done."""


class NotFound(KiokuError):
    pass


class StoreError(KiokuError):
    pass


class FoldRefused(StoreError):
    """A fold would have broken the coverage invariant; nothing was changed."""


class NameMoved(StoreError):
    """A conversation's name now belongs to another key than the one whose turn lock a request
    took (a rename or a first turn elsewhere came first): the service takes that key's turn
    instead; nothing was stored."""


class LeaseLost(StoreError):
    """A worker finished a job after its lease expired and another worker took it over."""


class ContextOverflow(KiokuError):
    """A prompt that cannot be made to fit: raised instead of sending it. `excess` says by how
    many tokens (0 when unknown); `cause` what is too large: the raw window (`"raw"`, which a
    fold makes room in), or kioku's own `"memory"` or the `"system"` prompt, which no message of
    the user's can be blamed for."""

    def __init__(self, message: str, excess: int = 0, cause: str = "raw") -> None:
        super().__init__(message)
        self.excess = excess
        self.cause = cause


class ModelError(KiokuError):
    pass


class ModelTimeout(ModelError):
    pass


class ModelUnavailable(ModelError):
    pass


class TruncatedReply(ModelError):
    """The model stopped at max_tokens: the text is incomplete and must not pass as a reply."""

    def __init__(self, completion: Any) -> None:
        self.completion = completion
        super().__init__(
            "the model stopped at max_tokens (finish_reason == 'length'); the reply is cut "
            "mid-sentence: raise the response reserve or shorten the prompt"
        )


class UpstreamError(ModelError):
    """The upstream failed; `status` is what kioku answers (502, 504, or the upstream's own
    4xx when the request itself was refused, with the upstream's `code` and `param`)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "upstream_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code if code is not None else UPSTREAM_CODES.get(kind)
        self.param = param
        # a refusal for size: what the server said (`kioku.service.oversize.Oversize`)
        self.oversize: Any = None

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.code, self.param)


# the error object's `code` for each kind of upstream failure kioku names itself
UPSTREAM_CODES = {
    "upstream_error": "upstream_error",
    "upstream_unavailable": "upstream_unavailable",
    "upstream_timeout": "upstream_timeout",
    "rate_limit_error": "rate_limit_exceeded",
}


def error_body(
    message: str, kind: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object, as kioku's service answers every error: `type` is the category,
    `code` a string (or null), `param` the field or header at fault."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class BadEvalReply(ModelError):
    """A model's reply to an evaluation prompt stayed unusable after every retry."""

    def __init__(self, task: str, reason: str, text: str = "") -> None:
        self.task = task
        self.reason = reason
        self.text = text
        super().__init__(
            f"{task}: the model's reply was unusable after retries ({reason}); check that the "
            "model follows JSON instructions, or use a stronger one"
        )


class BadSummary(ModelError):
    def __init__(self, reason: str, text: str = "") -> None:
        self.reason = reason
        self.text = text
        super().__init__(f"summary rejected ({reason}); it was not stored and will be retried")


class BadNotes(BadSummary):
    """The extractor's reply could not be parsed strictly; nothing was stored."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(f"notes: {reason}", text)


class Ungrounded(BadSummary):
    """A reply whose lines are mostly not borne out by the messages they cite
    (`kioku.grounding`); `grounding` says which and why. Nothing of it was stored."""

    def __init__(self, why: str, text: str = "", grounding: Any = None) -> None:
        super().__init__(f"ungrounded: {why}", text)
        self.grounding = grounding


# the service's admission (issue 11) ---------------------------------------------------------


class RequestTooLarge(InputError):
    """A request over the service's size limits; refused before it was parsed or stored."""


class NotJSON(InputError):
    """A request body that does not say it is JSON."""


class KeyReused(InputError):
    """An Idempotency-Key that already named a different request; nothing was run."""


class TurnInProgress(KiokuError):
    """Another turn of the same conversation held it for longer than the service waits."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
