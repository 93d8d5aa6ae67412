"""The arms without kioku's memory: truncation, plain retrieval, and the full conversation.

They keep the log as it comes and, for a question, choose which messages to show; the prompt is
then assembled by the product's allocator (`kioku.context.build`: `plan` and `finish`, the two
steps kioku's own arms go through in `Conversation.prompt_for`), so every arm renders messages, dates and the system prompt by the same rule and is held to
the same budget (`kioku.context.plan`'s: the window less the response reserve, on the tokens
of the rendered prompt):

  truncation  the newest messages that fit
  retrieval   the question's best turns by plain BM25 (one turn = one message, bm25s with
              kioku's terms: stemmed English, stop words out, CJK bigrams), each with the turn
              before and after it, best first until the budget is full, shown in log order —
              the baseline a sceptic picks first
  full        every message, no limit: the reference a strategy is compared with, not an arm
              (no budget holds it; it is only as good as what the messages say, so a date that
              no message renders is missing from it too)

When the product renders more than a message's text (a date line when the day changes), a
choice measured by message tokens can overshoot; the choice is then cut down until the
allocator accepts it, and the prompt's own account is what is reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from kioku import dates
from kioku.bench.prefix import Turn, sliding_driver
from kioku.context import Prompt, build, plan
from kioku.datasets import Transcript
from kioku.errors import ContextOverflow
from kioku.memory import Memory
from kioku.messages import LogEntry
from kioku.models import ChatMessage
from kioku.profiles import Profile
from kioku.tokens import TokenCounter

from .arms import Context, MemoryStats, context_of, question_entry

UNLIMITED = 10**9  # the full reference's window
NEIGHBOURS = 1  # retrieval: turns before and after each hit


@dataclass
class LogArm:
    """The log as the replay feeds it, and the prompt for a chosen part of it."""

    name: str
    transcript: Transcript
    profile: Profile
    counter: TokenCounter
    entries: list[LogEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the demo measures the sliding window's per-turn prompts for its prefix-cache plot
        self._sliding = sliding_driver(self.transcript, self.profile, self.counter)  # type: ignore[arg-type]

    def feed(self, turn: Turn, want_prompt: bool = False) -> list[ChatMessage] | None:
        users, replies = turn
        prompt = self._sliding(turn).messages if want_prompt else None
        for m in [*users, *replies]:
            self.entries.append(LogEntry(len(self.entries), m, self.counter.count(m.text)))
        return prompt

    def finish(self) -> None:
        pass

    def memory(self) -> MemoryStats:
        return MemoryStats()

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass

    def _entry(self, question: str) -> LogEntry:
        at = self.entries[-1].message.at if self.entries else None
        return question_entry(question, len(self.entries), self.transcript.user, at, self.counter)

    def _prompt(self, shown: Sequence[LogEntry], new: LogEntry, profile: Profile) -> Prompt:
        return build(
            system_prompt=self.transcript.system_prompt,
            memory=Memory(),
            raw=shown,
            new=new,
            profile=profile,
            counter=self.counter,
            lang=self.transcript.lang,
        )

    def _room(self, new: LogEntry) -> tuple[int, int]:
        """(tokens left for messages beside the system prompt and the question, what the chat
        template adds to each message), as the allocator measures them."""
        p = plan(
            system_prompt=self.transcript.system_prompt,
            memory=Memory(),
            raw=(),
            new=new,
            profile=self.profile,
            counter=self.counter,
            lang=self.transcript.lang,
        )
        return p.room, math.ceil(p.template.per_message)

    def _fitted(self, shown: list[LogEntry], new: LogEntry, drop: Sequence[int]) -> Prompt:
        """The prompt for `shown`, giving up messages in the order `drop` names (indexes into
        `shown`) while the allocator refuses it."""
        return self._fit(shown, new, drop)[1]

    def _fit(
        self, shown: list[LogEntry], new: LogEntry, drop: Sequence[int]
    ) -> tuple[list[LogEntry], Prompt]:
        """`_fitted`, with the messages it kept."""
        order = list(drop)
        while True:
            try:
                return shown, self._prompt(shown, new, self.profile)
            except ContextOverflow:
                if not order:
                    raise
                gone = order.pop(0)
                shown = [e for e in shown if e.seq != gone]


@dataclass
class WindowArm(LogArm):
    """`truncation` (the newest messages that fit) or, unlimited, `full`."""

    limit: bool = True
    # the window is chosen as if for a question of this many tokens (None: for the question
    # asked), so that every question at one state gets the same window and a reader's prefix
    # cache keeps it; a longer question still fits, by dropping the oldest messages
    question_room: int | None = None
    _stable: tuple[int, list[LogEntry]] | None = field(default=None, init=False, repr=False)

    def context(self, question: str) -> Context:
        new = self._entry(question)
        if not self.limit:
            big = replace(
                self.profile, window=UNLIMITED, ceiling=UNLIMITED - self.profile.response_reserve
            )
            return context_of(self.name, self._prompt(self.entries, new, big), question)
        kept = self._newest(new) if self.question_room is None else self._stable_window()
        prompt = self._fitted(kept, new, [e.seq for e in kept])
        return context_of(self.name, prompt, question)

    def _newest(self, new: LogEntry) -> list[LogEntry]:
        room, per = self._room(new)
        kept: list[LogEntry] = []
        for e in reversed(self.entries):
            cost = e.tokens + per
            if cost > room:
                break
            room -= cost
            kept.append(e)
        kept.reverse()
        return kept

    def _stable_window(self) -> list[LogEntry]:
        """The window the allocator accepts with a stand-in question of `question_room`
        tokens: one per state of the log."""
        if self._stable is None or self._stable[0] != len(self.entries):
            text = "x"
            while self.counter.count(text) < (self.question_room or 0):
                text += " x"
            stand_in = self._entry(text)
            kept = self._newest(stand_in)
            kept, _ = self._fit(kept, stand_in, [e.seq for e in kept])
            self._stable = (len(self.entries), kept)
        return self._stable[1]


@dataclass
class RetrievalArm(LogArm):
    """The question's best BM25 turns, each with its neighbours, filling the budget."""

    def finish(self) -> None:
        self._index  # noqa: B018 — build it before the first question, not inside one

    @cached_property
    def _index(self) -> object:
        import bm25s

        from kioku.recall.archive import Terms, index_text

        self._terms = Terms()
        index = bm25s.BM25()
        docs = [self._terms(index_text(e)) or ["\u2400"] for e in self.entries]
        if docs:
            index.index(docs, show_progress=False)
        return index

    def ranking(self, question: str) -> list[int]:
        """Seqs of the turns that share a term with the question, best first."""
        index = self._index
        terms = self._terms(question)
        if not self.entries or not terms:
            return []
        scores = np.asarray(index.get_scores(terms))  # type: ignore[attr-defined]
        order = np.argsort(-scores, kind="stable")
        return [int(i) for i in order if scores[i] > 0]

    def context(self, question: str) -> Context:
        new = self._entry(question)
        room, per = self._room(new)
        chosen: dict[int, int] = {}  # seq -> the rank of the hit that brought it
        for rank, seq in enumerate(self.ranking(question)):
            group = [
                s
                for s in range(seq - NEIGHBOURS, seq + NEIGHBOURS + 1)
                if 0 <= s < len(self.entries) and s not in chosen
            ]
            cost = sum(self.entries[s].tokens + per for s in group)
            if cost > room:
                # the whole group does not fit: the hit alone may
                group = [seq] if seq not in chosen else []
                cost = sum(self.entries[s].tokens + per for s in group)
                if not group or cost > room:
                    continue
            for s in group:
                chosen[s] = rank
            room -= cost
        shown = [self.entries[s] for s in sorted(chosen)]
        worst_first = sorted(chosen, key=lambda s: (-chosen[s], s))
        prompt = self._fitted(shown, new, worst_first)
        return context_of(self.name, prompt, question)


def entry_seqs(transcript: Transcript) -> list[int]:
    """For each message of `transcript`, its seq in the replayed log (`turns_of` drops replies
    that open the transcript before any user message: those get -1)."""
    out: list[int] = []
    seq = 0
    seen_user = False
    for m in transcript.messages:
        seen_user = seen_user or m.role == "user"
        if m.role != "user" and not seen_user:
            out.append(-1)
            continue
        out.append(seq)
        seq += 1
    return out


RECALLED_HEADER = "Earlier in the conversation:"


@dataclass
class RecentRetrievalArm:
    """Plain retrieval as a chat front end adds it (SillyTavern's Vector Storage): the recent
    window first, then the question's best BM25 turns (±1, as `RetrievalArm` picks them, not
    already in the window) in log order as one dated block in front of the question. The block
    gets the room kioku's allocator gives a question's recollections (`Profile.recall_tokens`)
    and the recent window the rest of the budget, so both arms fill the same budget and read
    the same amount anew per question. The system prompt and the recent window are the same
    for every question at one state: the reader's prefix cache keeps them."""

    name: str
    base: RetrievalArm

    def finish(self) -> None:
        self.base.finish()

    def memory(self) -> MemoryStats:
        return MemoryStats()

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass

    @cached_property
    def _recent(self) -> list[LogEntry]:
        b = self.base
        room, per = b._room(b._entry(""))
        room -= b.profile.recall_tokens
        kept: list[LogEntry] = []
        for e in reversed(b.entries):
            room -= e.tokens + per
            if room < 0:
                break
            kept.append(e)
        kept.reverse()
        return kept

    def _line(self, e: LogEntry) -> str:
        m = e.message
        day = dates.day_of(m.at)
        when = f"({dates.day_text(day, self.base.transcript.lang)}) " if day else ""
        return f"{when}{m.author or m.role}: {m.text}"

    def context(self, question: str) -> Context:
        b = self.base
        recent = self._recent
        in_window = {e.seq for e in recent}
        room, per = b._room(b._entry(question))
        room -= sum(e.tokens + per for e in recent)
        room -= b.counter.count(RECALLED_HEADER) + 2  # the header and the break before the question
        chosen: list[int] = []  # in the order they were taken, best hit first
        for seq in b.ranking(question):
            group = [
                s
                for s in range(seq - NEIGHBOURS, seq + NEIGHBOURS + 1)
                if 0 <= s < len(b.entries) and s not in in_window and s not in chosen
            ]
            cost = sum(b.counter.count(self._line(b.entries[s])) + 1 for s in group)
            if cost > room:
                group = [seq] if seq in group else []
                cost = sum(b.counter.count(self._line(b.entries[s])) + 1 for s in group)
                if not group or cost > room:
                    continue
            chosen.extend(group)
            room -= cost
        while True:
            shown = sorted(chosen)
            block = "\n".join([RECALLED_HEADER, *(self._line(b.entries[s]) for s in shown)])
            text = f"{block}\n\n{question}" if shown else question
            try:
                prompt = b._prompt(recent, b._entry(text), b.profile)
            except ContextOverflow:
                if not chosen:
                    raise
                chosen.pop()  # the worst-ranked turn taken goes first
                continue
            return context_of(self.name, prompt, question)
