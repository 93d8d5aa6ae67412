"""Syncing a stateless client's transcript with the log: the pure diff, then the applier with
versions, stale memory, the stand-in in the prompt and the revision swapped in at a fold."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kioku.engine import Kioku
from kioku.errors import MessageTooLarge, SyncConflict
from kioku.memory import coverage_gaps
from kioku.models import Completion, Usage
from kioku.profiles import LOCAL_8K
from kioku.revisions import versions
from kioku.store import Store
from kioku.sync import Incoming, Logged, diff, diff_one, line_key, replace_reply, sync
from tests.test_service_support import SERVICE_PROFILE, words

ROLES = ("user", "assistant")


def logged(texts: list[tuple[str, str]], first: int = 0) -> list[Logged]:
    return [Logged(first + i, r, line_key(r, t)) for i, (r, t) in enumerate(texts)]


def inc(texts: list[tuple[str, str]]) -> list[Incoming]:
    return [Incoming(r, t) for r, t in texts]  # type: ignore[arg-type]


CHAT = [("user", f"u{i}") if i % 2 == 0 else ("assistant", f"a{i}") for i in range(10)]


def test_new_messages_are_appended() -> None:
    plan = diff(logged(CHAT), inc([*CHAT, ("user", "new")]))
    assert plan.appends == (Incoming("user", "new"),)
    assert not plan.edits and not plan.deletes and plan.regenerate is None


def test_a_window_that_dropped_old_messages_deletes_nothing() -> None:
    plan = diff(logged(CHAT), inc([*CHAT[6:], ("user", "new")]))
    assert plan.appends == (Incoming("user", "new"),) and not plan.deletes and not plan.edits


def test_whitespace_a_client_trims_is_not_an_edit() -> None:
    window = [*CHAT[:-1], ("assistant", "  a9 \r\n"), ("user", "new")]
    assert not diff(logged(CHAT), inc(window)).edits


def test_edit_of_an_earlier_message() -> None:
    window = list(CHAT)
    window[3] = ("assistant", "a3 edited")
    plan = diff(logged(CHAT), inc([*window, ("user", "new")]))
    assert [(e.seq, e.message.text) for e in plan.edits] == [(3, "a3 edited")]
    assert plan.appends == (Incoming("user", "new"),)


def test_edit_of_the_first_message_in_the_window() -> None:
    window = [("user", "u4 edited"), *CHAT[5:], ("user", "new")]
    plan = diff(logged(CHAT), inc(window))
    assert [(e.seq, e.message.text) for e in plan.edits] == [(4, "u4 edited")]
    assert not plan.deletes


def test_deletion_in_the_middle() -> None:
    window = [*CHAT[:4], *CHAT[6:], ("user", "new")]
    plan = diff(logged(CHAT), inc(window))
    assert plan.deletes == (4, 5) and not plan.edits


def test_regenerate_drops_the_last_reply() -> None:
    plan = diff(logged(CHAT), inc(CHAT[:-1]))
    assert plan.regenerate == 9 and plan.turn == 8 and not plan.appends and not plan.deletes


def test_edited_last_user_message_then_regenerate() -> None:
    plan = diff(logged(CHAT), inc([*CHAT[:-2], ("user", "u8 better")]))
    assert [(e.seq, e.message.text) for e in plan.edits] == [(8, "u8 better")]
    assert plan.regenerate == 9 and plan.turn == 8


def test_retry_of_an_unanswered_message_is_not_stored_twice() -> None:
    log = logged([*CHAT, ("user", "hello?")])
    plan = diff(log, inc([*CHAT, ("user", "hello?")]))
    assert plan.turn == 10 and not plan.appends
    assert diff_one(log, Incoming("user", "hello?")).turn == 10


def test_stateful_turn_appends_even_a_repeated_text_after_a_reply() -> None:
    log = logged([("user", "ok"), ("assistant", "fine")])
    assert diff_one(log, Incoming("user", "ok")).appends == (Incoming("user", "ok"),)


def test_a_transcript_of_another_chat_is_refused() -> None:
    with pytest.raises(SyncConflict, match="X-Kioku-Conversation"):
        diff(logged(CHAT), inc([("user", "x"), ("assistant", "y"), ("user", "z")]))


def test_insertion_mid_history_rewrites_from_there_and_stays_in_order() -> None:
    window = [*CHAT[:6], ("user", "inserted"), ("assistant", "too"), *CHAT[6:], ("user", "new")]
    plan = diff(logged(CHAT), inc(window))
    after = apply_plan(CHAT, plan)
    assert after == window


def test_a_transcript_that_would_change_a_role_is_refused() -> None:
    window = [*CHAT[:5], ("user", "inserted"), *CHAT[5:], ("user", "new")]
    with pytest.raises(SyncConflict, match="#5 from assistant into user"):
        diff(logged(CHAT), inc(window))
    with pytest.raises(SyncConflict, match="from assistant into user"):
        diff(logged(CHAT), inc(window), named=True)  # even from a client that names its chats


def test_a_last_reply_deleted_before_the_next_message_is_a_deletion() -> None:
    """The client deleted the character's last reply (or never kept it) and wrote on: the
    reply is deleted, not turned into the user's new message."""
    window = [*CHAT[:-1], ("user", "written after deleting the reply")]
    assert CHAT[-1][0] == "assistant"
    plan = diff(logged(CHAT), inc(window))
    assert not plan.edits and plan.deletes == (len(CHAT) - 1,)
    assert plan.appends == (Incoming("user", "written after deleting the reply"),)
    assert apply_plan(CHAT, plan) == window


GREETING = ("assistant", "*Seraphina smiles.* Welcome to the glade.")


def test_another_chat_sharing_only_the_greeting_is_refused() -> None:
    """Chat 2 is stored; chat 3 (same character, same greeting) arrives under chat 2's id."""
    chat2 = [GREETING, ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2")]
    chat3 = [GREETING, ("user", "other"), ("assistant", "reply"), ("user", "next")]
    with pytest.raises(SyncConflict, match="matches 0 stored message.* beyond the opening"):
        diff(logged(chat2), inc(chat3))
    # the same edit from a client that names each chat is the user's own edit
    plan = diff(logged(chat2), inc(chat3), named=True)
    assert [e.seq for e in plan.edits] == [1, 2, 3] and plan.regenerate == 4


def test_the_guard_weighs_matches_not_a_count_of_changes() -> None:
    long = [GREETING, *CHAT]
    # three edits in a long transcript that matches the rest: the user's edits
    window = list(long)
    for k in (2, 4, 6):
        window[k] = (window[k][0], window[k][1] + " edited")
    plan = diff(logged(long), inc([*window, ("user", "new")]))
    assert [e.seq for e in plan.edits] == [2, 4, 6]
    # a short chat that keeps only its first exchange and rewrites the rest: refused
    window = [*long[:3], ("user", "x"), ("assistant", "y"), ("user", "z")]
    with pytest.raises(SyncConflict, match="matches 2 stored message.* would rewrite 8"):
        diff(logged(long), inc(window))


def test_a_chat_reopened_under_a_new_chats_id_is_refused() -> None:
    """The header-less mistake: chat 3 is opened under its own id, then chat 2 is reopened
    without changing the header."""
    chat3 = [GREETING, ("user", "hello from chat 3"), ("assistant", "hi 3")]
    chat2 = [GREETING, ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2")]
    with pytest.raises(SyncConflict, match="install the kioku extension"):
        diff(logged(chat3), inc([*chat2, ("user", "u3")]))


def test_a_speaker_label_the_client_strips_is_not_an_edit() -> None:
    log = logged([("user", "hi"), ("assistant", "Seraphina: *smiles*\nSeraphina: Welcome!")])
    window = inc([("user", "hi"), ("assistant", "*smiles*\nWelcome!  "), ("user", "next")])
    plan = diff(log, window)
    assert not plan.edits and plan.appends == (Incoming("user", "next"),)
    jp = logged([("user", "やあ"), ("assistant", "セラフィナ:「ようこそ」")])
    assert not diff(jp, inc([("user", "やあ"), ("assistant", "「ようこそ」")])).edits
    # a real edit is still one
    plan = diff(log, inc([("user", "hi"), ("assistant", "*frowns*\nWelcome!")]))
    assert [e.seq for e in plan.edits] == [1]


def apply_plan(log: list[tuple[str, str]], plan) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """The log's visible content after a plan (a model of the applier)."""
    rows: dict[int, tuple[str, str] | None] = dict(enumerate(log))
    for e in plan.edits:
        rows[e.seq] = (e.message.role, e.message.text)
    for q in plan.deletes:
        rows[q] = None
    if plan.regenerate is not None:
        rows[plan.regenerate] = ("assistant", "REGENERATED")
    out = [r for _, r in sorted(rows.items()) if r is not None]
    return out + [(m.role, m.text) for m in plan.appends]


message = st.tuples(st.sampled_from(ROLES), st.sampled_from([f"m{i}" for i in range(8)]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    log=st.lists(message, min_size=1, max_size=14),
    cut=st.integers(0, 13),
    ops=st.lists(
        st.tuples(st.sampled_from(["edit", "delete", "insert"]), st.integers(0, 20), message),
        max_size=3,
    ),
    new=st.lists(message, max_size=2),
)
def test_applying_a_plan_makes_the_log_show_what_the_client_shows(log, cut, ops, new) -> None:  # type: ignore[no-untyped-def]
    """Whatever the client did to its window, after the plan the log's tail reads as the
    window (but for messages older than the whole log, and with a regenerated reply last),
    and syncing again changes nothing."""
    window = list(log[min(cut, len(log) - 1) :])
    for kind, at, m in ops:
        at = at % (len(window) + 1)
        if kind == "edit" and at < len(window):
            window[at] = m
        elif kind == "delete" and at < len(window) and len(window) > 1:
            del window[at]
        elif kind == "insert":
            window.insert(at, m)
    window += new
    try:
        plan = diff(logged(log), inc(window))
    except SyncConflict:
        return
    after = apply_plan(log, plan)
    window = window[plan.ignored :]  # older than anything in the log: cannot be stored
    if plan.regenerate is not None:
        assert after[-1] == ("assistant", "REGENERATED")
        assert after[-1 - len(window) : -1] == window or after[:-1][-len(window) :] == window
        return
    assert after[-len(window) :] == window
    again = diff(logged(after), inc(window))
    assert not again.edits and not again.deletes and not again.appends


# the applier ---------------------------------------------------------------------------------

# the service tests' profile, without their short timeouts
TINY = replace(SERVICE_PROFILE, name="tiny", connect_timeout_s=10.0, reply_timeout_s=120.0)


def folded_kioku() -> tuple[Kioku, list[tuple[str, str]]]:
    """A conversation with chapters in memory, driven as a stateless client would."""
    kk = Kioku(Store.open("sqlite://"), profile=TINY)
    conv = kk.conversation("c", system_prompt="card", character="Mika")
    transcript: list[tuple[str, str]] = []
    for i in range(16):
        transcript.append(("user", words(i)))
        synced = sync(conv, inc(transcript), stateful=False)
        conv.prepare_for(synced.entry)
        reply = f"reply {i}: " + words(i + 100, 20)
        conv.record(reply)
        transcript.append(("assistant", reply))
        kk.worker.run_until_idle()
    assert conv.info().raw_start > 0, "the test needs memory to exist"
    return kk, transcript


def test_edit_under_memory_marks_it_stale_and_the_prompt_shows_the_correction() -> None:
    kk, transcript = folded_kioku()
    conv = kk.conversation("c")
    chapter = conv.memory().chapters[0]
    seq = chapter.first_seq + 1
    old = transcript[seq][1]
    transcript[seq] = (transcript[seq][0], "CORRECTED: the lantern was blue, not red.")
    transcript.append(("user", "what colour was the lantern?"))
    synced = sync(conv, inc(transcript), stateful=False)
    assert synced.stale == (chapter.id,)
    [v] = versions(kk.store, "c", seq)
    assert v["text"] == old and v["change"] == "edit"
    item = next(i for i in kk.store.items("c", "active") if i.id == chapter.id)
    assert item.stale
    [job] = [j for j in kk.store.jobs("c", "queued") if j.kind == "revision"]
    assert (job.first_seq, job.last_seq) == chapter.span
    prompt = conv.prepare_for(synced.entry)
    text = "\n".join(m.content for m in prompt.messages)
    assert "CORRECTED: the lantern was blue" in text
    assert old not in text
    # the revision is written by the worker and swapped in at the next fold
    before = conv.info().memory_version
    kk.worker.run_until_idle()
    conv.record("It was blue.")
    transcript += [("assistant", "It was blue."), ("user", "thanks")]
    conv.prepare_for(sync(conv, inc(transcript), stateful=False).entry)
    info = conv.info()
    assert info.memory_version > before
    active = kk.store.items("c", "active")
    assert not any(i.stale for i in active)
    revised = next(i for i in active if i.span == chapter.span)
    assert revised.id != chapter.id and revised.replaces == (chapter.id,)
    assert coverage_gaps(active, info.raw_start) == []
    assert "major_gcs" not in kk.store.counters("c")


def test_deleted_message_is_skipped_by_the_raw_window_and_kept_as_a_version() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    conv = kk.conversation("d", character="Mika")
    t = [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "secret: I hate tea"),
        ("assistant", "ok"),
    ]
    for m in t:
        sync(conv, inc([*t[: t.index(m) + 1]]), stateful=False)
    window = [t[0], t[1], t[3], ("user", "next")]
    synced = sync(conv, inc(window), stateful=False)
    assert synced.plan.deletes == (2,)
    prompt = conv.prepare_for(synced.entry)
    assert "hate tea" not in "\n".join(m.content for m in prompt.messages)
    row = kk.store.entries("d", 2, 2)[0]
    assert row.message.is_empty() and row.tokens == 0
    assert versions(kk.store, "d", 2)[0]["change"] == "delete"
    # the client's next request (without the deleted message) changes nothing more
    assert (
        sync(conv, inc([*window, ("assistant", "r"), ("user", "n2")]), stateful=False).plan.changes
        == 0
    )


def test_regenerated_reply_takes_the_old_ones_seq() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    conv = kk.conversation("r", character="Mika")
    first = sync(conv, inc([("user", "tell me a joke")]), stateful=False)
    conv.record("joke one")
    again = sync(conv, inc([("user", "tell me a joke")]), stateful=False)
    assert again.plan.regenerate == 1 and again.entry.seq == first.entry.seq == 0
    entry = replace_reply(conv, 1, Completion("joke two", "length", Usage(10, 5)))
    assert entry.seq == 1
    assert [e.text for e in kk.store.entries("r")] == ["tell me a joke", "joke two"]
    assert versions(kk.store, "r", 1)[0]["text"] == "joke one"
    assert kk.store.counters("r")["truncated_replies"] == 1
    assert kk.store.entries("r", 1, 1)[0].meta == {"finish_reason": "length"}


def test_revision_of_a_stale_synopsis_keeps_its_range() -> None:
    kk, transcript = folded_kioku()
    conv = kk.conversation("c")
    chapters = conv.memory().chapters
    # fold the first two chapters into a synopsis by hand, as a major GC would
    from kioku.generations import item_from_summary, synopsis_task

    task = synopsis_task(None, chapters[:2], TINY)
    syn = item_from_summary(task, kk.summarizer.summarize(task), ready_at=0)
    kk.store.fold(
        "c",
        activate=(),
        retire=[c.id for c in chapters[:2]],  # type: ignore[misc]
        raw_start=conv.info().raw_start,
        add=[replace(syn, status="ready")],
    )
    [synopsis] = [i for i in kk.store.items("c", "active") if i.kind == "synopsis"]
    transcript[1] = ("assistant", "EDITED under the synopsis")
    transcript.append(("user", "go on"))
    synced = sync(conv, inc(transcript), stateful=False)
    assert synopsis.id in synced.stale
    text = "\n".join(m.content for m in conv.prepare_for(synced.entry).messages)
    assert "EDITED under the synopsis" in text  # the errata under the stale synopsis
    kk.worker.run_until_idle()
    conv.record("ok")
    transcript += [("assistant", "ok"), ("user", "and?")]
    conv.prepare_for(sync(conv, inc(transcript), stateful=False).entry)
    active = kk.store.items("c", "active")
    new = next(i for i in active if i.kind == "synopsis")
    assert new.id != synopsis.id and new.span == synopsis.span and not new.stale
    assert coverage_gaps(active, conv.info().raw_start) == []


def test_a_long_first_transcript_is_stored_in_a_few_statements() -> None:
    """A stateless client's first request may carry its whole chat: stored in one transaction,
    not one (three statements) per message."""
    from sqlalchemy import event

    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    conv = kk.conversation("long", system_prompt="card")
    statements: list[str] = []
    event.listen(kk.store.engine, "before_cursor_execute", lambda *a: statements.append(str(a[2])))
    chat = [("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(2_000)]
    synced = sync(conv, inc(chat), stateful=False)
    assert synced.entry.seq == 1_999 and len(synced.appended) == 2_000
    assert len(statements) < 20, statements[:10]
    assert [e.text for e in kk.store.entries("long")] == [t for _, t in chat]


def test_a_message_that_can_never_fit_stores_nothing_of_the_request() -> None:
    kk = Kioku(Store.open("sqlite://"), profile=LOCAL_8K)
    conv = kk.conversation("big", system_prompt="card")
    chat = [("user", "hello"), ("assistant", "hi"), ("user", "word " * 40_000)]
    for _ in range(2):  # a retry neither
        with pytest.raises(MessageTooLarge, match="nothing was stored"):
            sync(conv, inc(chat), stateful=False)
    assert kk.store.count_messages("big") == 0
