"""What every arm of an evaluation is and gives: the `Arm` protocol, and the `Context` an arm
would send for a question at the end of a conversation (with the question as the log's next
message). kioku's own arms (`kioku.eval.strategies`) and the model-free baselines
(`kioku.eval.baselines`) both build on these, so neither imports the other's module for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from kioku.bench.prefix import Turn
from kioku.context import Account, Prompt
from kioku.messages import LogEntry, Message
from kioku.models import ChatMessage
from kioku.tokens import TokenCounter

__all__ = ["Arm", "Context", "MemoryStats", "context_of", "question_entry"]


@dataclass(frozen=True)
class Context:
    """What one arm would send for a question at the end of the conversation."""

    strategy: str
    messages: tuple[ChatMessage, ...]  # the prompt; the question is in the last message
    question: str
    tokens: int  # prompt tokens, by the replay's counter
    extra: str = ""  # recollections (and their label) in front of the question
    account: Account | None = None  # where the allocator put the tokens

    @property
    def before(self) -> tuple[ChatMessage, ...]:
        """System prompt, memory exchange and raw window: everything before the question."""
        return self.messages[:-1]

    @property
    def text(self) -> str:
        """Everything the model would see except the question itself."""
        return "\n".join(m.content for m in self.before) + ("\n" + self.extra if self.extra else "")

    def parts(self) -> dict[str, str]:
        """The text of each part of the prompt, in SPEC §2's order (the question left out)."""
        before = list(self.before)
        system = before.pop(0).content if before and before[0].role == "system" else ""
        n_memory = 2 if self.account is not None and self.account.memory > 0 else 0
        memory = "\n".join(m.content for m in before[:n_memory])
        raw = "\n".join(m.content for m in before[n_memory:])
        return {"system": system, "memory": memory, "raw": raw, "recall": self.extra}


def context_of(name: str, prompt: Prompt, question: str) -> Context:
    # everything in front of the question in its message: extras, a question's recollections,
    # a date line
    last = prompt.messages[-1].content
    extra = last[: -len(question)].strip() if last.endswith(question) else ""
    return Context(name, prompt.messages, question, prompt.tokens, extra, prompt.account)


def question_entry(
    question: str, seq: int, author: str, at: datetime | None, counter: TokenCounter
) -> LogEntry:
    """The question as the next message of the log (never stored), dated like the last one."""
    return LogEntry(seq, Message.user(question, author=author, at=at), counter.count(question))


@dataclass(frozen=True)
class MemoryStats:
    tokens: int = 0  # memory items (synopsis + chapters), by the replay's counter
    chars: int = 0
    rendered_tokens: int = 0  # the memory exchange as the prompt shows it (headers, notes)
    text: str = ""


class Arm(Protocol):
    name: str

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None: ...

    def finish(self) -> None: ...

    def context(self, question: str) -> Context: ...

    def memory(self) -> MemoryStats: ...

    def counters(self) -> dict[str, int]: ...
