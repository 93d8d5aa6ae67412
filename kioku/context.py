"""Building the prompt: a pure function from memory state to messages, with an account in tokens.

Order is what keeps the serving engine's prefix cache warm:
  1. system prompt (the character card; byte-identical every turn, shared across conversations)
  2. memory exchange (a synthetic user/assistant pair; changes only at a fold)
  3. raw window (verbatim from the current start)
  4. recollections and per-turn instructions, then the new user message (the only part that
     changes every turn, so it goes last)
Invariant: prompt tokens + response reserve ≤ window, or an error — never a silent overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from kioku.errors import ContextOverflow, MessageTooLarge
from kioku.memory import Memory, render_memory
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage, ChatRequest
from kioku.profiles import Profile
from kioku.protocol import chat_message
from kioku.recollection import Recollection
from kioku.tokens import TokenCounter

# Chat templates wrap every message in a few special tokens (role markers, separators).
MESSAGE_OVERHEAD = 6


@dataclass(frozen=True)
class Account:
    """Where the prompt's tokens went, and what was left out."""

    system: int
    memory: int
    raw: int
    recollections: int
    instructions: int
    new: int
    overhead: int
    reserve: int
    window: int
    raw_messages: int
    raw_start: int
    dropped_recollections: int = 0

    @property
    def total(self) -> int:
        return (
            self.system
            + self.memory
            + self.raw
            + self.recollections
            + self.instructions
            + self.new
            + self.overhead
        )

    @property
    def fits(self) -> bool:
        return self.total + self.reserve <= self.window


@dataclass(frozen=True)
class Prompt:
    messages: tuple[ChatMessage, ...]
    account: Account
    memory_version: int = 0

    @property
    def tokens(self) -> int:
        return self.account.total

    def request(self, purpose: str = "reply") -> ChatRequest:
        return ChatRequest(messages=self.messages, max_tokens=self.account.reserve, purpose=purpose)


RECOLLECTION_LABEL = {
    "en": "(A memory from earlier in this conversation that may be relevant:)",
    "ja": "(この会話の以前の部分から、関係がありそうな記憶:)",
    "zh": "(本次对话早先的一段可能相关的记忆:)",
}


def entry_message(e: LogEntry) -> ChatMessage:
    return _chat_message(e.message)


# Every turn renders the whole raw window again; a message renders the same every time.
@lru_cache(maxsize=16384)
def _chat_message(message: Message) -> ChatMessage:
    return chat_message(message)  # tool calls, tool results and images as the protocol has them


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
) -> Prompt:
    """Assemble the prompt. `raw` is the raw window before the new message, oldest first."""
    if new.role == "tool":
        # extras go next to a user message; a tool result must reach the model as returned
        recollections, instructions = (), ()
    budget = profile.prompt_budget
    sys_t = counter.count(system_prompt) if system_prompt else 0
    new_t = new.tokens or counter.count(new.message.text)
    if new_t + sys_t + 2 * MESSAGE_OVERHEAD > budget:
        raise MessageTooLarge(new_t, budget - sys_t - 2 * MESSAGE_OVERHEAD, seq=new.seq)

    messages: list[ChatMessage] = []
    mem_t = 0
    if memory_in_system and not memory.is_empty():
        # the summary_in_system baseline: every fold rewrites the cache's base
        user_text, _ = render_memory(memory, lang)
        system_prompt = f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
        mem_t = counter.count(system_prompt) - sys_t
    if system_prompt:
        messages.append(ChatMessage("system", system_prompt))
    if not memory_in_system and not memory.is_empty():
        user_text, ack = render_memory(memory, lang)
        messages.append(ChatMessage("user", user_text))
        messages.append(ChatMessage("assistant", ack))
        mem_t = counter.count(user_text) + counter.count(ack)
    raw_t = 0
    for e in raw:
        messages.append(entry_message(e))
        raw_t += e.tokens or counter.count(e.message.text)
    n_messages = len(messages) + 1
    base = sys_t + mem_t + raw_t + new_t + n_messages * MESSAGE_OVERHEAD
    if base > budget:
        raise ContextOverflow(
            f"prompt needs {base} tokens but the window leaves {budget} beside the response "
            f"reserve; the raw window must be folded first (ceiling {profile.ceiling})"
        )

    # Per-turn extras fill what is left, recollections within their own budget; whatever does
    # not fit is dropped and accounted for, never squeezed in.
    room = budget - base
    instr_text = "\n".join(i for i in instructions if i)
    instr_t = counter.count(instr_text) if instr_text else 0
    if instr_t > room:
        instr_text, instr_t = "", 0
    room -= instr_t
    kept: list[Recollection] = []
    rec_t = dropped = 0
    label = RECOLLECTION_LABEL.get(lang, RECOLLECTION_LABEL["en"])
    label_t = counter.count(label) + 2
    rec_budget = min(profile.recollection_tokens, room)
    for r in recollections:
        cost = r.tokens or counter.count(r.text)
        if rec_t + cost + label_t <= rec_budget:
            kept.append(r)
            rec_t += cost
        else:
            dropped += cost
    if kept:
        rec_t += label_t

    pieces = []
    if kept:
        pieces.append(label + "\n" + "\n\n".join(r.text for r in kept))
    if instr_text:
        pieces.append(instr_text)
    last = entry_message(new)
    if pieces:
        last = last.prefixed("\n\n".join(pieces) + "\n\n")
    messages.append(last)

    account = Account(
        system=sys_t,
        memory=mem_t,
        raw=raw_t,
        recollections=rec_t,
        instructions=instr_t,
        new=new_t,
        overhead=n_messages * MESSAGE_OVERHEAD,
        reserve=profile.response_reserve,
        window=profile.window,
        raw_messages=len(raw),
        raw_start=raw[0].seq if raw else new.seq,
        dropped_recollections=dropped,
    )
    return Prompt(messages=tuple(messages), account=account, memory_version=memory_version)
