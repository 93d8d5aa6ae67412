"""Prompt templates: every task and language renders, versioned, with the structure the model sees."""

from __future__ import annotations

import re
from string import Template
from typing import Literal

import pytest

from kioku.chronicle_prompt import build_compress_request, build_request
from kioku.errors import ConfigError
from kioku.memory import MemoryItem
from kioku.messages import LogEntry, Message, Part
from kioku.prompts import LANGS, TASKS, load, resolve_lang, template
from kioku.structure import Event, Record, ThreadNote
from kioku.summarizer import SummaryTask

# v4: a chapter's (or cut's) instructions are English in every language (asked in Japanese, the
# 1.5B model described the talk instead of writing its facts); the transcript is unnumbered and
# the lines cite nothing (shown numbers, it wrote one line per number): issue 20
RULES = (
    "- <name> <fact>",
    "Skip every message that holds no such fact",
    "write it as their words",
    "Write only what the messages say",
    "verbal tics",
)
WRITE_IN = {"en": "Write in English.", "ja": "Write in Japanese", "zh": "Write in Chinese"}
TOOL_LABEL = {"en": "[tool result]", "ja": "[ツール結果]", "zh": "[工具结果]"}
VERSIONS = {"chapter": 4, "cut": 4, "synopsis": 3, "compress": 3}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("lang", LANGS)
def test_every_template_loads_with_a_version_and_all_sections(task: str, lang: str) -> None:
    text, version = load(task, lang)
    n = VERSIONS.get(task, 1)
    assert version == f"{task}-{lang}-v{n}"
    assert re.search(rf"^version: {n}$", text, re.MULTILINE)
    t = template(task, lang)
    for section in ("system", "user", "none", "avoid", "retry"):
        assert t.has(section), section
    # every placeholder is a known one: a typo would raise at render time in production
    known = {
        "user_name",
        "character",
        "max_lines",
        "avoid",
        "first",
        "last",
        "open_threads",
        "retry",
        "transcript",
        "records",
        "record",
        "lines",
        "phrases",
        "reason",
    }
    for name, body in t.sections:
        names = {
            m.group("named") or m.group("braced")
            for m in Template.pattern.finditer(body)
            if m.group("named") or m.group("braced")
        }
        assert names <= known, (name, names - known)


def entries() -> tuple[LogEntry, ...]:
    return (
        LogEntry(5, Message.user("I love hiking.", author="Ren")),
        LogEntry(
            6,
            Message(
                "assistant",
                (
                    Part("speech", "I am a princess.", speaker="Mika"),
                    Part("thought", "I am a maid.", speaker="Mika"),
                ),
                author="Mika",
            ),
        ),
    )


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("kind", ["chapter", "cut"])
def test_chapter_and_cut_prompts_carry_the_rules_and_the_transcript(
    lang: str, kind: Literal["chapter", "cut"]
) -> None:
    task = SummaryTask(
        kind=kind,
        target_tokens=300,
        entries=entries(),
        lang=lang,
        character="Mika",
        user_name="Ren",
        avoid_phrases=("desu wa",),
    )
    request, version = build_request(task, max_tokens=856)
    assert version == f"{kind}-{lang}-v{VERSIONS[kind]}"
    assert request.purpose == kind and request.max_tokens == 856
    system, user = request.messages[0].content, request.messages[1].content
    assert "chronicler" in system and TOOL_LABEL[lang] in system  # how to read the transcript
    # what to write comes after the transcript: a small model heeds what it read last
    rules = user[user.index("I am a maid.") :]
    for rule in (*RULES, WRITE_IN[lang]):
        assert rule in rules
    assert "Mika" in system and "Ren" in system
    assert "desu wa" in rules  # the avoided phrase is named
    assert "OPEN " in rules and "DONE " in rules  # threads, by id
    # no concrete example a small model could copy into memory: placeholders only (and in
    # Japanese and Chinese not even "<…>", which the 1.5B model wrapped around its words)
    instructions = system + rules
    assert "```" not in instructions and "Aoi" not in instructions and "アオイ" not in instructions
    assert not re.search(r"#\d", system + user)  # no message numbers to fill in line by line
    assert request.seqs == (5, 6) and "I am a princess." in user and "I am a maid." in user
    assert "$" not in system + user  # no placeholder left behind
    assert template(kind, lang).render("none") in user  # no open threads yet


@pytest.mark.parametrize("lang", LANGS)
def test_synopsis_prompt_shows_the_records_and_open_threads(lang: str) -> None:
    rec = Record(
        events=(Event(5, "Ren and Mika met."),),
        threads=(ThreadNote("mika-secret", "Mika's secret", "open", 6),),
    )
    item = MemoryItem("chapter", 0, 9, "x", 10, data=rec.to_data(lang))
    old = MemoryItem("synopsis", 0, 0, "[0] Ren: hello", 5)
    task = SummaryTask(
        kind="synopsis", target_tokens=500, previous=old, chapters=(item,), lang=lang
    )
    request, version = build_request(task, max_tokens=1256)
    user = request.messages[1].content
    assert version == f"synopsis-{lang}-v3"
    assert "[#0–#0]\n#0 Ren: hello" in user  # an extractive synopsis, in the line form
    assert "[#0–#9]" in user and "Ren and Mika met." in user
    assert "mika-secret: Mika's secret (#6)" in user
    assert "#0" in user and "#9" in user


@pytest.mark.parametrize("lang", LANGS)
def test_compress_and_retry_sections(lang: str) -> None:
    rec = Record(events=(Event(5, "Ren and Mika met."),))
    task = SummaryTask(kind="chapter", target_tokens=100, entries=entries(), lang=lang)
    request, version = build_compress_request(
        task, rec, max_tokens=456, retry_reason="invalid JSON"
    )
    assert version == f"compress-{lang}-v3"
    system, user = request.messages[0].content, request.messages[1].content
    assert "4" in system  # at most 4 lines (never fewer), the record has 1
    narration = {"en": "narration", "ja": "地の文", "zh": "旁白"}[lang]
    assert f"\n#5 {narration}: Ren and Mika met.\n" in user  # the record in the line form
    assert "invalid JSON" in user
    assert user.index("invalid JSON") > user.index("Ren and Mika met.")


def test_language_resolution_and_unknown_task() -> None:
    assert (
        resolve_lang("ja-JP") == "ja"
        and resolve_lang("zh_CN") == "zh"
        and resolve_lang("fr") == "en"
    )
    assert template("chapter", "fr").version == "chapter-en-v4"
    with pytest.raises(ConfigError, match="tasks are"):
        load("poem", "en")
    with pytest.raises(ConfigError, match="needs a value"):
        template("chapter", "en").render("user")
