"""Building the prompt: pure functions from memory state to messages, with an account in tokens.

Order is what keeps the serving engine's prefix cache warm:
  1. system prompt (the character card; byte-identical every turn, shared across conversations)
  2. memory exchange (a synthetic user/assistant pair; changes only at a fold, and a fold that
     only adds a chapter keeps everything up to the previous chapter byte-identical)
  3. raw window (verbatim from the current start)
  4. the new user message, with what kioku adds to this turn in front of it: recollections and
     per-turn instructions (a question's recollections: on the turn that answers it only).

Between folds the prompt only grows. What a turn was shown in front of its message (its
`Extras`) stays with that message, rendered exactly as it was, for as long as the message is
raw: so the prompt the server cached plus its reply is a prefix of the next prompt, and the model
still sees what it answered. A recollection already visible is not shown again.

Whether a turn is shown the past at all, and how much of it, is recall's decision
(`kioku.recall.need`); here it gets the room. A question's recollections may use the room the turn
has (up to `Profile.recall_room` of the ceiling), not the share of the budget kept extras may hold
(`Profile.extras_share`): they are shown once, in front of the question, so the question is the
last thing the model reads, and the next prompt shows the question without them: the server
re-reads the question's own words with the reply (tens of tokens). Kept, they would crowd the
raw window until the next fold. Shown after the question (until December 2026), an old exchange
was the last thing the model read, and in a third of the questions asked through a real
`kioku serve` the model answered that instead of the question (`docs/results.md`).

`plan` measures the fixed parts (everything but this turn's additions) in tokens of the rendered
prompt (`kioku.budget`); `finish` gives this turn's additions what is left. Nothing here does
I/O, so the engine can ask retrieval for exactly the room `plan` found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from kioku import dates
from kioku.budget import (
    DEFAULT_TEMPLATE,
    ESTIMATE_MARGIN,
    Account,
    Template,
    Want,
    is_exact,
    share,
    template_of,
    usable,
)
from kioku.chat_messages import chat_message
from kioku.client_parts import NO_PARTS, ClientParts, place
from kioku.errors import ContextOverflow, MessageTooLarge
from kioku.inert import mark, unmarked_message
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage, ChatRequest
from kioku.profiles import Profile
from kioku.recall.recollection import Recollection
from kioku.salience import asks
from kioku.tokens import TokenCounter

if TYPE_CHECKING:
    from kioku.recall.need import Need

# The template's tokens per message when the counter does not say (see `kioku.budget`).
MESSAGE_OVERHEAD = round(DEFAULT_TEMPLATE.per_message)

# in kioku's mark (`kioku.inert`): a block a message types itself never reads as one of these
RECOLLECTION_LABEL = {
    "en": mark("A memory from earlier in this conversation that may be relevant:"),
    "ja": mark("この会話の以前の部分から、関係がありそうな記憶:"),
    "zh": mark("本次对话早先的一段可能相关的记忆:"),
}


@dataclass(frozen=True)
class Extras:
    """What kioku put in front of one user message when answering it: kept with the message
    (in its `meta`) and shown the same way on every later turn while the message is raw."""

    text: str
    tokens: int  # what the extras add to the message's rendered content
    version: int  # the memory version they were first shown under
    recalled: tuple[tuple[int, int], ...] = ()  # seq ranges of the recollections shown
    instructions: tuple[str, ...] = ()
    # a question's recollections: in front of the message, on the turn that answers it only
    # (and on a retry of that turn), never on later turns
    once: str = ""
    once_tokens: int = 0
    once_recalled: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text,
            "tokens": self.tokens,
            "version": self.version,
            "recalled": [list(r) for r in self.recalled],
            "instructions": list(self.instructions),
        }
        if self.once:
            out["once"] = self.once
            out["once_tokens"] = self.once_tokens
            out["once_recalled"] = [list(r) for r in self.once_recalled]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Extras:
        return cls(
            text=str(data.get("text", "")),
            tokens=int(data.get("tokens", 0)),
            version=int(data.get("version", -1)),
            recalled=tuple((int(a), int(b)) for a, b in data.get("recalled") or ()),
            instructions=tuple(str(i) for i in data.get("instructions") or ()),
            once=str(data.get("once", "")),
            once_tokens=int(data.get("once_tokens", 0)),
            once_recalled=tuple((int(a), int(b)) for a, b in data.get("once_recalled") or ()),
        )


EXTRAS_KEY = "shown"
RECALL_KEY = "recall"  # the turn's account of recall (`Prompt.recall`), in the message's meta
# what the recollections' label and the blank lines around it cost, at most (en/ja/zh)
LABEL_TOKENS = 32


def extras_of(entry: LogEntry) -> Extras | None:
    """What this message was shown with when it was answered, if anything."""
    data = entry.meta.get(EXTRAS_KEY) if entry.meta else None
    return Extras.from_json(data) if data else None


_NOT_WORDS = re.compile(r"[\W\d_]+")


@lru_cache(maxsize=8192)  # every raw message's gist is asked for again each turn
def gist(text: str) -> str:
    """A line's words without numbers, punctuation or case: "Reply 12." and "reply 31" are
    the same line said again."""
    return _NOT_WORDS.sub("", text).casefold()


def asks_something(entry: LogEntry) -> bool:
    """A user message that asks something: recollections it is shown come once, in front of
    it, and may use the turn's room (a ready chapter folds to make it)."""
    return entry.role == "user" and asks(entry.message.text)


def with_extras(extras: str, text: str) -> str:
    return f"{extras}\n\n{text}" if extras else text


@dataclass(frozen=True)
class Prompt:
    messages: tuple[ChatMessage, ...]
    account: Account
    memory_version: int = 0
    extras: Extras | None = None  # what this turn added (to keep with its message)
    # the turn's account of recall: on or off, why, what it got (`Need.note`; None: no turn
    # of recall, e.g. a tool result or a retry)
    recall: Mapping[str, Any] | None = None

    @property
    def tokens(self) -> int:
        return self.account.total

    def request(self, purpose: str = "reply") -> ChatRequest:
        return ChatRequest(messages=self.messages, max_tokens=self.account.reserve, purpose=purpose)


def entry_message(
    e: LogEntry, extras: Extras | None = None, line: str = "", answering: bool = False
) -> ChatMessage:
    """A stored message as the prompt shows it: what its turn was shown, then (when the prompt
    is `answering` it) the recollections shown once, then its date line (`kioku.dates`), then
    the message itself."""
    m = _chat_message(e.message)
    if line:
        m = m.prefixed(line)
    if extras is None:
        return m
    if answering and extras.once:
        m = m.prefixed(with_extras(extras.once, ""))
    return m.prefixed(with_extras(extras.text, "")) if extras.text else m


# Every turn renders the whole raw window again; a message renders the same every time.
@lru_cache(maxsize=16384)
def _chat_message(message: Message) -> ChatMessage:
    # tool calls, tool results and images as the protocol has them; the text without kioku's
    # mark brackets, so no message shows a block or a date line in kioku's own form
    return unmarked_message(chat_message(message))


# What a question's recollections leave of the room when the count is an estimate (an exact
# one needs none). The margin kept for an estimated count is what recent prompts needed; a
# block of excerpts (dates, names, labels) counts worse than chat, and a block that fills the
# room to the token is where that shows: an English chat at 8k through `kioku serve` overflowed by
# 31 tokens on a 1,700-token block, and with 5 % left a Japanese chat at 16k by 4 tokens
# once a question's block could take 35 % of the ceiling (`Profile.recall_room`).
QUESTION_SLACK = 0.1


@dataclass(frozen=True)
class Plan:
    """The fixed part of a prompt, measured; `room` is what this turn's additions may use."""

    head: tuple[ChatMessage, ...]  # system prompt, memory exchange, raw window
    new: LogEntry
    parts: Mapping[str, int]  # tokens of the fixed parts, template included
    budget: int  # usable prompt tokens
    template: Template
    profile: Profile
    lang: str
    memory_version: int
    raw_messages: int
    raw_start: int
    visible: frozenset[int]  # seqs a recollection must not repeat (shown as extras already)
    shown_instructions: frozenset[str]
    raw_gists: frozenset[str] = frozenset()  # what the raw window says (`gist`)
    kept: Extras | None = None  # this message's extras, when it was answered before
    new_line: str = ""  # the new message's date line
    asks: bool = False  # the new message asks something: recall may use the room left
    chat_start: int = 0  # where the raw window starts in `head`
    client: ClientParts = NO_PARTS  # what the client adds around the chat, placed at `finish`
    slack: float = 0.0  # what a question's recollections leave of the room (`QUESTION_SLACK`)

    @property
    def recall_ratio(self) -> float:
        """The share of the room left that recollections may take this turn."""
        return 1.0 - self.slack if self.asks else self.profile.recall_share

    @property
    def fixed(self) -> int:
        return sum(self.parts.values())

    @property
    def room(self) -> int:
        return self.budget - self.fixed

    @property
    def recall_room(self) -> int:
        """Tokens recollections may take this turn: a share of what is left, by profile, less
        the label that introduces them. A question's (shown once: nothing is carried) take at
        most `Profile.recall_room` of the ceiling; kept with a message that does not ask, never
        more than the raw window may still hold of what turns were shown
        (`Profile.extras_share`)."""
        if self.kept is not None:
            return 0
        share = int(self.room * self.recall_ratio)
        if self.asks:
            return max(0, min(share, self.profile.recall_tokens) - LABEL_TOKENS)
        left = int(self.budget * self.profile.extras_share) - self.parts.get("carried", 0)
        return max(0, min(share, left) - LABEL_TOKENS)


def head_tokens(
    system_prompt: str,
    memory: Memory,
    counter: TokenCounter,
    lang: str = "en",
    memory_in_system: bool = False,
) -> tuple[int, int]:
    """(tokens of the prompt besides its raw window and new message — system prompt, memory
    exchange, their template tokens, the reply's opening —, tokens the memory exchange's frame
    costs when memory is empty now): what the policy needs to size a fold on the rendered
    prompt, counted as `plan` counts it."""
    tmpl = template_of(counter)
    n = 1 if system_prompt else 0
    sys_t = counter.count(system_prompt) if system_prompt else 0
    user_text, ack = render_memory(memory, lang)
    if memory.is_empty():
        frame = counter.count(user_text) + counter.count(ack) + round(2 * tmpl.per_message)
        return sys_t + tmpl.messages(n), frame
    if memory_in_system:
        joined = f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
        return counter.count(joined) + tmpl.messages(1), 0
    mem_t = counter.count(user_text) + counter.count(ack)
    return sys_t + mem_t + tmpl.messages(n + 2), 0


def plan(
    *,
    system_prompt: str,
    memory: Memory,
    raw: Sequence[LogEntry],
    new: LogEntry,
    profile: Profile,
    counter: TokenCounter,
    lang: str = "en",
    memory_version: int = 0,
    memory_in_system: bool = False,
    margin: float | None = None,
    client: ClientParts = NO_PARTS,
) -> Plan:
    """Measure everything but this turn's additions (the client's own parts, `client`, are
    measured with the fixed part: they are sent as they came). `margin`: the share of the budget kept
    back for counting error (`budget.Margin`; by default none for an exact counter, 4 % for an
    estimate). `raw` is the raw window before the new
    message, oldest first. Raises `ContextOverflow` when even that does not fit: the policy
    cuts before it comes to this, so it means a message or card too large for the window."""
    tmpl = template_of(counter)
    # the policy keeps the prompt under the ceiling (the budget, in kioku's profiles): what a
    # turn adds stays under it too
    if margin is None:
        margin = 0.0 if is_exact(counter) else ESTIMATE_MARGIN
    budget = min(usable(profile.prompt_budget, margin), profile.ceiling)
    head: list[ChatMessage] = []
    sys_t = counter.count(system_prompt) if system_prompt else 0
    new_line = dates.line_for(new.message, raw[-1].message if raw else None, lang, new.seq > 0)
    new_t = (new.tokens or counter.count(new.message.text)) + dates.line_tokens(
        new_line, new.message, counter
    )
    alone = budget - sys_t - tmpl.messages(2 if system_prompt else 1)
    if new_t > alone:
        raise MessageTooLarge(new_t, alone, seq=new.seq)
    mem_t = 0
    if memory_in_system and not memory.is_empty():
        # the summary_in_system baseline: every fold rewrites the cache's base
        user_text, _ = render_memory(memory, lang)
        system_prompt = f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
        mem_t = counter.count(system_prompt) - sys_t
    if system_prompt:
        head.append(ChatMessage("system", system_prompt))
    if not memory_in_system and not memory.is_empty():
        user_text, ack = render_memory(memory, lang)
        head += [ChatMessage("user", user_text), ChatMessage("assistant", ack)]
        mem_t = counter.count(user_text) + counter.count(ack)
    chat_start = len(head)
    raw_t = carried = 0
    visible: set[int] = set()
    told: set[str] = set()
    previous: Message | None = None
    for e in raw:
        x = extras_of(e)
        line = dates.line_for(e.message, previous, lang, e.seq > 0)  # dated by day
        head.append(entry_message(e, x, line))
        raw_t += (e.tokens or counter.count(e.message.text)) + dates.line_tokens(
            line, e.message, counter
        )
        previous = e.message
        if x is not None:
            carried += x.tokens
            for lo, hi in x.recalled:
                visible.update(range(lo, hi + 1))
            told.update(x.instructions)
    parts = {
        "system": sys_t,
        "memory": mem_t,
        "raw": raw_t,
        "carried": carried,
        "new": new_t,
        "template": tmpl.messages(len(head) + 1),
    }
    if client:
        parts["client"] = client.tokens(counter, tmpl.per_message)
    p = Plan(
        head=tuple(head),
        new=new,
        parts=parts,
        budget=budget,
        template=tmpl,
        profile=profile,
        lang=lang,
        memory_version=memory_version,
        raw_messages=len(raw),
        raw_start=raw[0].seq if raw else new.seq,
        visible=frozenset(visible),
        shown_instructions=frozenset(told),
        raw_gists=frozenset(gist(e.message.text) for e in raw),
        kept=extras_of(new),
        new_line=new_line,
        asks=asks_something(new),
        chat_start=chat_start,
        client=client,
        slack=0.0 if is_exact(counter) else QUESTION_SLACK,
    )
    if p.room < 0:
        raise _overflow(p, sys_t, mem_t, raw_t + carried, new_t)
    return p


def _overflow(p: Plan, sys_t: int, mem_t: int, raw_t: int, new_t: int) -> ContextOverflow:
    """What does not fit, naming its true cause: the raw window (which the engine folds and
    asks again) or the request's own parts, or, when even no raw window would fit, memory or the
    card (kioku's state, never the user's message, which `MessageTooLarge` checked alone)."""
    pr = p.profile
    client_t = p.parts.get("client", 0)
    sizes = (
        f"system {sys_t}, memory {mem_t}, raw {raw_t} in {p.raw_messages} messages, new "
        f"message {new_t}, the client's own parts {client_t}"
    )
    if p.fixed - raw_t - client_t <= p.budget:
        return ContextOverflow(
            f"the prompt needs {p.fixed} tokens but {p.budget} fit beside the response reserve "
            f"({pr.response_reserve} of a {pr.window}-token window): {sizes}; the raw window "
            "must be folded first",
            excess=-p.room,
        )
    what = "memory" if mem_t else "the system prompt"
    return ContextOverflow(
        f"{what} leaves no room for this message: the prompt needs {p.fixed - raw_t} tokens "
        f"without any raw history, but {p.budget} fit ({sizes}). This is kioku's memory "
        "state, not your message: the compaction log says why memory was not folded "
        "(`kioku memory`, GET …/log); a cut (`kioku cut`) folds it now",
        excess=-p.room,
        cause="memory" if mem_t else "system",
    )


def finish(
    p: Plan,
    counter: TokenCounter,
    recollections: Sequence[Recollection] = (),
    instructions: Sequence[str] = (),
    need: Need | None = None,
) -> Prompt:
    """The prompt: the fixed part, then the new message with what this turn adds in front of
    it (a question's recollections: shown once), as much as the room allows. A message answered
    before (a retry, a regeneration) keeps exactly the additions it was shown the first time.
    `need`: recall's decision for this turn, whose note the prompt carries with what it got."""
    text = p.new.message.text
    dropped: dict[str, int] = {}
    got_r = got_i = 0
    extras = p.kept
    # extras go next to a user message; a tool result must reach the model as returned
    if extras is None and p.new.role == "user":
        fresh = [i for i in instructions if i and i not in p.shown_instructions]
        recs = [r for r in (_unseen(r, p) for r in recollections) if r is not None]
        instr_text = "\n".join(fresh)
        instr_t = _added(counter, instr_text, text) if instr_text else 0
        allowed = share(
            p.room,
            [
                Want("instructions", instr_t, priority=2, minimum=instr_t),
                Want(
                    "recollections",
                    p.recall_room + LABEL_TOKENS,
                    priority=1,
                    ratio=p.recall_ratio,
                ),
            ],
        )
        if instr_t and not allowed["instructions"]:
            dropped["instructions"] = instr_t
            instr_text, fresh = "", []
        got_i = allowed["instructions"]
        label = RECOLLECTION_LABEL.get(p.lang, RECOLLECTION_LABEL["en"])
        kept: list[Recollection] = []
        for r in recs:
            if p.asks:
                cost = _added(counter, _extras_text([*kept, r], "", label), text)
            else:
                cost = _added(counter, _extras_text([*kept, r], instr_text, label), text) - got_i
            if cost <= allowed["recollections"]:
                kept.append(r)
                got_r = cost
            else:
                dropped["recollections"] = dropped.get("recollections", 0) + (
                    r.tokens or counter.count(r.text)
                )
        # the texts the loop measured last: what it took, already counted
        ranges = tuple((r.first_seq, r.last_seq) for r in kept)
        once = _extras_text(kept, "", label) if p.asks else ""
        body = instr_text if p.asks else _extras_text(kept, instr_text, label)
        if body or once:
            extras = Extras(
                text=body,
                tokens=got_i if p.asks else got_r + got_i,
                version=p.memory_version,
                recalled=() if p.asks else ranges,
                instructions=tuple(fresh),
                once=once,
                once_tokens=got_r if p.asks else 0,
                once_recalled=ranges if p.asks else (),
            )
    chat = (*p.head[p.chat_start :], entry_message(p.new, extras, p.new_line, answering=True))
    messages = (*p.head[: p.chat_start], *place(chat, p.client))
    parts = dict(p.parts)
    if extras is not None and p.kept is not None:
        # shown before: the same tokens again
        parts["recollections"] = p.kept.tokens + p.kept.once_tokens
    else:
        parts["recollections"] = got_r
        parts["instructions"] = got_i
    account = Account(
        parts=parts,
        reserve=p.profile.response_reserve,
        window=p.profile.window,
        raw_messages=p.raw_messages,
        raw_start=p.raw_start,
        dropped=dropped,
    )
    new_extras = extras if (extras is not None and p.kept is None) else None
    note = None
    if need is not None and p.kept is None:
        got = new_extras.once_recalled or new_extras.recalled if new_extras else ()
        note = need.note(got, parts["recollections"])
    return Prompt(messages, account, p.memory_version, new_extras, note)


def _unseen(r: Recollection, p: Plan) -> Recollection | None:
    """The recollection without the lines the model already sees: lines an earlier turn
    recalled (still raw with their turn), and the same words said again in the raw window."""
    if not r.lines:  # a recollection made of text only
        return r
    fresh = tuple(
        ln for ln in r.lines if ln.seq not in p.visible and gist(ln.text) not in p.raw_gists
    )
    if not fresh:
        return None
    if len(fresh) == len(r.lines):
        return r
    return Recollection(fresh[0].seq, fresh[-1].seq, r.score, fresh, lang=r.lang)


def _extras_text(recs: Sequence[Recollection], instructions: str, label: str) -> str:
    pieces = []
    if recs:
        pieces.append(label + "\n" + "\n\n".join(r.text for r in recs))
    if instructions:
        pieces.append(instructions)
    return "\n\n".join(pieces)


def _added(counter: TokenCounter, extras: str, text: str) -> int:
    """Tokens the extras add to a message's rendered content (counted whole, so the account
    adds up to the rendered prompt even where a tokenizer merges across the seam)."""
    if not extras:
        return 0
    return max(0, counter.count(with_extras(extras, text)) - counter.count(text))


def build(
    *,
    system_prompt: str,
    memory: Memory,
    raw: Sequence[LogEntry],
    new: LogEntry,
    profile: Profile,
    counter: TokenCounter,
    recollections: Sequence[Recollection] = (),
    instructions: Sequence[str] = (),
    lang: str = "en",
    memory_version: int = 0,
    memory_in_system: bool = False,
    margin: float | None = None,
    client: ClientParts = NO_PARTS,
) -> Prompt:
    """`plan` and `finish` in one call, for callers that already hold their recollections."""
    p = plan(
        system_prompt=system_prompt,
        memory=memory,
        raw=raw,
        new=new,
        profile=profile,
        counter=counter,
        lang=lang,
        memory_version=memory_version,
        memory_in_system=memory_in_system,
        margin=margin,
        client=client,
    )
    return finish(p, counter, recollections, instructions)
