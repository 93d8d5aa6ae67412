"""Every kind of chat SillyTavern 1.12.6 has, through its real page (headless Chromium) with the
kioku extension, against `kioku serve` and a scripted upstream (issue 22):

- a group chat of two characters, ten turns and a fold, who said what kept per character;
- with SillyTavern's context at 1,500 tokens (it resends only the last messages): an edit and
  a delete of messages it no longer resends, a branch and a checkpoint that start with their
  parent's memory, a rename that keeps the chat's conversation, and the panel's edit of a note.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kioku import notes as notes_layer
from kioku.errors import NotFound
from kioku.generations import chapter_task
from kioku.memory import coverage_gaps
from kioku.revisions import versions
from kioku.transcript import render_transcript
from tests.tavern import SillyTavern, Tavern, wait_for
from tests.tavern_stack import PROFILE, Stack, alternates, running, same
from tests.test_console import browser
from tests.test_service_support import words

pytestmark = pytest.mark.browser
__all__ = ["browser"]

GROUP = "Glade friends"
GROUP_CHAT = "Glade friends - 2026-01-01@10h00m00s"


def with_a_group(t: SillyTavern) -> None:
    mika = t.add_character(
        "Mika", "*Mika waves from a branch.* Hi, I'm Mika!", "Mika is a cheerful squirrel spirit."
    )
    t.add_group(GROUP, ["default_Seraphina.png", mika], GROUP_CHAT)


@pytest.fixture
def group_stack(tmp_path: Path) -> Iterator[Stack]:
    with running(tmp_path, setup=with_a_group) as s:
        yield s


@pytest.fixture
def small_context(tmp_path: Path) -> Iterator[Stack]:
    with running(tmp_path, context=1500) as s:
        yield s


def shown(stack: Stack, key: str) -> list[Any]:
    return [e for e in stack.store.entries(key) if not e.message.is_empty()]


def test_a_group_chat_of_two_characters(group_stack: Stack, browser: Any) -> None:
    stack = group_stack
    t = Tavern(browser, stack.tavern.url)
    t.open()
    t.connect()
    t.open_group(GROUP)
    assert t.chat_id() == GROUP_CHAT
    for i in range(10):
        t.send_to_group(f"Turn {i}: both of you, tell me about {words(i, 60)}", replies=2)
    stack.idle()
    key = stack.key(GROUP_CHAT)
    rows = shown(stack, key)
    st = t.sent()
    # every message stored once, each under its speaker: the greetings and the replies of both
    assert [(e.role, e.message.author) for e in rows] == [
        ("user" if m["is_user"] else "assistant", m["name"]) for m in st
    ], (rows[-3:], st[-3:])
    assert all(same(e.text, m["mes"]) for e, m in zip(rows, st, strict=True))
    assert {e.message.author for e in rows if e.role == "assistant"} == {"Seraphina", "Mika"}
    info = stack.store.conversation(key)
    items = stack.store.items(key, "active")
    assert info.raw_start > 0 and items and coverage_gaps(items, info.raw_start) == []
    # the chronicler reads who said what, and its prompt names both characters and the persona
    folded = [e for e in rows if e.seq < info.raw_start]
    transcript = render_transcript(folded)
    assert "Mika (character)" in transcript and "Seraphina (character)" in transcript
    assert "Alex (user)" in transcript
    task = chapter_task(folded, PROFILE, character=info.character)
    assert task.character == "Seraphina and Mika" and task.user_name == "Alex"
    # the model was told who spoke each line (consecutive replies merge into one message for
    # strict chat templates), and asked for the member whose turn it was
    last = stack.up.chats()[-1]["messages"]
    spoken = "\n".join(m["content"] for m in last if m["role"] == "assistant")
    assert "\nMika: " in f"\n{spoken}" and "\nSeraphina: " in f"\n{spoken}"
    assert last[-1]["content"].rstrip().endswith("[Write the next reply only as Mika.]")
    assert all(alternates(b["messages"]) for b in stack.up.chats())


def test_branches_checkpoints_renames_and_edits_beyond_sillytaverns_context(
    small_context: Stack, browser: Any
) -> None:
    stack = small_context
    t = Tavern(browser, stack.tavern.url)
    t.open()
    t.connect()
    t.select_character("Seraphina")
    main = t.chat_id()
    for i in range(20):
        t.send(f"Turn {i}: tell me about {words(i, 40)}")
    stack.idle()
    key = stack.key(main)
    info = stack.store.conversation(key)
    assert info.raw_start > 4, "memory must cover the messages edited below"
    # SillyTavern resends only what fits 1,500 tokens: not the first exchanges
    resent = str(stack.received.bodies[-1]["messages"])
    assert "Turn 0:" not in resent and "Turn 1:" not in resent

    # 1. an edit and a delete of messages SillyTavern no longer resends reach kioku at once
    requests = len(stack.up.chats())
    old = t.messages()[2]["mes"]
    t.edit(2, "*Seraphina admits the lantern was BLUE all along.*")
    wait_for(lambda: "BLUE" in stack.store.entries(key, 2, 2)[0].text, 20, "the edit in kioku")
    assert same(versions(stack.store, key, 2)[0]["text"], old)
    gone = t.messages()[4]["mes"]
    t.delete(4)
    wait_for(lambda: stack.store.entries(key, 4, 4)[0].message.is_empty(), 20, "the delete")
    assert len(stack.up.chats()) == requests  # no request needed
    stale = [i for i in stack.store.items(key) if i.stale or i.replaces]
    assert stale, "the memory over them is written again"
    t.send("What colour was the lantern?")
    stack.idle()
    prompt = "\n".join(str(m["content"]) for m in stack.up.chats()[-1]["messages"])
    assert old not in prompt and gone not in prompt
    assert all(same(e.text, m["mes"]) for e, m in zip(shown(stack, key), t.sent(), strict=True))

    # 2. the panel: SillyTavern's numbers (one message deleted before the raw window), and a note
    t.click("#kioku_refresh")
    info = stack.store.conversation(key)
    wait_for(lambda: f"the raw window starts at #{info.raw_start - 1}"
             in t.js("return $('#kioku_status').text()"), 20, "SillyTavern's numbers")  # fmt: skip
    t.js("$('#kioku_notes_box').attr('open', true)")
    wait_for(lambda: t.js("return $('#kioku_notes').val()"), 20, "the notes in the panel")
    t.js("$('#kioku_notes').val($('#kioku_notes').val() + arguments[0]).trigger('input')",
         "\n- [habit] Alex: keeps a blue lantern by the door")  # fmt: skip
    t.click("#kioku_notes_save")
    wait_for(lambda: "keeps a blue lantern by the door" in notes_layer.render_editable(
        notes_layer.notes(stack.store, key)), 20, "the note in kioku")  # fmt: skip
    # the toast comes with the PUT's answer, which leaves kioku after the note is committed
    wait_for(lambda: "Notes saved" in t.toasts(), 20, "the panel's toast")

    # 3. a branch of a message in the raw window: it starts with all of the parent's memory
    parent_items = stack.store.items(key, "active")
    at = len(t.messages()) - 3
    branch = t.create_branch(at)
    assert branch.startswith(f"Branch #{at} - ")
    t.send("In the branch, I take the other path.")
    stack.idle()
    bkey = stack.key(branch)
    binfo = stack.store.conversation(bkey)
    bitems = stack.store.items(bkey, "active")
    assert [(i.first_seq, i.last_seq, i.text) for i in bitems] == [
        (i.first_seq, i.last_seq, i.text) for i in parent_items
    ]
    assert binfo.raw_start == info.raw_start and coverage_gaps(bitems, binfo.raw_start) == []
    # nothing the parent had summarized is summarized again (the branch's own new turn may
    # pass its trigger: what it schedules starts where the parent's memory ends)
    summarized = [i for i in stack.store.items(key) if i.status in ("active", "ready")]
    covered = max((i.last_seq for i in summarized), default=-1)
    jobs = stack.store.jobs(bkey, "done", "queued", "running")
    assert all(j.first_seq > covered for j in jobs), (jobs, covered)
    assert all(same(e.text, m["mes"]) for e, m in zip(shown(stack, bkey), t.sent(), strict=True))
    assert t.js("return SillyTavern.getContext().chatMetadata.kioku.parent") == main

    # 4. a checkpoint of a message memory covers: it shares what lies below it
    t.open_chat(main)
    mark = 7
    t.create_checkpoint(mark, "Before the river")
    assert t.chat_id() == main  # SillyTavern stays in the chat
    checkpoint = t.open_checkpoint(mark)
    t.send("Back at the checkpoint.")
    stack.idle()
    ckey = stack.key(checkpoint)
    cinfo = stack.store.conversation(ckey)
    citems = stack.store.items(ckey, "active")
    assert citems and coverage_gaps(citems, cinfo.raw_start) == []
    written = {(i.first_seq, i.last_seq, i.text) for i in stack.store.items(key)}
    assert all((i.first_seq, i.last_seq, i.text) in written for i in citems)  # shared
    assert all(same(e.text, m["mes"]) for e, m in zip(shown(stack, ckey), t.sent(), strict=True))

    # 5. a rename keeps the chat's conversation: no new one, no orphan
    t.open_chat(main)
    n = stack.store.conversation(key).next_seq
    t.rename_chat(main, "Our walk in the glade")
    t.send("After the rename.")
    stack.idle()
    assert stack.key("Our walk in the glade") == key
    assert stack.store.conversation(key).next_seq == n + 2
    with pytest.raises(NotFound):
        stack.store.find_conversation("tavern", main)
    names = {c.public_id for c in stack.store.conversations("tavern")}
    assert names == {"Our walk in the glade", branch, checkpoint}
