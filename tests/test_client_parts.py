"""What a client adds around its chat, placed where it put it (`kioku.client_parts`), the card
it sends split into what kioku keeps and what it moves (`kioku.service.card_parts`), chat
names kioku keeps (`kioku.ids`), and where a branch parts from its parent (`kioku.branches`)."""

from __future__ import annotations

from kioku.branches import branch_point
from kioku.client_parts import ClientParts, place
from kioku.ids import is_valid_id, key_for
from kioku.models import ChatMessage
from kioku.service.card_parts import LeadingMessage, card_of, pinned
from kioku.sync import Incoming, Logged, line_key


def chat(n: int) -> list[ChatMessage]:
    return [ChatMessage("user" if k % 2 == 0 else "assistant", f"m{k}") for k in range(n)]


def test_parts_go_where_the_client_put_them() -> None:
    note = ChatMessage("system", "note")
    lore = ChatMessage("system", "lore")
    nudge = ChatMessage("system", "nudge")
    parts = ClientParts(injections=((2, note),), volatile=(lore,), after=(nudge,))
    out = [m.content for m in place(chat(5), parts)]
    assert out == ["m0", "m1", "m2", "note", "m3", "m4", "lore", "nudge"]
    # deeper than the chat: first; two at one depth keep their order
    two = ClientParts(injections=((9, note), (1, lore), (1, nudge)))
    assert [m.content for m in place(chat(3), two)] == ["note", "m0", "m1", "lore", "nudge", "m2"]
    # a continue: the reply being continued stays last before what follows the chat
    cont = ClientParts(volatile=(lore,), after=(nudge,), continuing=True)
    assert [m.content for m in place(chat(2), cont)] == ["m0", "lore", "m1", "nudge"]


def test_the_card_keeps_example_speakers_and_moves_what_changes() -> None:
    leading = [
        LeadingMessage("Write Mika's reply."),
        LeadingMessage("lore entry"),
        LeadingMessage("[Example Chat]"),
        LeadingMessage("Hi?", "example_user"),
        LeadingMessage("Mika: already named", "example_assistant"),
    ]
    card = card_of(leading, frozenset({1}), user="Alex", character="Mika")
    assert card.text == "Write Mika's reply.\n\n[Example Chat]\nAlex: Hi?\nMika: already named"
    assert [m.content for m in card.volatile] == ["lore entry"]
    # the request's examples a subsequence of the stored ones: pushed out, the stored card stays
    fewer = card_of(leading[:4], frozenset({1}), user="Alex", character="Mika")
    assert pinned(card.text, fewer) == card.text
    edited = card_of([LeadingMessage("Write Mika's reply, briefly.")], user="Alex")
    assert pinned(card.text, edited) == "Write Mika's reply, briefly."


def test_any_chat_name_gets_an_id_that_travels() -> None:
    for name in ["Branch #60 - 2026-12-01@18h34m47s", "50% sure?", "ミカとの会話 (2)"]:
        assert key_for(name) == name
    for name in ["a/b", "back\\slash", "..", " padded ", "x" * 201, "line\nbreak"]:
        kept = key_for(name)
        assert is_valid_id(kept) and kept != name and kept == key_for(name)
    assert key_for("a/b") != key_for("a\\b")


def test_a_branch_parts_after_the_longest_run_it_shares() -> None:
    roles = ["assistant", "user"]
    parent = [Logged(k, roles[k % 2], line_key(roles[k % 2], f"p{k}")) for k in range(12)]

    def said(k: int) -> Incoming:
        return Incoming(roles[k % 2], f"p{k}")

    # SillyTavern resent messages 3..8 of the branch at 8, then the branch's own message, which
    # happens to say what the parent said at 11
    transcript = [said(k) for k in range(3, 9)] + [said(11)]
    assert branch_point(parent, transcript) == 9
    assert branch_point(parent, [Incoming("user", "something else")]) is None
