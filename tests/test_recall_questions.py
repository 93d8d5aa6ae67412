"""Recall that uses the budget: a message that asks something may fill the room left with
recollections; any other message keeps `recall_share` of it and `recall_limit` of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kioku.context import build, plan
from kioku.engine import Conversation, Kioku
from kioku.errors import ConfigError
from kioku.layers import Layers
from kioku.memory import Memory
from kioku.messages import LogEntry, Message
from kioku.profiles import LOCAL_8K
from kioku.recollection import RecalledLine, Recollection
from kioku.store import Store
from kioku.tokens import ScriptEstimator
from tests.helpers import Clock

COUNTER = ScriptEstimator()


def entry(seq: int, text: str, role: str = "user") -> LogEntry:
    return LogEntry(seq, Message.of(role, text), COUNTER.count(text))  # type: ignore[arg-type]


def recs(n: int) -> list[Recollection]:
    out = []
    for i in range(n):
        text = f"Hanako's kite number {i} was painted blue and flew over the river in May."
        line = RecalledLine(10 * i, "Mika", text)
        r = Recollection(10 * i, 10 * i, 1.0 - i / 100, (line,))
        out.append(Recollection(10 * i, 10 * i, r.score, (line,), COUNTER.count(r.text)))
    return out


def _prompt(text: str):
    raw = [entry(1000 + i, f"we talked about the weather and tea, part {i}") for i in range(352)]
    args = dict(
        system_prompt="You are Mika.",
        memory=Memory(),
        raw=raw,
        new=entry(1352, text),
        profile=LOCAL_8K,
        counter=COUNTER,
    )
    return plan(**args), build(**args, recollections=recs(60))  # type: ignore[arg-type]


def test_a_question_may_fill_the_room_left_a_statement_takes_its_share() -> None:
    p_q, asked = _prompt("What was painted on Hanako's kite?")
    p_s, told = _prompt("Hanako's kite was painted, I think.")
    assert p_q.asks and not p_s.asks
    assert p_q.room == pytest.approx(p_s.room, abs=8)  # the same raw window either way
    kept_cap = int(p_s.budget * LOCAL_8K.extras_share)  # what turns may keep, at most
    # a statement: recall_share of the room, within what may be kept; a question: all of the
    # room up to `question_room`, shown once (not held to what may be kept)
    assert told.account.recollections <= min(p_s.room * LOCAL_8K.recall_share, kept_cap)
    assert asked.account.recollections > 1.5 * told.account.recollections
    assert p_q.room - 40 <= asked.account.recollections <= p_q.room  # the room, filled
    assert p_q.recall_room <= LOCAL_8K.question_tokens
    assert asked.extras is not None and asked.extras.tokens == 0  # nothing kept in front
    assert told.extras is not None and told.extras.once == ""
    assert asked.account.fits and told.account.fits


def test_question_share_is_checked() -> None:
    with pytest.raises(ConfigError, match="question_share"):
        replace(LOCAL_8K, question_share=1.5)


def mika(cid: str) -> tuple[Kioku, Conversation, Clock]:
    """A conversation with recall and notes on (no tic guard), at 8k."""
    clock = Clock()
    store = Store.open("sqlite://")
    kk = Kioku(
        store, profile=LOCAL_8K, counter=COUNTER, clock=clock, layers=Layers(store, tics=False)
    )
    return kk, kk.conversation(cid, system_prompt="You are Mika."), clock


def test_a_question_recalls_past_the_per_turn_limit_when_room_allows() -> None:
    kk, conv, clock = mika("q")
    animals = ["dragon", "heron", "tiger", "carp", "owl", "fox", "whale", "crane"]
    places = ["river", "harbour", "temple", "meadow", "station"]
    for i in range(240):
        clock.advance(30)
        a, p = animals[i % 8], places[i % 5]
        name = "".join("kamirotesuna"[2 * int(d) % 12 : 2 * int(d) % 12 + 2] for d in f"{i:03d}")
        # every line its own words: a recollection the raw window already says is not shown
        conv.append(Message.user(f"{name.title()}'s kite has a {a} on it; we flew it by the {p}."))
        conv.append(Message.assistant(f"{name.title()}'s {a} kite at the {p} sounds fun."))
        kk.worker.run_until_idle()
        conv.settle()
    info, raw, memory = conv.info(), conv.raw_window(), conv.memory()
    assert info.raw_start > 0  # folds happened: the archive holds kites the window does not

    def ask(text: str):
        new = LogEntry(info.next_seq, Message.user(text), COUNTER.count(text))
        return conv.prompt_for(new, info=info, window=raw, memory=memory)

    asked = ask("Which kite had a dragon on it?")
    told = ask("The kite had a dragon on it.")
    assert asked.extras is not None and told.extras is not None
    assert len(told.extras.recalled) <= LOCAL_8K.recall_limit
    assert len(asked.extras.once_recalled) > LOCAL_8K.recall_limit
    assert asked.account.recollections > told.account.recollections
    assert asked.account.fits


def test_a_questions_recollections_are_shown_once_after_it_and_cost_no_re_read() -> None:
    _, conv, clock = mika("once")
    conv.append(Message.user("My sister Hanako flies a blue kite with a dragon on it."))
    conv.append(Message.assistant("A dragon kite! Hanako must love the wind."))
    for i in range(6):
        conv.append(Message.user(f"The tea today is number {i}, a little bitter."))
        conv.append(Message.assistant(f"Bitter tea number {i} suits a grey day."))
    conv.cut()  # the kite is in the archive now, not in the raw window
    question = "What is on Hanako's kite?"
    asked = conv.prepare(question)
    last = asked.messages[-1].content
    head, _, tail = last.partition(question)  # head: the date line the window opens with
    assert "dragon" in tail and "dragon" not in head
    assert asked.account.recollections > 0
    entry = conv.raw_window()[-1]
    # a retry of the turn shows exactly what the first try showed
    assert conv.prepare_for(entry).messages == asked.messages
    conv.record("A dragon, flying over the river.")
    clock.advance(30)
    nxt = conv.prepare("I see, thanks.")
    n = len(asked.messages)
    # everything before the question is unchanged, and the question now reads as it was
    # asked: what the server cached up to the end of its words is a prefix of this prompt
    assert nxt.messages[: n - 1] == asked.messages[: n - 1]
    again = nxt.messages[n - 1].content
    assert again == head + question and last.startswith(again)
    assert nxt.account.parts["carried"] == 0  # nothing of the question's recall is kept
