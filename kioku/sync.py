"""Syncing a stateless client's transcript with the log.

Most chat apps (SillyTavern, the openai SDK used naively) send the whole visible transcript at
every turn, and let the user edit, delete, regenerate or swipe any message in it. The log keeps
one row per seq forever, so each request is compared with the log's tail by content hash:

- `diff(log, incoming) -> SyncPlan` is pure: which rows changed (edits, deletions), what is new
  (appends), which stored message the reply answers, and whether the reply replaces the last
  one (a regeneration or a swipe). The client's window may start anywhere in the log (it drops
  old messages to fit its context): messages before the first match are out of its window,
  never deletions.
- `apply(conv, plan)` stores it: changes through `Conversation.revise` (versions kept, memory
  over a changed range marked stale and re-summarized), new messages through
  `Conversation.append`.

A stateful client sends only its new messages (one user message, or the results of the tools
the last reply called); `diff_new` appends them (a retried request whose messages are already
the last, unanswered ones is not stored twice).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from kioku.align import opcodes
from kioku.cast import user_author
from kioku.chat_messages import message_tokens, reply_message
from kioku.dates import received
from kioku.errors import InputError, NotFound, SyncConflict
from kioku.fit import refuse_if_never_fits
from kioku.messages import LogEntry, Message, Part, Role
from kioku.models import Completion
from kioku.normal_form import normal_form
from kioku.revisions import Change

if TYPE_CHECKING:
    from kioku.engine import Conversation

# how far back the log is compared: the client's window plus room for messages it deleted
TAIL_SLACK = 16


def line_key(role: str, text: str) -> str:
    """A message's identity for syncing: role and text in its normal form (a client's clean-up
    of speaker labels and whitespace is not an edit: `kioku.normal_form`)."""
    return hashlib.sha256(f"{role}\0{normal_form(text)}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Incoming:
    role: Role
    text: str  # for protocol parts (tool calls, images): `render_parts(parts)`
    name: str = ""
    parts: tuple[Part, ...] = ()  # empty: one text part
    at: datetime | None = None  # the client's date for it (SillyTavern's send_date), if any

    @property
    def key(self) -> str:
        return line_key(self.role, self.text)


@dataclass(frozen=True)
class Logged:
    seq: int
    role: str
    key: str


@dataclass(frozen=True)
class Edit:
    seq: int
    message: Incoming


@dataclass(frozen=True)
class SyncPlan:
    edits: tuple[Edit, ...] = ()
    deletes: tuple[int, ...] = ()
    appends: tuple[Incoming, ...] = ()
    turn: int | None = None  # the stored message the reply answers, when nothing is appended
    regenerate: int | None = None  # the stored reply the new one replaces (regenerate / swipe)
    ignored: int = 0  # leading messages older than anything in the log: not stored

    @property
    def changes(self) -> int:
        return len(self.edits) + len(self.deletes)


def diff_one(log: Sequence[Logged], message: Incoming) -> SyncPlan:
    """A stateful client's turn: append the message, unless it is a retry of the last one."""
    return diff_new(log, (message,))


def diff_new(log: Sequence[Logged], messages: Sequence[Incoming]) -> SyncPlan:
    """A stateful client's turn: append its messages, unless they are the log's unanswered
    tail already (a retry)."""
    tail = log[-len(messages) :] if len(log) >= len(messages) else ()
    retry = (
        bool(tail)
        and messages[-1].role in ("user", "tool")
        and [(x.role, x.key) for x in tail] == [(m.role, m.key) for m in messages]
    )
    if retry:
        return SyncPlan(turn=tail[-1].seq)
    return SyncPlan(appends=tuple(messages))


def diff(log: Sequence[Logged], incoming: Sequence[Incoming], *, named: bool = False) -> SyncPlan:
    """Compare the log's tail (non-deleted rows, oldest first) with a client's transcript.

    The conflict guard refuses a plan that would change a stored message's role, and, unless a
    client that names each chat itself sent it (`named`), one that rewrites more stored messages
    than the transcript matches beyond the opening greeting: a second chat sent under the same
    conversation id shares the character's greeting and nothing else (`guard`)."""
    if not incoming:
        raise InputError("the request has no user or assistant message to answer")
    if not log:
        return SyncPlan(appends=tuple(incoming))
    ops = opcodes([x.key for x in log], [m.key for m in incoming])
    equal = [k for k, op in enumerate(ops) if op[0] == "equal"]
    if not equal:
        raise SyncConflict(
            "the transcript shares no message with this conversation's log: it looks like "
            f"another chat sent under the same conversation id. {NAME_EACH_CHAT}"
        )
    edits: list[Edit] = []
    deletes: list[int] = []
    appends: list[Incoming] = []
    mapped: dict[int, int] = {}  # incoming index -> seq
    regenerate: int | None = None
    ignored = 0

    def pair(i: int, j: int) -> None:
        if log[i].key != incoming[j].key:
            edits.append(Edit(log[i].seq, incoming[j]))
        mapped[j] = log[i].seq

    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            for t in range(i2 - i1):
                mapped[j1 + t] = log[i1 + t].seq
        elif k < equal[0]:
            # Before the first match: the client's window starts here. Log rows it does not
            # show are outside its window; the ones right before the match were edited.
            n = min(i2 - i1, j2 - j1)
            for t in range(n):
                pair(i2 - n + t, j2 - n + t)
            ignored += (j2 - j1) - n
        elif k > equal[-1]:
            # The end of the conversation: new messages, or a regenerated last reply. A row
            # takes the client's message at its place only while their roles agree; past that
            # the client deleted the rest (a reply deleted, then a new message written: not an
            # edit that turns the reply into the user's message).
            n = 0
            while n < min(i2 - i1, j2 - j1) and log[i1 + n].role == incoming[j1 + n].role:
                n += 1
            for t in range(n):
                pair(i1 + t, j1 + t)
            rest = log[i1 + n : i2]
            appends.extend(incoming[j1 + n : j2])
            if len(rest) == 1 and rest[0].role == "assistant" and j2 - j1 == n:
                regenerate = rest[0].seq
            else:
                deletes.extend(r.seq for r in rest)
        elif j2 - j1 > i2 - i1:
            # Messages inserted mid-history: seqs cannot move, so every row from here on takes
            # the content the client shows at its position, and the surplus is appended.
            n = min(len(log) - i1, len(incoming) - j1)
            for t in range(n):
                pair(i1 + t, j1 + t)
            deletes.extend(x.seq for x in log[i1 + n :])
            appends.extend(incoming[j1 + n :])
            break
        else:
            n = j2 - j1
            for t in range(n):
                pair(i1 + t, j1 + t)
            deletes.extend(x.seq for x in log[i1 + n : i2])
    matched = [log[i] for k in equal for i in range(ops[k][1], ops[k][2])]
    guard(log, matched, edits, deletes, named=named, appends=len(appends))
    turn = None if appends else mapped.get(len(incoming) - 1)
    return SyncPlan(
        edits=tuple(edits),
        deletes=tuple(deletes),
        appends=tuple(appends),
        turn=turn,
        regenerate=regenerate,
        ignored=ignored,
    )


NAME_EACH_CHAT = (
    "Nothing was stored. SillyTavern: install the kioku extension (integrations/sillytavern), "
    "which names each chat; other clients: send each chat with its own X-Kioku-Conversation "
    "header."
)


def opening(log: Sequence[Logged]) -> set[int]:
    """The seqs of the character's opening messages (the greeting before the first user
    message), when the log's tail reaches back to the conversation's start: every chat with
    the character starts with them, so matching them says nothing about which chat this is."""
    if not log or log[0].seq != 0:
        return set()
    out: set[int] = set()
    for x in log:
        if x.role == "user":
            break
        out.add(x.seq)
    return out


def guard(
    log: Sequence[Logged],
    matched: Sequence[Logged],
    edits: Sequence[Edit],
    deletes: Sequence[int],
    *,
    named: bool = False,
    appends: int = 0,
) -> None:
    """Refuse a plan that looks like another chat: decided by how much of the transcript
    matches the log, not by a count of changes (see `diff`)."""
    roles = {x.seq: x.role for x in log}
    for e in edits:
        if roles.get(e.seq, e.message.role) != e.message.role:
            raise SyncConflict(
                f"the transcript would turn stored message #{e.seq} from {roles[e.seq]} into "
                f"{e.message.role} (another chat sent under the same conversation id, or a "
                f"message inserted mid-history: seqs never move). {NAME_EACH_CHAT}"
            )
    changed = len(edits) + len(deletes)
    if not changed:
        return
    first = opening(log)
    shared = sum(1 for x in matched if x.seq not in first)
    if named:
        # a client that names each chat makes its own edits; but every stored message after
        # the greeting rewritten, and the chat going on past them, is another chat under this
        # id (a chat deleted and another given its name; a stale static header)
        if shared == 0 and first and appends:
            raise SyncConflict(
                f"the transcript shares only the opening greeting with this conversation and "
                f"would rewrite all {changed} stored message(s) after it, then go on: it is "
                "another chat under the same conversation id. Nothing was stored: send this "
                "chat under an id of its own (in SillyTavern, start a new chat or a branch)."
            )
        return
    if shared == 0 or changed > shared:
        beyond = " beyond the opening greeting" if first else ""
        raise SyncConflict(
            f"the transcript matches {shared} stored message(s){beyond} and would rewrite "
            f"{changed}: it looks like another chat sent under the same conversation id. "
            f"{NAME_EACH_CHAT}"
        )


# applying a plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synced:
    entry: LogEntry  # the stored message the reply answers
    plan: SyncPlan
    appended: tuple[int, ...] = ()
    stale: tuple[int, ...] = ()  # memory items an edit made stale


def log_tail(conv: Conversation, n: int) -> list[Logged]:
    """The newest `n` messages the client can see (deleted ones are not), oldest first."""
    return [
        Logged(seq, role, line_key(role, text))
        for seq, role, text in conv.store.visible_tail(conv.id, n)
    ]


def to_message(
    m: Incoming,
    character: str = "",
    user: str = "",
    now: datetime | None = None,
    cast: Sequence[str] = (),
) -> Message:
    """A client's message as stored: the author is the name the client gave it, else the
    conversation's user or character (`user` falls back to "user", as an import without names
    does), a user's never the character's (`user_author`); dated by the client when it said
    when, else when kioku received it (`now`)."""
    author = m.name or (
        (user or "user") if m.role == "user" else character if m.role == "assistant" else ""
    )
    if m.role == "user":
        author = user_author(author, character, cast)
    if m.parts:
        return Message(m.role, m.parts, author=author, at=m.at or now)
    return Message.of(m.role, m.text, author=author, at=m.at or now)


def sync(
    conv: Conversation,
    incoming: Sequence[Incoming],
    *,
    stateful: bool | None = None,
    character: str | None = None,
    blobs: Mapping[str, bytes] | None = None,
    user: str = "",
    named: bool = False,
    cast: Sequence[str] = (),
) -> Synced:
    """Bring the log in line with a request and store what is new. `stateful` None: a request
    with one message, or with only tool results, is a stateful client's turn (a transcript
    always holds the user message that led to the tool calls); a longer one a transcript.
    `blobs` holds the media parts the messages name; only those of stored messages are kept.
    `named`: the client names each chat itself (the SillyTavern extension), see `diff`.
    `cast`: a group chat's characters, whose names a user message is never stored under."""
    if not incoming:
        raise InputError("the request has no user or assistant message to answer")
    if stateful is None:
        stateful = len(incoming) == 1 or all(m.role == "tool" for m in incoming)
    if stateful:
        plan = diff_new(log_tail(conv, len(incoming)), incoming)
    else:
        plan = diff(log_tail(conv, 2 * len(incoming) + TAIL_SLACK), incoming, named=named)
    return apply(conv, plan, character, blobs, user, cast)


def apply(
    conv: Conversation,
    plan: SyncPlan,
    character: str | None = None,
    blobs: Mapping[str, bytes] | None = None,
    user: str = "",
    cast: Sequence[str] = (),
) -> Synced:
    """Store a plan (and the `blobs` its messages name). `character` names unnamed assistant
    messages (default: the conversation's character), `user` unnamed user messages (default:
    "user"). A message that can never fit the window refuses the whole plan before anything is
    stored."""
    store, k = conv.store, conv.kioku
    changed = [*plan.appends, *(e.message for e in plan.edits)]
    if character is None and any(m.role in ("user", "assistant") for m in changed):
        character = conv.info().character  # names unnamed replies; no user message takes it
    character = character or ""
    now = received(k.clock())
    new = [to_message(m, character, user, now, cast) for m in plan.appends]
    edited = [to_message(e.message, character, user, cast=cast) for e in plan.edits]
    tokens = [message_tokens(m, k.counter, k.profile.image_tokens) for m in new]
    refuse_if_never_fits(
        conv.message_limit(),
        [*tokens, *(message_tokens(m, k.counter, k.profile.image_tokens) for m in edited)],
    )
    if any(m.is_empty() for m in new):
        raise InputError("empty message: nothing to store (send some text)")
    if blobs:  # the media of what will be stored, before the rows that name them
        refs = {p.ref for m in changed for p in m.parts if p.ref in blobs}
        store.put_blobs({r: blobs[r] for r in refs if r is not None})
    stale: tuple[int, ...] = ()
    if plan.changes:
        stale = _revise(conv, plan, edited)
    appended = store.append_many(conv.id, list(zip(new, tokens, strict=True)))
    if appended:
        entry = appended[-1]
    elif plan.turn is not None:
        entry = store.entries(conv.id, plan.turn, plan.turn)[0]
    else:  # pragma: no cover - diff always names the turn when nothing is appended
        raise InputError("nothing to answer in this request")
    return Synced(entry, plan, tuple(e.seq for e in appended), stale)


def _revise(conv: Conversation, plan: SyncPlan, edited: Sequence[Message]) -> tuple[int, ...]:
    """A plan's edits and deletions, with their log line and counters, in one transaction."""
    store = conv.store
    with store.atomic():
        changes = [Change(e.seq, m) for e, m in zip(plan.edits, edited, strict=True)]
        changes += [Change(q, None, "delete") for q in plan.deletes]
        done = conv.revise(changes)
        stale = done.stale
        seqs = ", ".join(
            [f"#{e.seq} edited" for e in plan.edits] + [f"#{q} deleted" for q in plan.deletes]
        )
        store.log(
            conv.id,
            "sync",
            "changed",
            first_seq=min(c.seq for c in changes),
            last_seq=max(c.seq for c in changes),
            detail=seqs + (f"; stale items {list(stale)}" if stale else ""),
        )
        if plan.edits:
            store.incr(conv.id, "edits", len(plan.edits))
        if plan.deletes:
            store.incr(conv.id, "deletions", len(plan.deletes))
        if stale:
            store.incr(conv.id, "stale_items", len(stale))
    return stale


@dataclass(frozen=True)
class Forgotten:
    seq: int
    deleted: bool  # False: it was deleted already
    stale: tuple[int, ...] = ()  # memory items over it, now written again
    retracted: tuple[int, ...] = ()  # notes ledger entries retracting its notes


def forget(conv: Conversation, seq: int) -> Forgotten:
    """Delete one stored message, as a client's sync deletes it (`kioku forget`, `DELETE
    /v1/conversations/{id}/messages/{seq}`): the log keeps it as a version, every model
    forgets it (`kioku.takeback`). A message deleted already changes nothing."""
    found = conv.store.entries_at(conv.id, [seq])
    if not found:
        raise NotFound(f"conversation {conv.info().public_id!r} has no message #{seq}")
    if found[0].message.is_empty():
        return Forgotten(seq, deleted=False)
    store = conv.store
    with store.atomic():
        done = conv.revise([Change(seq, None, "delete")])
        store.log(
            conv.id,
            "forget",
            "deleted",
            first_seq=seq,
            last_seq=seq,
            detail=f"#{seq} deleted" + (f"; stale items {list(done.stale)}" if done.stale else ""),
        )
        store.incr(conv.id, "deletions")
        if done.stale:
            store.incr(conv.id, "stale_items", len(done.stale))
    return Forgotten(seq, True, done.stale, done.retracted)


def replace_reply(
    conv: Conversation, seq: int, reply: Completion, author: str = "", meta: dict | None = None
) -> LogEntry:
    """A regeneration or swipe: the new reply takes the old one's seq (the old one is kept as a
    version). A cut reply is marked and counted as `Conversation.record` does."""
    store = conv.store
    meta = {**(meta or {}), **({"finish_reason": "length"} if reply.truncated else {})} or None
    message = reply_message(reply, author=author or conv.info().character)
    done = conv.revise([Change(seq, message, "regenerate", meta)])
    store.incr(conv.id, "regenerations")
    if reply.truncated:
        store.incr(conv.id, "truncated_replies")
        store.log(
            conv.id,
            "truncated_reply",
            "length",
            output_tokens=reply.usage.completion_tokens,
            first_seq=seq,
            last_seq=seq,
        )
    return done.entries[0]
