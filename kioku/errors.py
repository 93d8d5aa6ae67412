"""One exception tree for everything kioku raises on purpose.

    KiokuError
    ├── ConfigError            a profile, URL or option that cannot work; fix the configuration
    ├── InputError             bad input from a caller (empty message, unknown role); nothing was lost
    │   ├── MessageTooLarge    one message cannot fit the window even alone; it is stored anyway
    │   ├── BadParameter       one named header or field is wrong (`param` names it)
    │   └── SyncConflict       a client's transcript shares nothing with the log it names
    ├── NotFound               no such conversation / item (or it belongs to another tenant)
    ├── StoreError             the database refused; the transaction was rolled back
    ├── ContextOverflow        the prompt cannot be made to fit; raised instead of sending it
    └── ModelError             the chat model failed
        ├── ModelTimeout       no answer within the profile's timeout
        ├── ModelUnavailable   connection refused / 5xx after retries
        ├── TruncatedReply     finish_reason == "length"; carries the partial completion
        └── BadSummary         the summarizer's output failed a guard (refusal, unparseable, cut)

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
        where = f" (stored as seq {seq})" if seq is not None else ""
        super().__init__(
            f"message is {tokens} tokens but at most {limit} fit in the window beside the "
            f"response reserve{where}; split it or use a profile with a larger window"
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


class NotFound(KiokuError):
    pass


class StoreError(KiokuError):
    pass


class ContextOverflow(KiokuError):
    pass


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


class BadSummary(ModelError):
    def __init__(self, reason: str, text: str = "") -> None:
        self.reason = reason
        self.text = text
        super().__init__(f"summary rejected ({reason}); it was not stored and will be retried")
