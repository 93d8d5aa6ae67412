"""The other layers wired into the engine: recall, tics, notes, cut (issue 4's end-to-end checks)."""

from __future__ import annotations

from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.memory import coverage_gaps
from kioku.messages import Message
from kioku.revisions import Change
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator
from tests.helpers import Clock, layered

# a small window, so that a hundred turns fold (the prompt fills the window before a fold)

FILLER = [
    "The weather was grey and we walked along the pier talking about nothing much.",
    "We tried the new noodle stall near the station and it was far too salty.",
    "You showed me the photos from your cousin's wedding in the mountains.",
    "We watched the fishing boats come in while the gulls fought over scraps.",
    "You complained about your printer jamming again before the deadline.",
]


def grow(
    kk: Kioku, clock: Clock, cid: str, turns: int, first: str | None = None, tic: str = ""
) -> None:
    conv = kk.conversation(cid, system_prompt="You are Mika.")
    for i in range(turns):
        clock.advance(20)
        text = first if (first and i == 0) else FILLER[i % len(FILLER)] + f" ({i})"
        conv.prepare(text)
        reply = FILLER[(i + 2) % len(FILLER)] + f" Reply {i}."
        conv.record(reply + (f" {tic}" if tic else ""))
        kk.worker.run_until_idle()


def test_recollection_comes_after_the_raw_window_and_never_repeats_it() -> None:
    kk, clock = layered()
    grow(
        kk, clock, "c", 120, first="My grandmother's lighthouse on Kurohama island had a red door."
    )
    conv = kk.conversation("c")
    assert conv.info().raw_start > 0, "the conversation should have folded"
    before = conv.prepare("What colour was the door of the lighthouse on Kurohama island?")
    raw = [e for e in conv.raw_window() if e.seq < before.account.raw_start + 10**9]
    # in the prompt once: quoted by memory, or recalled from the archive beside this message or
    # beside an earlier turn's message that is still raw (kept with its turn, never repeated)
    assert 0 not in {e.seq for e in raw}
    assert sum("red door" in m.content for m in before.messages) == 1
    shown = [m.content for m in before.messages[3:]]
    # every raw message is verbatim at the end of what the model reads for it
    texts = [e.text for e in raw]
    assert all(c.endswith(t) for c, t in zip(shown, texts, strict=False))
    # next turn: what the server cached (prompt + reply) is a prefix of the new prompt
    conv.record("It was red.")
    after = conv.prepare("And the roof?")
    if after.memory_version == before.memory_version:
        assert list(after.messages[: len(before.messages)]) == [
            *before.messages[:-1],
            before.messages[-1],
        ]


def test_recall_finds_a_japanese_memory() -> None:
    kk, clock = layered()
    conv = kk.conversation("ja", system_prompt="あなたはミカです。")
    conv.prepare("私の誕生日は三月十四日で、毎年いちご大福を食べるんだ。")
    conv.record("素敵ですね。覚えておきます。")
    for i in range(150):
        clock.advance(20)
        conv.prepare(f"今日は駅前のカフェで本を読んで、帰りに少し散歩しました。{i}回目の話です。")
        conv.record(f"それはいい一日でしたね。私は灯台の掃除をしていました。{i}")
        kk.worker.run_until_idle()
    assert conv.info().raw_start > 2
    p = conv.prepare("ねえ、私の誕生日っていつだったか覚えてる？")
    # in the prompt once: memory quotes it, so it is not recalled again beside the question
    assert sum("三月十四日" in m.content for m in p.messages) == 1
    assert p.recall is not None and p.recall["cue"] == "覚えて"


def test_planted_tic_raises_an_alert_and_stays_out_of_the_next_chapter() -> None:
    kk, clock = layered()
    tic = "nya~ just kidding, darling!"
    conv = kk.conversation("t", system_prompt="You are Mika.")
    for i in range(20):
        clock.advance(10)
        conv.prepare(FILLER[i % 5] + f" ({i})")
        conv.record(FILLER[(i + 1) % 5] + f" Reply {i}." + (f" {tic}" if i % 20 < 11 else ""))
    assert kk.layers.avoid_phrases("t")
    p = conv.prepare("tell me something")
    # the anti-repetition line is shown once, beside a user message (never in the system
    # prompt), and stays with it while that message is raw
    line = kk.layers.instructions(conv.view())[0]
    beside = [m.content for m in p.messages if m.role == "user" and line in m.content]
    assert len(beside) == 1
    assert "nya" not in p.messages[0].content.lower()
    assert kk.store.counters("t").get("tic_alerts", 0) >= 1
    # summarize the range: the phrase does not enter memory
    conv.cut()
    memory_text = "\n".join(i.text for i in kk.store.items("t", "active")).lower()
    assert "nya" not in memory_text
    assert "reply" in memory_text or "pier" in memory_text  # facts stay


def test_a_character_who_keeps_saying_it_does_not_remember_is_not_told_to_stop() -> None:
    """Asked about what was never said, an honest character declines each time; a style note
    against "I don't remember" would push the model to invent an answer instead."""
    kk, clock = layered()
    conv = kk.conversation("d", system_prompt="You are Mika.")
    for i in range(20):
        clock.advance(10)
        conv.prepare(FILLER[i % 5] + f" Do you remember what I said about thing {i}?")
        said = "Hmm, I don't remember you telling me that." if i < 11 else FILLER[(i + 1) % 5]
        conv.record(f"{said} Reply {i}.")
    p = conv.prepare("And what about the trip?")
    assert kk.layers.tic_alerts("d") == []
    assert kk.layers.instructions(conv.view()) == []
    assert not any("Style note" in m.content for m in p.messages)
    assert kk.layers.avoid_phrases("d") == []


def test_cut_empties_raw_window_keeps_coverage_and_search() -> None:
    kk, clock = layered()
    grow(kk, clock, "c", 30, first="The spare key is hidden under the blue flowerpot.")
    conv = kk.conversation("c")
    conv.cut()
    assert conv.raw_window() == []
    info = conv.info()
    assert coverage_gaps(kk.store.items("c", "active"), info.raw_start) == []
    hits = kk.layers.search("c", "where is the spare key hidden", k=3)
    assert hits and hits[0].seq == 0
    p = conv.prepare("Where did I hide the spare key?")
    assert sum("flowerpot" in m.content for m in p.messages) == 1  # memory's, shown once


def test_notes_enter_the_prompt_only_at_a_fold() -> None:
    kk, clock = layered()
    conv = kk.conversation("n", system_prompt="You are Mika.")
    conv.prepare("My name is Kenji and my birthday is on 3 May.")
    conv.record("Nice to meet you, Kenji.")
    for i in range(200):
        clock.advance(20)
        p = conv.prepare(FILLER[i % 5] + f" ({i})")
        conv.record(f"Reply {i}.")
        kk.worker.run_until_idle()
        if conv.info().memory_version:
            break
    mem = conv.memory()
    assert "Kenji" in mem.notes
    # the notes are in the memory exchange, and stay byte-identical until the next fold
    p1 = conv.prepare("hello again")
    conv.record("hi")
    p2 = conv.prepare("and again")
    if p2.memory_version == p1.memory_version:
        assert p1.messages[1] == p2.messages[1]
    assert p is not None


def test_extractive_summarizer_keeps_attribution() -> None:
    from kioku.messages import LogEntry, Part
    from kioku.summarizer import SummaryTask

    lie = Message(
        role="assistant",
        author="Mika",
        parts=(
            Part("speech", "I'm seventeen, you know.", "Mika"),
            Part("thought", "I'm twenty-five, but he must never know.", "Mika"),
        ),
    )
    s = ExtractiveSummarizer(ScriptEstimator()).summarize(
        SummaryTask("chapter", 200, entries=(LogEntry(4, lie, 20),))
    )
    assert "[4] Mika: I'm seventeen" in s.text
    # the message's next line reads under the same [4], not as the same seq twice
    assert s.text.count("[4]") == 1 and "\n    Mika (thought): I'm twenty-five" in s.text
    from kioku.summarizer import parse_lines

    assert [(ln.seq, ln.speaker) for ln in parse_lines(s.text)] == [
        (4, "Mika"),
        (4, "Mika (thought)"),
    ]


def test_alerts_after_a_reply_match_a_fresh_read_without_reading_the_replies_again() -> None:
    kk, clock = layered()
    layers = kk.layers
    assert isinstance(layers, Layers)
    tic = "nya~ just kidding, darling!"
    conv = kk.conversation("t", system_prompt="You are Mika.")
    reads: list[str] = []
    tail = kk.store.tail

    def counted_tail(*args: object, **kw: object) -> object:
        reads.append("tail")
        return tail(*args, **kw)  # type: ignore[arg-type]

    kk.store.tail = counted_tail  # type: ignore[method-assign]
    hashes = kk.store.tail_hashes

    def counted_hashes(*args: object, **kw: object) -> object:
        reads.append("tail_hashes")
        return hashes(*args, **kw)  # type: ignore[arg-type]

    kk.store.tail_hashes = counted_hashes  # type: ignore[method-assign]
    alerted, quiet = [], 0
    for i in range(40):  # the tic comes in at reply 8 and goes at reply 22: alerts change
        clock.advance(10)
        conv.prepare(FILLER[i % 5] + f" ({i})")
        said = FILLER[(i + 1) % 5] + f" Reply {i}." + (f" {tic}" if 8 <= i < 22 else "")
        reply = conv.record(said)
        reads.clear()
        got = layers.after_reply("t", reply)
        assert reads == [] or i == 0  # the first time, nothing was known: read once
        reads.clear()
        # the next turn asks, with the raw window it read: nothing is read or detected again
        window = conv.raw_window()
        assert layers.tic_alerts("t", window) == got
        holds = window[0].seq == 0 or sum(e.role == "assistant" for e in window) >= 20
        assert (reads == []) == holds  # a folded window may not hold the last 20 replies
        quiet += holds
        assert layers.tic_alerts("t") == got  # without the window: only the replies' hashes
        assert got == Layers(kk.store).tic_alerts("t")  # what a process reading afresh finds
        alerted.append(any("nya" in a.phrase for a in got))
    assert alerted[15] and not alerted[-1]
    assert quiet >= 20
    # a reply edited elsewhere: the next turn's key no longer matches, and it reads again
    last = kk.store.tail("t", 1, role="assistant")[0]
    conv.revise([Change(last.seq, Message.of("assistant", f"Edited. {tic}"))])
    reads.clear()
    again = layers.tic_alerts("t", conv.raw_window())
    assert reads == ["tail_hashes", "tail"]
    assert again == Layers(kk.store).tic_alerts("t")
