"""The engine talks to the memory layers through one protocol, `kioku.hooks.MemoryLayers`: a
scripted double injected into `Kioku(layers=...)` sees every call, and what it returns lands
where the engine puts it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kioku.engine import Kioku
from kioku.errors import ConfigError
from kioku.messages import LogEntry
from kioku.no_layers import NO_LAYERS, NoLayers
from kioku.recall.need import Need, Recall
from kioku.recall.recollection import RecalledLine, Recollection
from kioku.store import Store
from kioku.turn_state import TurnState
from tests.helpers import PROFILE, Clock
from tests.test_layers import grow


class Scripted(NoLayers):
    """Fixed answers; `calls` records (hook, conversation id) in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.chapters: list[tuple[int, int]] = []

    def recall(self, turn: TurnState, entry: LogEntry) -> Recall:
        self.calls.append(("recall", turn.conversation_id))
        if not turn.info.raw_start:
            return Recall(Need.off("nothing before the raw window"))
        line = RecalledLine(0, "Mika", "REMEMBERED-LINE")
        return Recall(Need(True, "scripted"), (Recollection(0, 0, 1.0, (line,), 8),))

    def instructions(self, turn: TurnState) -> Sequence[str]:
        self.calls.append(("instructions", turn.conversation_id))
        return ["SAY-IT-DIFFERENTLY"]

    def notes(self, turn: TurnState) -> str | None:
        self.calls.append(("notes", turn.conversation_id))
        return "- [name] Mika: keeps the lighthouse"

    def avoid_phrases(self, conversation_id: str) -> Sequence[str]:
        self.calls.append(("avoid_phrases", conversation_id))
        return ["nya"]

    def chapter_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        self.calls.append(("chapter_written", conversation_id))
        self.chapters.append((entries[0].seq, entries[-1].seq))


def test_the_engine_asks_the_layers_at_each_turn_fold_and_chapter() -> None:
    clock, layers, store = Clock(), Scripted(), Store.open("sqlite://")
    kk = Kioku(store, profile=PROFILE, clock=clock, layers=layers)
    assert kk.worker.layers is layers  # the worker asks the same object
    grow(kk, clock, "c", 120)
    hooks = {name for name, cid in layers.calls if cid == "c"}
    assert hooks == {
        "recall",
        "instructions",
        "notes",
        "avoid_phrases",
        "chapter_written",
    }
    # every chapter stored was announced with the messages it covers
    chapters = [i.span for i in store.items("c") if i.kind == "chapter"]
    assert sorted(layers.chapters) == sorted(chapters)
    conv = kk.conversation("c")
    assert conv.memory().notes == "- [name] Mika: keeps the lighthouse"  # rendered at a fold
    # the layers' additions go in front of a user message, recollection first, and stay with
    # it while it is raw (shown once: not repeated beside the newest message)
    prompt = conv.prepare("and then the storm came.").messages
    beside = [m.content for m in prompt if "REMEMBERED-LINE" in m.content]
    assert len(beside) == 1
    content = beside[0]
    assert content.index("REMEMBERED-LINE") < content.index("SAY-IT-DIFFERENTLY")
    assert not content.endswith("SAY-IT-DIFFERENTLY")  # the message itself comes last
    # each turn's account of recall says what the layer decided and what it got: the turn
    # that showed the line, and the newest, which had it in view already
    notes = [e.meta["recall"] for e in conv.raw_window() if e.meta and "recall" in e.meta]
    shown = [n for n in notes if n["on"]]
    assert len(shown) == 1 and shown[0]["got"] == [[0, 0]] and shown[0]["why"] == "scripted"
    assert notes[-1] == {
        "on": False,
        "why": "scripted; nothing shown (no room, or all of it in view)",
    }


def test_without_layers_the_engine_runs_alone() -> None:
    clock, store = Clock(), Store.open("sqlite://")
    kk = Kioku(store, profile=PROFILE, clock=clock)
    assert kk.layers is NO_LAYERS
    grow(kk, clock, "c", 120)
    conv = kk.conversation("c")
    assert conv.info().raw_start > 0
    assert conv.memory().notes == ""  # no notes layer: the snapshot is never written
    result = conv.edit_notes("- [promise] Mika: visit the lighthouse in May\n")
    assert len(result.added) == 1  # the ledger still takes an operator's edit
    with pytest.raises(ConfigError, match="layers"):
        kk.layers.search("c", "lighthouse", 3)
