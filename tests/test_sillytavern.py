"""A real SillyTavern 1.12.6 with the kioku extension, driven through its page in headless
Chromium against `kioku serve` and a scripted upstream that records every request.

One chat of 30 turns (enough to fold twice), then what users do to it: edit a message memory
already covers, swipe, delete, continue, impersonate, press Test Message; a new chat with the
same character and back; the Cut button; and a client without the extension that forgets to
switch its static header. Asserted on kioku's stored log and on what the upstream received.
Needs `.ci/sillytavern.sh` (node, npm) and Chromium: skipped locally without them, a failure in
CI.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kioku.importer import import_transcript
from kioku.memory import coverage_gaps
from kioku.outcomes import stand_in
from kioku.revisions import versions
from tests.tavern import Tavern, wait_for
from tests.tavern_stack import IMPERSONATED, Stack, alternates, running, same
from tests.test_console import browser

pytestmark = pytest.mark.browser
__all__ = ["browser"]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running(tmp_path) as s:
        yield s


def test_sillytavern_with_the_kioku_extension(stack: Stack, browser: Any) -> None:
    t = Tavern(browser, stack.tavern.url)
    t.open()
    t.connect()
    t.select_character("Seraphina")
    chat1 = t.chat_id()

    # 1. thirty turns: each message stored once, under the chat's own id, and memory folds
    sent = [f"Turn {i}: tell me about lantern {i} and the river." for i in range(30)]
    for text in sent:
        t.send(text)
    stack.idle()
    rows = stack.rows(chat1)
    assert [r[2] for r in rows if r[1] == "user"] == sent
    assert len(rows) == 61 and rows[0][2] == t.messages()[0]["mes"]  # the greeting, then turns
    shown = t.messages()
    assert all(same(r[2], m["mes"]) for r, m in zip(rows, shown, strict=True))
    info = stack.store.conversation(chat1)
    chapters = [i for i in stack.store.items(chat1, "active") if i.kind == "chapter"]
    assert info.raw_start > 0 and len(chapters) >= 2 and info.character == "Seraphina"
    assert coverage_gaps(stack.store.items(chat1, "active"), info.raw_start) == []
    counters = stack.store.counters(chat1)
    assert not counters.get("edits")  # SillyTavern strips "Seraphina: ": not an edit
    assert {e.message.author for e in stack.store.entries(chat1) if e.role == "user"} == {"Alex"}
    # the panel shows what kioku remembers, numbered as SillyTavern numbers its messages, and
    # marks the messages memory holds; its labels need no CJK font
    t.click("#kioku_refresh")
    wait_for(lambda: t.js("return $('#kioku_memory details[data-kind=chapter]').length") >= 2,
             20, "chapters in the kioku panel")  # fmt: skip
    status = t.js("return $('#kioku_status').text()")
    assert f"messages #0–#{info.raw_start - 1} are in memory" in status
    # a chapter standing in for the model's summary (a forced cut's) is marked, with why
    marks = t.js(
        "return $('#kioku_memory details[data-kind=chapter] .kioku-stand-in')"
        ".map((i, e) => $(e).text()).get()"
    )
    assert marks == [f"stand-in (extractive: {m})" for c in chapters if (m := stand_in(c.data))]
    assert "profile tavern-test, window 8192 tokens" in status
    marked = t.js("return $('#chat .mes.kioku-in-memory').map((i, e) => $(e).attr('mesid')).get()")
    assert sorted({int(m) for m in marked}) == list(range(info.raw_start)), marked
    assert t.js("return $('#kioku_console').attr('href')") == f"{stack.tavern.kioku_url}/console/"
    labels = t.js("return $('#kioku_settings').find('b, label, .menu_button, summary').text()")
    assert labels and not re.search(r"[\u3000-\u9fff]", labels)

    # 2. an edit of a message a chapter covers: versions kept, chapter stale, prompt corrected
    target = next(c for c in chapters if c.last_seq - c.first_seq >= 2)
    seq = next(
        r[0] for r in rows if r[1] == "assistant" and target.first_seq < r[0] <= target.last_seq
    )
    old = stack.store.entries(chat1, seq, seq)[0].text
    requests = len(stack.up.chats())
    t.edit(seq, "*Seraphina admits the lantern was BLUE all along.*")
    # the extension sends the whole chat on the edit: kioku has it before the next request
    edited = "*Seraphina admits the lantern was BLUE all along.*"
    wait_for(lambda: stack.store.entries(chat1, seq, seq)[0].text == edited, 20, "the edit")
    assert len(stack.up.chats()) == requests
    assert [v["change"] for v in versions(stack.store, chat1, seq)] == ["edit"]
    t.send("So what colour was the lantern?")
    stack.idle()
    prompt = "\n".join(m["content"] for m in stack.up.chats()[-1]["messages"])
    assert old not in prompt  # the stale chapter's stand-in or its re-summary: corrected
    assert stack.store.counters(chat1)["edits"] == 1
    assert any(i.replaces == (target.id,) or i.stale for i in stack.store.items(chat1))

    # 3. a swipe replaces the last reply in place
    n = stack.store.conversation(chat1).next_seq
    t.swipe_right()
    stack.idle()
    assert stack.store.conversation(chat1).next_seq == n
    last = stack.store.entries(chat1)[-1]
    assert same(last.text, t.messages()[-1]["mes"])
    assert [v["change"] for v in versions(stack.store, chat1, last.seq)] == ["regenerate"]

    # 4. deleting an exchange (a user message and its reply), then going on
    gone = t.messages()[-4:-2]
    t.delete(len(t.messages()) - 4)
    t.delete(len(t.messages()) - 3)
    t.send("Let us forget that.")
    stack.idle()
    deleted = [e for e in stack.store.entries(chat1) if e.message.is_empty()]
    old = [v["text"] for e in deleted for v in versions(stack.store, chat1, e.seq)]
    assert len(old) == 2 and all(same(a, m["mes"]) for a, m in zip(old, gone, strict=True))
    assert all(same(r[2], m["mes"]) for r, m in zip(stack.rows(chat1), t.messages(), strict=True))

    # 5. continue extends the last reply: no new message
    n = stack.store.conversation(chat1).next_seq
    t.continue_reply()
    stack.idle()
    assert stack.store.conversation(chat1).next_seq == n
    last = stack.store.entries(chat1)[-1]
    assert "adds a word about the river" in last.text and same(last.text, t.messages()[-1]["mes"])
    assert stack.store.counters(chat1)["continuations"] == 1

    # 6. impersonate: the text lands in the send box and is stored only once sent, as Alex's
    before = stack.rows(chat1)
    t.option("option_impersonate")
    wait_for(lambda: t.js("return $('#send_textarea').val()") == IMPERSONATED, 30, "the text")
    t.idle()
    stack.idle()
    assert stack.rows(chat1) == before
    t.send(IMPERSONATED)
    stack.idle()
    assert stack.rows(chat1)[-2][1:] == ("user", IMPERSONATED)

    # 7. Test Message: a one-message chat answered without memory, and not stored
    before = stack.rows(chat1)
    t.test_message()
    stack.idle()
    assert "successful" in t.toasts()
    assert stack.rows(chat1) == before
    [hi] = stack.up.chats()[-1]["messages"]
    assert hi["role"] == "user" and hi["content"].endswith("Hi")

    # 8. a new chat with the same character is its own conversation; back to the first one
    t.new_chat()
    chat2 = t.chat_id()
    assert chat2 != chat1
    t.send("Hello again, a new story.")
    t.send("Where are we now?")
    stack.idle()
    assert [r[2] for r in stack.rows(chat2) if r[1] == "user"] == [
        "Hello again, a new story.",
        "Where are we now?",
    ]
    n1 = stack.store.conversation(chat1).next_seq
    t.open_chat(chat1)
    t.send("I am back in the first story.")
    stack.idle()
    assert stack.store.conversation(chat1).next_seq == n1 + 2
    assert stack.store.counters(chat1)["edits"] == 1  # the reopened chat matched exactly
    # what the model reads of chat 1: Test Message's "Hi" is not in it, the impersonated line
    # once, as the user's
    back = stack.up.chats()[-1]["messages"]
    assert not [m for m in back if m["content"].endswith("\n\nHi") or m["content"] == "Hi"]
    assert [m["role"] for m in back if IMPERSONATED in m["content"]] == ["user"]

    # 9. Cut (区切り) from the panel: everything folded, the raw window starts now
    t.click("#kioku_cut")
    t.confirm()
    wait_for(lambda: stack.store.conversation(chat1).raw_start == stack.store.conversation(chat1).next_seq,
             30, "the cut")  # fmt: skip
    assert any(i.source == "extractive" for i in stack.store.items(chat1, "active"))

    # SillyTavern's saved chat, imported, reads as kioku's live log (not one message more)
    [saved] = (stack.tavern.data / "default-user" / "chats").glob(f"*/{chat1}.jsonl")
    wait_for(lambda: "I am back in the first story." in saved.read_text(), 30, "the saved chat")
    out = import_transcript(stack.svc.kioku("tavern"), saved, "sillytavern",
                            conversation_id="imported", progress=False)  # fmt: skip
    imported = stack.store.entries("imported")
    assert out["imported"] == len(stack.rows(chat1)) == len(imported)
    assert all(same(a[2], b.text) for a, b in zip(stack.rows(chat1), imported, strict=True))
    live_authors = [
        e.message.author for e in stack.store.entries(chat1) if not e.message.is_empty()
    ]
    assert [e.message.author for e in imported] == live_authors
    assert all(e.message.at is not None for e in imported)

    # 10. without the extension: a static header the user forgets to switch is refused, not merged
    t.set_kioku_enabled(False)
    t.set_headers("X-Kioku-Conversation: static-chat")
    t.open_chat(chat2)
    t.send("Static header, chat two.")
    stack.idle()
    static = stack.rows("static-chat")
    assert [r[2] for r in static if r[1] == "user"][-1] == "Static header, chat two."
    t.open_chat(chat1)
    requests = len(stack.up.chats())
    t.js("$('#send_textarea').val('Sent to the wrong conversation').trigger('input')")
    t.click("#send_but")
    wait_for(lambda: "install the kioku extension" in t.toasts(), 30, "kioku's 409 in a toast")
    t.idle()
    stack.idle()
    assert stack.rows("static-chat") == static
    assert len(stack.up.chats()) == requests  # nothing reached the upstream

    # every request the upstream got alternates roles after the system message
    assert all(alternates(b["messages"]) for b in stack.up.chats())
    # Seraphina's lorebook entries (keyword "forest", "Eldoria"…) come and go with the last
    # messages; the extension marks them, and kioku sends them after the chat, never in the
    # card: no cache break of the card in either chat (the same chats counted one each before)
    for cid in (chat1, chat2):
        assert not stack.store.counters(cid).get("card_changes")
        assert "What is Eldoria?" not in stack.store.conversation(cid).system_prompt
    lore = [b["messages"] for b in stack.up.chats() if "What is Eldoria?" in str(b["messages"])]
    assert lore and all("What is Eldoria?" not in str(m[0]["content"]) for m in lore)
    assert all("What is Eldoria?" in str(m[-1]["content"]) for m in lore)
    assert t.js("return $('#kioku_card').text()") == ""

    # 11. Delete from kioku (the panel asks first): every row of chat 2 goes, chat 1 stays
    t.set_headers("")  # the extension again, as step 10 found it
    t.set_kioku_enabled(True)
    t.open_chat(chat2)
    t.click("#kioku_delete")
    t.confirm()
    wait_for(lambda: not stack.store.tenant_counts(chat2), 30, "the delete")
    assert stack.rows(chat1)
    # the operator console shows the same count
    browser.get(f"{stack.tavern.kioku_url}/console/")
    wait_for(lambda: t.js("return !!document.getElementById('api-key')"), 20, "the console")
    t.find("#api-key").send_keys(stack.tavern.kioku_key)
    t.find("#key-submit").click()
    wait_for(lambda: t.js("return document.querySelector(`[data-testid=conversation][data-id='${arguments[0]}']`)", chat1),
             20, "the conversation in the console").click()  # fmt: skip
    wait_for(lambda: t.js("return !!document.getElementById('card-changes-box')"), 20, "the view")
    assert t.js("return document.getElementById('card-changes-box').hidden")
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not [m for m in severe if "kioku" in m and "404" not in m and "409" not in m], severe
