"""The LLM chronicler's guards, each proven with a scripted model that records what it was sent."""

from __future__ import annotations

import asyncio
import io
import json
import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console

from kioku.backlog import summarize_transcript
from kioku.chronicle_prompt import chapter_ranges
from kioku.chronicler import (
    AsyncLLMChronicler,
    ChroniclerConfig,
    LLMChronicler,
    first_max_tokens,
    is_refusal,
)
from kioku.datasets import Transcript
from kioku.errors import BadSummary, ModelUnavailable
from kioku.generations import chunks
from kioku.memory import Memory, MemoryItem, render_memory
from kioku.messages import LogEntry, Message, Part
from kioku.models import ChatRequest, Completion, ScriptedModel, Usage
from kioku.profiles import LOCAL_8K
from kioku.structure import (
    Record,
    ThreadNote,
    merge_threads,
    parse_record,
    record_from_data,
)
from kioku.summarizer import ExtractiveSummarizer, Summary, SummaryTask
from tests.chronicle_requests import span

if TYPE_CHECKING:
    from tests.llama import LlamaServer

# the llama_server fixture
pytest_plugins = ["tests.llama"]


class QuarterCounter:
    """Four chars a token: stable numbers for tests."""

    def count(self, text: str) -> int:
        return max(1, len(text) // 4)


COUNTER = QuarterCounter()
AT = datetime(2024, 3, 1, 21, 0)


def lying_aoi(first: int = 10) -> tuple[LogEntry, ...]:
    """Aoi claims she has never been here; narration and her own thought say otherwise."""
    msgs = [
        Message.user("Aoi, have you been to this town before?", author="Ren", at=AT),
        Message(
            "assistant",
            (
                Part(
                    "narration",
                    "Aoi looked away from the old lighthouse she had climbed as a child.",
                ),
                Part("speech", "Never. This is my first time here.", speaker="Aoi"),
                Part("thought", "I grew up in this town. He must not find out.", speaker="Aoi"),
            ),
            author="Aoi",
            at=AT + timedelta(minutes=1),
        ),
        Message.user(
            "I start a new job in April, so I can only visit on weekends.",
            author="Ren",
            at=AT + timedelta(minutes=2),
        ),
        Message(
            "assistant",
            (
                Part(
                    "speech",
                    "Then I'll wait for you at the shrine every Saturday, nya.",
                    speaker="Aoi",
                ),
            ),
            author="Aoi",
            at=AT + timedelta(minutes=3),
        ),
    ]
    return tuple(LogEntry(seq=first + i, message=m, tokens=20) for i, m in enumerate(msgs))


GOOD: dict[str, Any] = {
    "events": [{"seq": 10, "text": "Ren asked Aoi whether she had been to this town before."}],
    "claims": [
        {
            "seq": 11,
            "speaker": "Aoi",
            "listener": "Ren",
            "claim": "she has never been to this town",
            "supported_by": "none",
            "actual": "her thought shows she grew up in this town",
        }
    ],
    "threads": [
        {"id": "aoi-past", "title": "What Aoi hides about the town", "status": "open", "seq": 11}
    ],
    "user_facts": [
        {"seq": 12, "fact": "Ren starts a new job in April and can visit only on weekends."}
    ],
    "key_lines": [
        {"seq": 13, "speaker": "Aoi", "text": "Then I'll wait for you at the shrine every Saturday"}
    ],
}


def reply(obj: Any) -> str:
    return "Here is the record.\n```json\n" + json.dumps(obj, ensure_ascii=False) + "\n```"


def task(**kw: Any) -> SummaryTask:
    base: dict[str, Any] = {
        "kind": "chapter",
        "target_tokens": 300,
        "entries": lying_aoi(),
        "lang": "en",
        "character": "Aoi",
        "user_name": "Ren",
    }
    base.update(kw)
    return SummaryTask(**base)


def chronicler(model: ScriptedModel, **config: Any) -> LLMChronicler:
    return LLMChronicler(model, COUNTER, ExtractiveSummarizer(COUNTER), ChroniclerConfig(**config))


def user_text(r: ChatRequest) -> str:
    return r.messages[-1].content


# --- a clean run -------------------------------------------------------------------------------


def test_good_reply_becomes_a_structured_summary_with_its_provenance() -> None:
    model = ScriptedModel([Completion(reply(GOOD), "stop", Usage(900, 200), "qwen")])
    s = chronicler(model).summarize(task())
    assert s.source == "llm" and s.model == "qwen"
    assert s.prompt_version == "chapter-en-v4"
    assert (s.attempts, s.events, s.input_tokens) == (1, (), 900)
    assert s.tokens == COUNTER.count(s.text)
    assert s.data["format"] == "kioku.chronicle/1"
    assert s.data["usage"] == {"prompt_tokens": 900, "completion_tokens": 200}
    # per track: the story (with attribution) and the facts about the user
    assert "### Story" in s.text and "### About the user (facts)" in s.text
    assert "Ostensibly: Aoi told Ren: she has never been to this town. Actually:" in s.text
    assert "- #12 Ren starts a new job in April" in s.text
    assert record_from_data(s.data).claims[0].actual
    # every line is grounded in the message it cites, and the record says so
    assert s.data["grounding"]["share"] == 1.0 and s.data["grounding"]["lines"] == 5


def test_the_request_keeps_attribution_a_lie_arrives_as_speech_the_truth_as_narration() -> None:
    model = ScriptedModel([reply(GOOD)])
    chronicler(model).summarize(task())
    (request,) = model.history
    assert request.purpose == "chapter"
    assert [m.role for m in request.messages] == ["system", "user"]
    text = user_text(request)
    assert "\n21:01 · Aoi (character)" in text
    assert '[speech] Aoi: "Never. This is my first time here."' in text
    assert "[narration] Aoi looked away from the old lighthouse she had climbed as a child." in text
    assert "[thought, unspoken] Aoi: I grew up in this town." in text
    assert "\n2024-03-01 (Fri) 21:00 · Ren (user)" in text
    # no message numbers for a small model to fill in line by line: the request knows them
    assert "#1" not in text and request.seqs == (10, 11, 12, 13)
    assert "chronicler" in request.messages[0].content


def test_without_a_system_role_the_instructions_open_the_user_turn() -> None:
    model = ScriptedModel([reply(GOOD)])
    chronicler(model, system_role=False).summarize(task())
    (request,) = model.history
    assert [m.role for m in request.messages] == ["user"]
    assert request.messages[0].content.startswith("You are the chronicler")
    assert "[speech] Aoi:" in request.messages[0].content


# --- refusal -----------------------------------------------------------------------------------


def test_refusal_is_retried_once_and_never_stored() -> None:
    model = ScriptedModel(["I'm sorry, but I can't help with creating that record.", reply(GOOD)])
    s = chronicler(model).summarize(task())
    assert s.source == "llm"
    assert s.events == ("refusal", "retry")
    assert s.attempts == 2
    assert "sorry" not in s.text.lower()
    # a refusal is a roll of the dice: the same request is sent again
    assert model.history[0].messages == model.history[1].messages


def test_second_refusal_falls_back_to_the_extractive_chronicler() -> None:
    model = ScriptedModel(
        ["申し訳ありませんが、その記録は作成できません。", "我不能帮助完成这个请求。"]
    )
    s = chronicler(model).summarize(task())
    assert len(model.history) == 2  # no third try
    assert s.source == "extractive"
    assert s.events == ("refusal", "retry", "refusal", "fallback")
    assert s.attempts == 2
    assert "申し訳" not in s.text and "我不能" not in s.text
    from kioku.summarizer import Line, parse_lines

    assert Line(11, "Aoi", "Never.") in parse_lines(s.text)  # the extractive chapter, attributed


def test_refusal_detection_is_short_and_phrase_based() -> None:
    assert is_refusal("I’m sorry, I can’t help with that.")
    assert is_refusal("その記録は作成できません。")
    assert not is_refusal("A long summary. " * 40 + "I can't say more.")  # 400+ chars
    assert not is_refusal(reply(GOOD))


# --- truncation --------------------------------------------------------------------------------


def test_truncated_reply_is_never_stored_and_retried_with_more_room_and_a_note() -> None:
    full = reply(GOOD)
    model = ScriptedModel([Completion(full[:120], "length"), full])
    s = chronicler(model).summarize(task(ceiling_tokens=4096))
    assert s.events == ("truncated", "retry")
    assert model.history[0].max_tokens == first_max_tokens(task()) == 300 + 256
    # half as much room again, not the whole ceiling: the facts fit the first request, and a
    # small model that ran out of room was looping
    assert model.history[1].max_tokens == (300 + 256) * 3 // 2
    assert "cut at 556 tokens: write at most 9 facts and stop" in user_text(model.history[1])


def test_length_finish_is_not_stored_even_when_the_text_parses() -> None:
    # a record cut exactly at a closing brace still lost whatever came next
    shorter = {"events": [{"seq": 10, "text": "CUT VERSION"}]}
    model = ScriptedModel([Completion(reply(shorter), "length"), reply(GOOD)])
    s = chronicler(model).summarize(task())
    assert "CUT VERSION" not in s.text
    assert s.events == ("truncated", "retry")


def test_always_truncated_falls_back() -> None:
    model = ScriptedModel(default=Completion('{ "events": [', "length"))
    s = chronicler(model).summarize(task())
    assert len(model.history) == 3
    assert s.source == "extractive" and s.events[-1] == "fallback"
    assert s.events.count("truncated") == 3


# --- unparseable -------------------------------------------------------------------------------


def test_story_continuation_is_unparseable_retried_with_the_reason() -> None:
    model = ScriptedModel(["'Let's go,' Aoi said, smiling at the sea", reply(GOOD)])
    s = chronicler(model).summarize(task())
    assert s.events == ("unparseable", "retry")
    assert "smiling" not in s.text
    retry = user_text(model.history[1])
    assert "Your previous answer could not be used: write one fact a line" in retry


def test_a_paragraph_is_read_sentence_by_sentence_and_each_is_grounded() -> None:
    # the 1.5B model sometimes wrote its facts as one paragraph: each sentence is a line, and
    # a story continuation read that way is borne out by nothing
    story = "Aoi smiled and took Ren's hand. 'Let's go,' she said. They ran to the pier."
    model = ScriptedModel([story, reply(GOOD)])
    s = chronicler(model).summarize(task())
    assert s.events == ("ungrounded", "retry")
    assert "smiled" not in s.text and "pier" not in s.text
    facts = (
        "Ren asked Aoi whether she had been to this town before. Aoi said it was her first "
        "time here. Aoi looked away from the old lighthouse she had climbed as a child."
    )
    model = ScriptedModel([facts])
    s = chronicler(model).summarize(task())
    assert s.source == "llm" and s.events == ()
    assert "lighthouse she had climbed as a child" in s.text


def test_a_cut_chapter_reply_keeps_its_whole_lines_a_cut_synopsis_none() -> None:
    looped = "\n".join(
        ["- Aoi looked away from the old lighthouse she had climbed as a child."] * 6
        + ["- Aoi looked away from the old light"]
    )
    model = ScriptedModel([Completion(looped, finish_reason="length")])
    s = chronicler(model).summarize(task())
    assert s.source == "llm" and s.events == ("salvaged",)
    assert s.text.count("lighthouse she had climbed") == 1 and "old light\n" not in s.text
    model = ScriptedModel([Completion("- Aoi looked away", finish_reason="length"), reply(GOOD)])
    s = chronicler(model).summarize(task())
    assert s.events[:2] == ("truncated", "retry")  # no whole line: asked again


def test_unparseable_every_time_falls_back_never_stored() -> None:
    model = ScriptedModel(default='```json\n{"events": [{"seq": 10, "text": "x"},]}\n```')
    s = chronicler(model).summarize(task())
    assert s.source == "extractive"
    assert s.events == ("unparseable", "retry", "unparseable", "retry", "unparseable", "fallback")
    assert "invalid JSON" in user_text(model.history[2])


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"events": [{"seq": 99, "text": "x"}]}, "outside #10–#13"),
        ({"events": [], "summary": "prose"}, "unknown keys"),
        (
            {"claims": [{"seq": 11, "speaker": "Aoi", "claim": "x", "supported_by": "rumour"}]},
            "supported_by",
        ),
        ({"threads": [{"id": "a", "status": "maybe"}]}, "status"),
        ({"key_lines": [{"speaker": "Aoi", "text": "x"}]}, "seq is required"),
        ({"events": []}, "empty"),
        ([1, 2], "not an object"),
    ],
)
def test_parse_is_strict(bad: Any, why: str) -> None:
    with pytest.raises(BadSummary, match=why):
        parse_record(reply(bad), (10, 13))


def test_parse_accepts_bare_json_and_loose_status_words() -> None:
    r = parse_record(
        json.dumps(
            {"events": ["Aoi arrived."], "threads": [{"id": "Aoi Past", "status": "Closed"}]}
        ),
        (10, 13),
    )
    assert r.events[0].text == "Aoi arrived."
    assert r.threads[0] == ThreadNote("aoi-past", "aoi-past", "resolved", None)


def test_model_errors_propagate_they_are_not_bad_summaries() -> None:
    model = ScriptedModel([ModelUnavailable("server down")])
    with pytest.raises(ModelUnavailable):
        chronicler(model).summarize(task())


# --- length targets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lang", "wanted"),
    [
        ("en", "list the 12 most important facts"),
        ("ja", "list the 10 most important facts"),
        ("zh", "list the 11 most important facts"),
    ],
)
def test_length_targets_per_language_reach_the_request_as_lines(lang: str, wanted: str) -> None:
    """A model cannot count tokens; it can count lines (en ~22 tokens a line, ja ~30)."""
    model = ScriptedModel([reply(GOOD)])
    chronicler(model).summarize(task(lang=lang, target_tokens=400))
    request = model.history[0]
    assert wanted in request.messages[-1].content
    assert request.max_tokens == 400 + 256


def test_max_tokens_never_exceeds_the_ceiling() -> None:
    model = ScriptedModel([reply(GOOD)])
    chronicler(model).summarize(task(target_tokens=4000, ceiling_tokens=4096))
    assert model.history[0].max_tokens == 4096


# --- compression -------------------------------------------------------------------------------


def chapter_item(first: int, last: int, record: dict[str, Any], lang: str = "en") -> MemoryItem:
    data = parse_record(json.dumps(record), (first, last)).to_data(lang)
    return MemoryItem(
        kind="chapter",
        first_seq=first,
        last_seq=last,
        text="(chapter)",
        tokens=100,
        source="llm",
        data=data,
    )


COLOURS = ("red", "blue", "green", "yellow", "white", "black", "orange", "purple", "grey", "pink")


def painted_boats() -> MemoryItem:
    """A chapter that says a lot, every line of it grounded: Aoi painted ten boats."""
    events = [
        {"seq": i, "text": f"Aoi painted the {c} boat by the pier."} for i, c in enumerate(COLOURS)
    ]
    return chapter_item(0, 9, {"events": events})


def boat_lines(n: int, first: int = 0) -> str:
    return "\n".join(
        f"#{i} Aoi: painted the {COLOURS[i]} boat by the pier" for i in range(first, n)
    )


def boats_and_aoi_synopsis(target: int) -> SummaryTask:
    """A synopsis folding the ten painted boats and Aoi's chapter (`GOOD`)."""
    return SummaryTask(
        kind="synopsis",
        target_tokens=target,
        chapters=(painted_boats(), chapter_item(10, 13, GOOD)),
        lang="en",
        character="Aoi",
        user_name="Ren",
    )


def test_bloated_synopsis_is_compressed_by_the_model_not_truncated() -> None:
    bloated = boat_lines(10) + "\nOPEN aoi-past: What Aoi hides about the town"
    short = "#0 Aoi: painted the red boat by the pier\nOPEN aoi-past: What Aoi hides about the town"
    model = ScriptedModel([bloated, short])
    t = boats_and_aoi_synopsis(40)
    s = chronicler(model).summarize(t)
    assert s.events == ("compress",)
    assert s.attempts == 2
    assert s.prompt_version == "synopsis-en-v3+compress-en-v3"
    assert "purple" not in s.text and "red boat" in s.text
    compress = model.history[1]
    assert "One of your records is too long" in compress.messages[0].content
    # the record to shorten is shown in the line form the model answers in
    assert "#7 Aoi: painted the purple boat by the pier" in user_text(compress)
    # the synopsis request showed both chapters as lines, with their threads offered by id
    first = user_text(model.history[0])
    assert "[#0–#9]\n#0 narration: Aoi painted the red boat by the pier." in first
    assert "[#10–#13]" in first
    assert "- [open] aoi-past: What Aoi hides about the town (#11)" in first


def test_a_synopsis_line_the_records_do_not_hold_is_dropped() -> None:
    """A synopsis restates memory: a line citing a seq the records say nothing about, or
    saying what they do not, never enters it."""
    lines = "#3 Aoi: painted the yellow boat by the pier\n#3 Aoi: sank the yellow boat in a storm"
    lines += "\n#4 Aoi: painted the white boat by the pier"
    model = ScriptedModel([lines + "\n#40 Aoi: painted the sky"])
    t = SummaryTask(kind="synopsis", target_tokens=300, chapters=(painted_boats(),), lang="en")
    s = chronicler(model).summarize(t)
    assert "yellow boat" in s.text and "storm" not in s.text and "sky" not in s.text
    assert s.data["grounding"]["dropped"] == {"unsupported": 1, "seq": 1}
    assert s.events.count("dropped_unsupported") == 1


def test_compression_that_fails_says_so_and_the_record_keeps_whole_lines_within_target() -> None:
    bloated = boat_lines(10)
    model = ScriptedModel([bloated, "I'm sorry, I can't.", bloated])
    t = SummaryTask(kind="synopsis", target_tokens=30, chapters=(painted_boats(),), lang="en")
    s = chronicler(model).summarize(t)
    assert s.events == ("compress", "refusal", "compress", "over_target")
    assert s.source == "llm" and s.tokens <= 30
    story = [ln for ln in s.text.splitlines() if ln.startswith("- #")]
    assert story and all(ln.endswith("boat by the pier.") for ln in story)  # none cut off


# --- threads -----------------------------------------------------------------------------------


def key_story() -> tuple[LogEntry, ...]:
    """Twelve messages: the lighthouse key is lost at #1 and found at #9."""

    def say(text: str) -> Message:
        return Message("assistant", (Part("speech", text, speaker="Aoi"),), author="Aoi", at=AT)

    msgs = [
        Message.user("Did you bring the lighthouse key?", author="Ren", at=AT),
        say("I lost the lighthouse key somewhere."),
        Message.user("We have to find it before dark.", author="Ren", at=AT),
        say("Let's look tomorrow morning."),
        Message.user("Good morning!", author="Ren", at=AT),
        Message(
            "assistant", (Part("narration", "They searched the beach all morning."),), "Aoi", AT
        ),
        Message.user("Nothing here.", author="Ren", at=AT),
        say("Nothing here either."),
        Message.user("Wait.", author="Ren", at=AT),
        Message.user("I found the key in my coat!", author="Ren", at=AT),
        say("Thank goodness."),
        Message.user("Let's go up.", author="Ren", at=AT),
    ]
    return tuple(LogEntry(seq=i, message=m, tokens=8) for i, m in enumerate(msgs))


def test_thread_opened_in_chapter_1_and_resolved_in_chapter_3_is_closed_in_memory() -> None:
    c1 = {
        "events": [{"seq": 1, "text": "Aoi lost the lighthouse key."}],
        "threads": [
            {"id": "lost-key", "title": "The lost lighthouse key", "status": "open", "seq": 1}
        ],
    }
    c2 = {"events": [{"seq": 5, "text": "They searched the beach."}]}
    c3 = {
        "events": [{"seq": 9, "text": "Ren found the key in his coat."}],
        "threads": [{"id": "Lost Key", "title": "key", "status": "resolved", "seq": 9}],
    }
    story = key_story()
    model = ScriptedModel([reply(c1), reply(c2), reply(c3)])
    ch = chronicler(model)
    memory = Memory()
    for first, n in ((0, 4), (4, 4), (8, 4)):
        t = task(
            entries=story[first : first + n], previous=memory.synopsis, chapters=memory.chapters
        )
        s = ch.summarize(t)
        item = MemoryItem(
            kind="chapter",
            first_seq=first,
            last_seq=first + n - 1,
            text=s.text,
            tokens=s.tokens,
            source=s.source,
            data=s.data,
        )
        memory = replace(memory, chapters=(*memory.chapters, item))
    # chapters 2 and 3 were told the thread is open, by id
    assert "- [open] lost-key: The lost lighthouse key (#1)" in user_text(model.history[1])
    assert "- [open] lost-key" in user_text(model.history[2])
    threads = merge_threads(memory.chapters)
    assert [(t.id, t.status, t.opened_seq, t.changed_seq) for t in threads] == [
        ("lost-key", "resolved", 1, 9)
    ]
    text, ack = render_memory(memory, "en")
    assert "- [resolved] lost-key: The lost lighthouse key (#9)" in text
    assert "[open] lost-key" not in text
    assert ack


def test_stale_open_note_does_not_reopen_a_resolved_thread() -> None:
    older = Record(threads=(ThreadNote("t", "T", "resolved", 9),)).to_data("en")
    stale = Record(threads=(ThreadNote("t", "T", "open", 4),)).to_data("en")
    assert merge_threads([older, stale])[0].status == "resolved"
    same_seq = Record(threads=(ThreadNote("t", "T", "open", 9),)).to_data("en")
    assert merge_threads([older, same_seq])[0].status == "resolved"
    later = Record(threads=(ThreadNote("t", "T", "open", 12),)).to_data("en")
    assert merge_threads([older, later])[0].status == "open"  # reopened later: the data says so


def test_synopsis_cannot_drop_an_open_thread_or_reopen_a_resolved_one() -> None:
    ch1 = chapter_item(
        0,
        5,
        {
            "events": [{"seq": 1, "text": "a"}],
            "threads": [
                {"id": "open-one", "title": "Still open", "status": "open", "seq": 1},
                {"id": "done-one", "title": "Settled", "status": "open", "seq": 2},
            ],
        },
    )
    ch2 = chapter_item(
        6,
        9,
        {
            "events": [{"seq": 7, "text": "b"}],
            "threads": [{"id": "done-one", "title": "Settled", "status": "resolved", "seq": 7}],
        },
    )
    forgetful = {
        "events": [{"seq": 1, "text": "a and b"}],
        "threads": [{"id": "done-one", "title": "Settled", "status": "open", "seq": 2}],
    }
    model = ScriptedModel([reply(forgetful)])
    s = chronicler(model).summarize(
        SummaryTask(kind="synopsis", target_tokens=300, chapters=(ch1, ch2))
    )
    got = {t.id: t.status for t in merge_threads([s.data])}
    assert got == {"open-one": "open", "done-one": "resolved"}


# --- verbatim key lines and verbal tics --------------------------------------------------------


def test_key_lines_are_kept_verbatim_and_paraphrases_dropped() -> None:
    rec = dict(GOOD)
    rec["key_lines"] = [
        {
            "seq": 13,
            "speaker": "Aoi",
            "text": "Then I'll wait for you at the shrine every Saturday",
        },
        {"seq": 11, "speaker": "Aoi", "text": "I have never ever been here in my life"},
    ]
    model = ScriptedModel([reply(rec)])
    s = chronicler(model).summarize(task())
    # the paraphrase cites #11, which never says it: dropped, a guard event, and why
    assert s.events == ("dropped_unsupported",)
    assert s.data["grounding"]["dropped"] == {"unsupported": 1}
    # the model's key line, or its whole message when that says more in the room: verbatim
    assert "- #13 Aoi: Then I'll wait for you at the shrine every Saturday" in s.text
    assert "never ever" not in s.text
    memory_text, _ = render_memory(
        Memory(chapters=(MemoryItem("chapter", 10, 13, s.text, s.tokens, data=s.data),))
    )
    assert "Key lines (verbatim):" in memory_text
    assert "#13 Aoi: Then I'll wait for you at the shrine every Saturday" in memory_text


def test_a_records_quotes_cost_what_the_extractive_chapters_lines_cost() -> None:
    """The same lines of a span, kept by an LLM record or by the extractive chronicler, take
    the same room in memory: a message's further sentences sit under its first without its
    seq again, and a story of quotes alone needs no heading to tell quotes from the model's
    words. The 1.5B model's chapters of LoCoMo 1 spent ~20 tokens a chapter more on the same
    lines, and its memory folded three chapters that the extractive memory kept whole."""
    from kioku.grounding.records import item_of_line
    from kioku.rendering import render_story
    from kioku.scenes import scenes_in
    from kioku.structure import KeyLine
    from kioku.summarizer import Line

    said = [
        ("Jon", "Lost my job as a banker yesterday. I'm gonna start my own dance studio."),
        ("Gina", "Unfortunately, I also lost my job at Door Dash this month."),
        ("Jon", "I love all dances. Contemporary is my top pick, since I was a kid."),
        ("Gina", "Let's go to a dance class! It'll be so much fun."),
    ]
    entries = tuple(
        LogEntry(
            seq=n,
            message=(Message.user if who == "Jon" else Message.assistant)(
                text, author=who, at=AT + timedelta(minutes=n)
            ),
            tokens=COUNTER.count(text),
        )
        for n, (who, text) in enumerate(said)
    )
    ext = ExtractiveSummarizer(COUNTER).summarize(task(entries=entries, character="Gina"))
    lines = [Line.from_json(r) for r in ext.data["lines"]]
    assert len({ln.seq for ln in lines}) < len(lines)  # a message of two sentences, kept whole
    keys = tuple(item_of_line(ln) for ln in lines)
    assert all(isinstance(k, KeyLine) for k in keys)
    story = render_story(Record(key_lines=keys), "en", scenes_in(ext.data))  # type: ignore[arg-type]
    assert "Key lines" not in story
    assert story.splitlines()[1].startswith("- #0 Jon: Lost my job as a banker yesterday")
    assert story.splitlines()[2] == "     Jon: I'm gonna start my own dance studio."
    # a character a line for "- #0 " against "[0] ": never a heading, nor a seq again
    assert len(story) <= len(ext.text) + len(lines) + 1
    # beside the model's own lines, the quotes keep their heading
    event = Record(events=(record_from_data(GOOD).events[0],), key_lines=keys)  # type: ignore[arg-type]
    assert "Key lines (verbatim):" in render_story(event, "en")


def test_verbal_tics_are_named_in_the_prompt_and_kept_out_of_memory() -> None:
    rec = dict(GOOD)
    rec["events"] = [
        {"seq": 10, "text": "Ren asked about the town, nya."},
        {"seq": 13, "text": "Aoi often uses her catchphrase at the end of sentences."},
    ]
    rec["key_lines"] = [
        {
            "seq": 13,
            "speaker": "Aoi",
            "text": "Then I'll wait for you at the shrine every Saturday, nya.",
        }
    ]
    model = ScriptedModel([reply(rec)])
    s = chronicler(model).summarize(task(avoid_phrases=("nya",)))
    asked = model.history[0].messages[-1].content
    assert 'These phrases are verbal tics of this conversation; never write them: "nya".' in asked
    assert "nya" not in s.text.lower()
    assert "catchphrase" not in s.text
    assert "Ren asked about the town" in s.text
    assert "tics_removed" in s.events


# --- async, backlog ----------------------------------------------------------------------------


class AsyncWrap:
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model

    async def complete(self, request: ChatRequest) -> Completion:
        return self.model.complete(request)


def test_async_chronicler_behaves_like_the_sync_one() -> None:
    script: list[str | Completion] = [
        "I'm sorry, I can't help.",
        Completion(reply(GOOD)[:50], "length"),
        reply(GOOD),
    ]
    sync_model, async_model = ScriptedModel(list(script)), ScriptedModel(list(script))
    s = chronicler(sync_model).summarize(task())
    a = asyncio.run(
        AsyncLLMChronicler(
            AsyncWrap(async_model), COUNTER, ExtractiveSummarizer(COUNTER)
        ).summarize(task())
    )
    assert a == s
    assert async_model.history == sync_model.history


def auto_reply(request: ChatRequest) -> str:
    """A well-behaved chronicler: one event per range it is asked about (a synopsis shows the
    chapters' ranges, a chapter its messages)."""
    m = re.search(r"#(\d+)–#(\d+)", request.messages[-1].content)
    first, last = (int(m.group(1)), int(m.group(2))) if m else span(request)
    return reply(
        {"events": [{"seq": first, "text": f"Things happened between {first} and {last}."}]}
    )


def test_summarize_transcript_folds_chapters_into_a_synopsis() -> None:
    msgs = tuple(
        Message.user(f"message number {i} " + "word " * 30, author="Ren") for i in range(12)
    )
    transcript = Transcript(
        messages=msgs, meta=tuple({} for _ in msgs), user="Ren", character="Aoi"
    )
    profile = replace(
        LOCAL_8K, summary_chunk=120, chapter_tokens=60, major_gc=40, synopsis_tokens=80
    )
    out_buf = io.StringIO()
    model = ScriptedModel(default=auto_reply)
    result = summarize_transcript(
        transcript, model, COUNTER, profile, console=Console(file=out_buf, width=100)
    )
    kinds = [t.kind for t, _ in result.summaries]
    # chapters are sized on the prompt the chronicler sends, not on the messages' text
    logged = [LogEntry(i, m, COUNTER.count(m.text)) for i, m in enumerate(msgs)]
    assert kinds.count("chapter") == len(chapter_ranges(logged, profile, COUNTER, "en")) > 1
    assert "synopsis" in kinds
    mem = result.memory
    assert mem.synopsis is not None and mem.synopsis.first_seq == 0
    assert mem.items[-1].last_seq == 11
    # every seq covered exactly once
    covered = [s for i in mem.items for s in range(i.first_seq, i.last_seq + 1)]
    assert covered == list(range(12))
    assert result.text.startswith("⟦The story so far")
    assert "## ⟦Synopsis (#0–" in result.text
    log = out_buf.getvalue()
    assert "chapter #0–" in log and "synopsis #0–" in log
    # each chapter after the first saw the memory so far as context
    assert all(isinstance(s, Summary) for _, s in result.summaries)


def test_chunks_respect_the_budget() -> None:
    es = [LogEntry(i, Message.user("x"), tokens=t) for i, t in enumerate([5, 5, 5, 50, 5])]
    runs = chunks(es, 12, size=lambda e: e.tokens)
    assert [[e.seq for e in c] for c in runs] == [[0, 1], [2], [3], [4]]
    # a deleted message (0 tokens) is never a chapter of its own: it joins the next run
    es = [LogEntry(i, Message.user("x"), tokens=t) for i, t in enumerate([0, 50, 5])]
    assert [[e.seq for e in c] for c in chunks(es, 12, size=lambda e: e.tokens)] == [[0, 1], [2]]


# --- compaction stats (kioku/stats.py) ---------------------------------------------------------


def test_compaction_stats_from_the_store_log() -> None:
    from kioku.stats import compaction_stats, stats_table
    from kioku.store import Store

    store = Store.open("sqlite://")
    for cid in ("c1", "c2"):  # events of a conversation that does not exist are not kept
        store.ensure_conversation(cid)
    for d, out in ((20.0, 900), (30.0, 1100), (27.0, 1000)):
        store.log("c1", "chapter", duration_s=d, input_tokens=12000, output_tokens=out)
    store.log("c1", "synopsis", duration_s=34.0, input_tokens=5000, output_tokens=2400)
    store.log("c1", "refusal", detail="I'm sorry")
    store.log("c1", "retry")
    store.log("c2", "forced_cut", outcome="cut", first_seq=0, last_seq=99)
    store.log("c2", "chapter", outcome="failed", duration_s=300.0)

    everything = compaction_stats(store)
    assert everything["rows"] == 8 and everything["conversations"] == 2
    ch = everything["events"]["chapter"]
    assert ch["count"] == 4 and ch["outcomes"] == {"ok": 3, "failed": 1}
    assert ch["median_duration_s"] == 28.5
    assert ch["mean_output_tokens"] == 1000
    assert list(everything["events"]) == ["chapter", "synopsis", "refusal", "retry", "forced_cut"]

    one = compaction_stats(store, "c1")
    assert one["events"]["chapter"]["median_duration_s"] == 27.0
    assert "forced_cut" not in one["events"]
    assert one["events"]["refusal"]["median_duration_s"] is None

    buf = io.StringIO()
    Console(file=buf, width=120).print(stats_table(everything))
    table = buf.getvalue()
    assert "chapter" in table and "28.5" in table and "failed 1, ok 3" in table
    store.close()


def test_a_short_record_mentioning_a_refusal_word_is_not_a_refusal() -> None:
    said = Message("assistant", (Part("speech", "我昨晚无法入睡。", speaker="葵"),), "葵", AT)
    rec = {"events": [{"seq": 11, "text": "葵说她昨晚无法入睡。"}]}
    model = ScriptedModel([reply(rec)])
    s = chronicler(model).summarize(task(lang="zh", entries=(LogEntry(11, said, 10),)))
    assert len(reply(rec)) < 400
    assert s.source == "llm" and s.events == () and "无法入睡" in s.text


@pytest.mark.slow
@pytest.mark.llama
def test_real_model_output_is_stored_only_if_it_passes_the_guards(
    llama_server: LlamaServer,
) -> None:
    """The base gemma-3-270m cannot write a record: whatever it answers, nothing it wrote is
    stored unless it parsed; the extractive chapter stands in, and the events say why."""
    from kioku.client import OpenAIChatModel

    with OpenAIChatModel(llama_server.url, model=llama_server.alias) as model:
        ch = LLMChronicler(
            model,
            COUNTER,
            ExtractiveSummarizer(COUNTER),
            ChroniclerConfig(max_attempts=1, system_role=False),
        )
        s = ch.summarize(task(target_tokens=16, ceiling_tokens=64))
    if s.source == "llm":  # it would have had to produce the JSON shape within 64 tokens
        assert s.data["format"] == "kioku.chronicle/1"
    else:
        assert s.events[-1] == "fallback"
        assert s.events[0] in ("truncated", "unparseable", "refusal")
        assert "[11] Aoi: This is my first time here." in s.text  # "Never." says nothing alone


# --- what a record keeps: the model's lines and the span's, chosen together -------------------


def museum_day() -> tuple[LogEntry, ...]:
    """Mel's day at the museum, said over four messages on 6 July, one of them with a date."""
    day = datetime(2023, 7, 6, 18, 0)
    said = [
        ("Mel", "Yesterday I took the kids to the museum and they loved the dinosaur hall."),
        ("Caro", "That sounds lovely, what did they like best?"),
        ("Mel", "My son drew the dinosaur skeleton twice in his sketchbook."),
        ("Caro", "I am going to a transgender conference this month."),
    ]
    return tuple(
        LogEntry(
            seq=20 + i,
            message=Message.user(text, author=who, at=day + timedelta(minutes=i))
            if who == "Caro"
            else Message.assistant(text, author=who, at=day + timedelta(minutes=i)),
            tokens=20,
        )
        for i, (who, text) in enumerate(said)
    )


def museum_task(**kw: Any) -> SummaryTask:
    return task(**{"entries": museum_day(), "character": "Mel", "user_name": "Caro", **kw})


def test_a_model_line_that_says_less_than_its_message_gives_its_place_to_the_message() -> None:
    # "Mel went to the museum" is grounded, but its message says when and what the kids loved:
    # in a room for three lines, the message's own words are kept and the paraphrase is not
    model = ScriptedModel(["- Mel took the kids to the museum (#20)\n- Caro asked Mel (#21)"])
    s = chronicler(model).summarize(museum_task(target_tokens=70))
    assert s.source == "llm" and s.tokens <= 70
    assert "Yesterday (5 July 2023)" in s.text
    assert "dinosaur hall" in s.text
    assert "Mel took the kids to the museum" not in s.text
    assert s.data["grounding"]["trimmed"] >= 1
    assert all(a["why"] == "filled" for a in s.data["added"])


def test_a_short_line_of_the_model_is_kept_where_its_long_message_does_not_fit() -> None:
    long_day = (
        "Yesterday I took the kids to the museum, and after the dinosaur hall we walked along "
        "the river, had ice cream at the old kiosk, missed our bus, and drove home in the rain."
    )
    entries = (
        LogEntry(20, Message.assistant(long_day, author="Mel", at=datetime(2023, 7, 6)), 40),
    )
    model = ScriptedModel(["- Mel took the kids to the museum (#20)"])
    s = chronicler(model).summarize(museum_task(entries=entries, target_tokens=30))
    assert "- #20 Mel told Caro: took the kids to the museum" in s.text and s.tokens <= 30
    assert s.data.get("added", []) == []


def test_a_claim_the_story_belies_is_always_kept() -> None:
    # what no single line of the span says (Aoi's words against her thought) goes first
    s = chronicler(ScriptedModel([reply(GOOD)])).summarize(task(target_tokens=60))
    assert "Ostensibly: Aoi told Ren: she has never been to this town. Actually:" in s.text


def test_memory_shows_when_each_scene_of_a_model_chapter_was_said() -> None:
    s = chronicler(ScriptedModel([reply(GOOD)])).summarize(task())
    assert s.data["scenes"] == [{"seq": 10, "at": "2024-03-01T21:00:00", "who": ["Ren", "Aoi"]}]
    item = MemoryItem("chapter", 10, 13, s.text, s.tokens, data=s.data)
    text, _ = render_memory(Memory(chapters=(item,)))
    chapter = text.split("## ⟦Chapter 1", 1)[1].split("## ⟦About the user")[0]
    story = [ln for ln in chapter.splitlines() if ln.startswith(("—", "- #"))]
    assert story[0] == "— 1 March 2024 · Ren, Aoi —"  # before the chapter's first line
    # the facts about the user, gathered from every chapter, under the scene they were said in
    facts = text.split("About the user (facts)", 1)[1].splitlines()
    assert facts[1:3] == [
        "— 1 March 2024 · Ren, Aoi —",
        "- #12 Ren starts a new job in April and can visit only on weekends.",
    ]


def test_a_synopsis_keeps_the_lines_of_what_it_folds_when_the_model_writes_little() -> None:
    model = ScriptedModel(["#0 Aoi: painted the red boat by the pier"])
    t = boats_and_aoi_synopsis(120)
    s = chronicler(model).summarize(t)
    assert s.source == "llm" and s.tokens <= 120
    assert "red boat" in s.text
    # the older part and the newer part each keep their share of the room
    assert "boat by the pier" in s.text.replace("red boat by the pier", "")
    assert "Ren" in s.text and "April" in s.text
    assert {a["why"] for a in s.data["added"]} == {"filled"}


def test_the_extractive_synopsis_reads_a_model_chapter_line_by_line() -> None:
    ch2 = chapter_item(10, 13, GOOD)
    t = SummaryTask(kind="synopsis", target_tokens=200, chapters=(ch2,), lang="en")
    s = ExtractiveSummarizer(COUNTER).summarize(t)
    assert "###" not in s.text and "memory:" not in s.text
    assert "[12] Ren: Ren starts a new job in April" in s.text or "[12] user:" in s.text


def test_a_thread_keyword_before_a_citation_is_read_as_a_cited_line() -> None:
    from kioku.reply_format import parse_lines

    got = parse_lines("DONE #12: Ren starts a new job in April.")
    assert not got.threads and [(ln.seqs, ln.text) for ln in got.lines] == [
        ((12,), "Ren starts a new job in April.")
    ]


def test_a_thread_named_by_a_keyword_is_no_thread() -> None:
    from kioku.reply_format import parse_lines

    # the 1.5B model on RealPersonaChat DD: stored, it read "DONE open: …" in memory
    text = (
        "DONE OPEN: ジムを探しています。\nOPEN gym: ジムを探す\nOPEN thread: 3段腹\nOPEN 1: a trip"
    )
    got = parse_lines(text)
    assert [th.id for th in got.threads] == ["gym"] and not got.lines
    assert got.unread == ("DONE OPEN: ジムを探しています。", "OPEN thread: 3段腹", "OPEN 1: a trip")


def chapter_of(reply: str) -> str:
    """The chapter the chronicler stores of `task()` when the model replies `reply`."""
    return chronicler(ScriptedModel([reply])).summarize(task()).text


def test_a_thread_that_copies_a_message_is_left_for_the_message() -> None:
    # the 1.5B model wrote eight such "threads" for one chapter; threads always stay, so
    # they took the room of the chapter's lines
    copied = "DONE ren: I start a new job in April, so I can only visit on weekends."
    storyline = "OPEN aoi-past: What Aoi hides about the town"
    text = chapter_of(f"- Aoi said she has never been here (#11)\n{copied}\n{storyline}")
    assert "[resolved] ren" not in text and "[open] aoi-past: What Aoi hides" in text
    assert "new job in April" in text  # the message itself, as a line


def test_a_thread_that_quotes_its_writer_is_a_copy_and_two_ids_of_one_note_are_one() -> None:
    # the 1.5B model on LoCoMo 1: "DONE 5: Gina: It's a wild ride" and "DONE 2: …" the same
    quoted = "DONE ren: Ren: I start a new job in April, so I can only visit on weekends."
    twice = "OPEN past: What Aoi hides about the town\nOPEN town: What Aoi hides about the town"
    text = chapter_of(f"- Aoi said she has never been here (#11)\n{quoted}\n{twice}")
    assert "[resolved] ren" not in text and "new job in April" in text
    assert text.count("What Aoi hides about the town") == 1, text


def test_a_thread_named_for_a_person_is_dropped_as_their_words() -> None:
    # the 1.5B model on RealPersonaChat CP: "DONE ac #141: 何が爆弾というケーキですね？",
    # shown in memory as "[解決] ac: 何が爆弾…", a line AC never said
    named = "OPEN aoi: Where Aoi grew up"
    storyline = "OPEN aoi-past: What Aoi hides about the town"
    text = f"- Aoi said she has never been here (#11)\n{named}\n{storyline}"
    s = chronicler(ScriptedModel([text])).summarize(task())
    assert s.source == "llm" and "Where Aoi grew up" not in s.text
    assert "[open] aoi-past: What Aoi hides about the town" in s.text, s.text
    assert s.data["grounding"]["dropped"].get("author") == 1, s.data["grounding"]


def test_a_copied_message_with_its_writer_in_front_gives_way_to_the_message() -> None:
    model = ScriptedModel(["- Aoi Then I'll wait for you at the shrine every Saturday, nya. (#13)"])
    s = chronicler(model).summarize(task())
    assert "Aoi Then" not in s.text
    assert "#13 Aoi: Then I'll wait for you at the shrine every Saturday, nya." in s.text


def test_a_story_line_that_retells_its_message_gives_way_to_the_message() -> None:
    # the 1.5B model on LoCoMo 0 retold #72 in a chapter, and the retelling took the room of
    # #70's "They talked about different therapeutic methods", which answered a question
    retold = (
        "- Aoi looked away from the old lighthouse she climbed as a child, her first time (#11)"
    )
    s = chronicler(ScriptedModel([retold])).summarize(task())
    assert "her first time" not in s.text, s.text
    assert "Aoi looked away from the old lighthouse she had climbed as a child." in s.text


def test_an_unconfirmed_claim_that_retells_its_message_gives_way_to_the_message() -> None:
    # the 1.5B model on LoCoMo 0: "#63 Melanie told Caroline: mentioned that she went camping
    # in the mountains last week … (claim, unconfirmed)", in more room than #63's own words,
    # which are as much her claim; a claim the story bears out or belies stays (`GOOD`)
    claim = {
        "seq": 13,
        "speaker": "Aoi",
        "listener": "Ren",
        "claim": "she will wait for Ren at the shrine every Saturday",
        "supported_by": "none",
    }
    s = chronicler(ScriptedModel([reply({"claims": [claim]})])).summarize(task())
    assert "told Ren" not in s.text, s.text
    assert "#13 Aoi: Then I'll wait for you at the shrine every Saturday" in s.text
    kept = chronicler(ScriptedModel([reply(GOOD)])).summarize(task())
    assert "Aoi told Ren: she has never been to this town" in kept.text


def test_a_fact_about_the_user_in_the_third_person_stays_beside_its_message() -> None:
    s = chronicler(ScriptedModel([reply(GOOD)])).summarize(task())
    assert "- #12 Ren starts a new job in April and can visit only on weekends." in s.text
