"""kioku's conventions on top of the chat-completions protocol: its headers and its error object.

A client talks to kioku as to any OpenAI-compatible server, plus a few `X-Kioku-*` request
headers. Those are kioku's own, so kioku checks them: a misspelled header or a value kioku does
not know (`X-Kioku-Mode: banana`) is refused with 400 before anything is stored, never ignored
(an ignored header silently changes what is stored). Every header is listed here once, with
what it means; docs/service.md shows the same table and a test keeps the two in step.

Errors follow OpenAI's error object, so every client library reads them:
`{"error": {"message", "type", "param", "code"}}`, where `code` is a string or null and `param`
names the field or header at fault (`kioku.errors.error_body` writes it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from kioku.errors import BadParameter

PREFIX = "x-kioku-"


def header_text(value: str | None) -> str | None:
    """A header as its sender meant it: HTTP carries bytes, clients send UTF-8 (a Japanese
    conversation id), ASGI hands them over decoded as latin-1. A browser's fetch cannot send
    raw UTF-8, so the SillyTavern extension sends RFC 8187's `utf-8''` + percent-encoding."""
    if value is None:
        return None
    if value[:7].lower() == "utf-8''":
        return unquote(value[7:])
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


@dataclass(frozen=True)
class Header:
    name: str  # as the docs spell it
    meaning: str
    values: tuple[str, ...] = ()  # the values allowed (case-insensitive); empty: any text
    max_length: int = 200

    def check(self, value: str) -> None:
        text = header_text(value) or ""
        if not text.strip():
            raise BadParameter(f"the header {self.name} is empty; {self.meaning}", self.name)
        if len(text) > self.max_length:
            raise BadParameter(
                f"the header {self.name} is {len(text)} characters; at most "
                f"{self.max_length} are allowed",
                self.name,
            )
        if self.values and text.strip().lower() not in self.values:
            raise BadParameter(
                f"the header {self.name} is {value!r}; use one of: {', '.join(self.values)}",
                self.name,
            )


REQUEST_HEADERS: tuple[Header, ...] = (
    Header(
        "X-Kioku-Conversation",
        "names the conversation (percent-encoded or raw UTF-8; otherwise the `user` field does); "
        "any name: one a URL cannot carry is kept under the id the response header gives",
        max_length=1000,
    ),
    Header("X-Kioku-Character", "names the character when the conversation is created"),
    Header(
        "X-Kioku-Mode",
        "`stateful` (the request holds only new messages) or `stateless` (it holds the whole "
        "transcript); without it, a request with one message, or with only tool results, is "
        "stateful",
        values=("stateful", "stateless"),
    ),
    Header(
        "X-Kioku-Generation",
        "what the request asks for (the SillyTavern extension sends it): `normal` or "
        "`group_chat`, `swipe`, `regenerate` (the reply replaces the last one), `continue` (the "
        "reply extends it), `impersonate` or `quiet` (answered with memory, nothing stored); "
        "another word is a turn like `normal`. It also says the client names each chat itself",
        max_length=40,
    ),
    Header(
        "X-Kioku-User",
        "the name user messages are stored under (the user's persona); otherwise the name the "
        "conversation already uses, or `user`",
    ),
    Header(
        "X-Kioku-Volatile",
        "the request's leading system messages that change from turn to turn (their indices "
        "in `messages`, comma-separated: world info a keyword triggered, say): kioku sends them "
        "after the chat instead of in the card, where a change costs only themselves",
        max_length=400,
    ),
    Header(
        "X-Kioku-Examples",
        "`gradual` when the client pushes its example dialogue out as the chat grows: kioku "
        "keeps the examples the card had (`always`, `never`: as sent)",
        values=("gradual", "always", "never"),
    ),
    Header(
        "X-Kioku-Speakers",
        "a group chat's characters, as a JSON list of names (percent-encoded): an assistant "
        "message that starts with `Name: ` is stored as that character's",
        max_length=2000,
    ),
    Header(
        "X-Kioku-Parent",
        "a new conversation branched from this one (a SillyTavern branch or checkpoint): it "
        "starts with the parent's messages and memory up to where the two part",
    ),
    Header(
        "Idempotency-Key",
        "names the request (a UUID, say) so that sending it again gets the same reply for "
        "24 h, even after a crash; the same key with another body is refused (422)",
        max_length=255,
    ),
)

RESPONSE_HEADERS: tuple[Header, ...] = (
    Header("X-Kioku-Conversation", "the conversation's id, percent-encoded UTF-8"),
    Header("X-Kioku-Seq", "the seq of the stored message the reply answers"),
    Header("X-Kioku-Memory-Version", "bumps at every fold: the memory exchange changed"),
    Header("X-Kioku-Prompt-Tokens", "the prompt kioku built, in tokens as kioku counts them"),
    Header("X-Kioku-Regenerated", "on a swipe or regeneration: the seq of the reply replaced"),
    Header("X-Kioku-Continued", "on a continue: the seq of the reply the new text extends"),
    Header("X-Kioku-Stored", "`false` on a side request (quiet, impersonate): nothing was stored"),
    Header(
        "X-Kioku-Reply-Seq",
        "the seq of the stored reply (not on a stream: its headers leave before the reply)",
    ),
    Header(
        "X-Kioku-Replayed",
        "`true` on a reply another run of the same request got (a duplicate that waited for "
        "it, or a repeated Idempotency-Key)",
    ),
    Header(
        "X-Kioku-Upstream-Ms",
        "milliseconds the upstream took to answer (non-streamed responses only: a streamed "
        "response's headers leave before the upstream has finished)",
    ),
)

_KNOWN = {h.name.lower(): h for h in REQUEST_HEADERS}


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse unknown `X-Kioku-*` request headers and values kioku cannot act on."""
    for name, value in headers.items():
        key = name.lower()
        if not key.startswith(PREFIX):
            continue
        header = _KNOWN.get(key)
        if header is None:
            known = ", ".join(h.name for h in REQUEST_HEADERS)
            raise BadParameter(
                f"kioku has no request header {name!r}; its headers are {known}", name
            )
        header.check(value)


COMPLETIONS_REFUSED = (
    "kioku gives memory to chat conversations: /v1/completions takes a bare prompt with no "
    "messages to store, so kioku does not serve it (sending it through without memory would "
    "look like it works while nothing is remembered). Use /v1/chat/completions: in LlamaIndex "
    "set OpenAILike(is_chat_model=True), in LangChain use ChatOpenAI, not OpenAI."
)


def volatile_of(headers: Mapping[str, str]) -> frozenset[int]:
    """`X-Kioku-Volatile`: message indices, comma-separated."""
    header = "X-Kioku-Volatile"
    value = headers.get(header.lower())
    text = (header_text(value) or "").strip()
    if not text:
        return frozenset()
    try:
        found = frozenset(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BadParameter(
            f"the header {header} is {value!r}; send message indices, comma-separated (1,3)",
            header,
        ) from None
    if any(i < 0 for i in found):
        raise BadParameter(f"the header {header} has a negative index", header)
    return found


def speakers_of(headers: Mapping[str, str]) -> tuple[str, ...]:
    """`X-Kioku-Speakers`: a JSON list of names."""
    header = "X-Kioku-Speakers"
    value = headers.get(header.lower())
    text = (header_text(value) or "").strip()
    if not text:
        return ()
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadParameter(
            f"the header {header} is {value!r}; send a JSON list of names, percent-encoded",
            header,
        )
    return tuple(n.strip() for n in names if n.strip())
