"""Recall by need (`kioku.recall.need`): the gate is a pure function of the message, retrieval's
hits and what the prompt already shows; the engine asks it on every user turn, makes room for what
it wants, and keeps its reason with the message."""

from __future__ import annotations

import pytest

from kioku.recall.archive import Hit
from kioku.recall.need import BACKGROUND_HITS, about, cue, judge, names

GATE = dict(relevance=0.3, cued_relevance=0.2, standout=1.5, in_view_share=0.6, limit=8)


def flat(n: int = BACKGROUND_HITS, score: float = 2.0, relevance: float = 0.2) -> list[Hit]:
    """A search where every window shares a word or two with the message, none more."""
    return [Hit(1000 - i, score, relevance) for i in range(n)]


def standing(*scores: float, background: float = 2.0, ceiling: float = 10.0) -> list[Hit]:
    """A few hits well above a background of windows that share only common words."""
    top = [Hit(500 + i, s, s / ceiling) for i, s in enumerate(scores)]
    rest = flat(BACKGROUND_HITS - len(scores), background, background / ceiling)
    return top + rest


def decide(text: str, hits: list[Hit], seen: set[int] = frozenset(), lang: str = "en", **kw):  # type: ignore[assignment]
    args = {**GATE, **kw}
    return judge(text, hits, seen=lambda h: h.seq in seen, holds=lambda _: False, lang=lang, **args)


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        ("Do you remember the kite we flew?", "en", "remember"),
        ("What did you cook last week?", "en", "What did"),
        ("We went there in May, right?", "en", "in May"),
        ("先週話したカフェ、覚えてる？", "ja", "先週"),
        ("あの店の名前、なんだっけ？", "ja", "っけ？"),
        ("上次你说的那家店叫什么？", "zh", "上次"),
        ("Did we ever go back to that café?", "en", "Did we ever"),
        ("When did she move to Paris?", "en", "When did"),
    ],
)
def test_a_message_that_points_at_the_past_is_told_by_its_words(
    text: str, lang: str, expected: str
) -> None:
    assert cue(text, lang) == expected


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("ネットフリックスで映画やドラマ観ますか？", "ja"),
        ("お酒好きですか？", "ja"),
        ("趣味や好きなことはなんですか？", "ja"),
        ("Do you like spicy food?", "en"),
        ("How's it going?", "en"),
        # a tense, not a pointer: asked of what the talk just showed (LoCoMo 0 filled the room
        # for "Did you make it?" with every bowl in the archive)
        ("That bowl is gorgeous! Did you make it?", "en"),
        ("Wow, what an amazing family pic! How long have you been married?", "en"),
        ("Hey Mel! Good to see you! How have you been?", "en"),
        ("Wow! Did they like the show?", "en"),
    ],
)
def test_small_talk_does_not_point_at_the_past(text: str, lang: str) -> None:
    assert cue(text, lang) == ""


def test_names_are_the_capitalized_words_inside_a_sentence() -> None:
    assert names("Yesterday I met Hanako at Kurohama station. Then we ate.") == (
        "Hanako",
        "Kurohama",
    )
    assert names(' Gardening is really amazing. "Plants" too.') == ()


def test_the_past_a_message_tells_is_not_what_its_question_asks() -> None:
    # LoCoMo 7: "…last Friday. How about you, how are things going in that area?" was shown
    # 49 windows as a question about the past
    hits = [Hit(900, 2.2, 0.12), *flat(BACKGROUND_HITS - 1)]
    told = decide("I went hiking last Friday. How about you, how are things?", hits, asks=True)
    assert not told.on and not told.cue
    asked = decide("How was the hike last Friday?", hits, asks=True)
    assert asked.on and asked.why.startswith("it asks about the past")


def test_a_hit_that_stands_out_is_recalled_and_the_search_background_is_not() -> None:
    need = decide("Which kite had a dragon on it?", standing(8.0, 7.0, 6.5), asks=True)
    assert need.on and [h.seq for h in need.hits] == [500, 501, 502]
    assert need.standout == pytest.approx(8.0 / 2.0)
    assert "3 stand out" in need.why


def test_shared_words_alone_recall_nothing_and_say_why() -> None:
    need = decide("Do you watch films on weekends?", flat(), asks=True)
    assert not need.on and not need.hits
    assert need.why.startswith("nothing stands out")


def test_recollections_stop_where_the_scores_fall_into_the_background() -> None:
    # a weaker hit still above the background is evidence too; the background is not
    told = "I remember the kite that had a dragon on it."
    need = decide(told, standing(9.0, 8.5, 2.5))
    assert [h.seq for h in need.hits] == [500, 501, 502] and need.makes_room
    assert len(decide(told, standing(*[9.0] * 20), limit=5).hits) == 5
    # few windows match at all: the background is of windows that match nothing
    few = [Hit(7, 6.0, 0.6), Hit(9, 1.0, 0.1)]
    assert [h.seq for h in decide(told, few).hits] == [7, 9]


def test_a_question_about_the_talk_at_hand_is_shown_the_few_that_stand_out_most() -> None:
    # LoCoMo 0: "Cool! Got any fav tunes?" was shown the 23 windows above the background, and
    # RealPersonaChat CP "ご趣味は何かありますか？" 1,089 tokens: asked of the one it speaks to,
    # the few best are enough, and no chapter folds to make room for them
    hits = standing(9.0, 8.5, 8.0, 7.5, 4.0, 3.5)
    chat = decide("Wow, Mel! Got any fav tunes?", hits, asks=True)
    assert [h.seq for h in chat.hits] == [500, 501, 502] and not chat.makes_room
    assert chat.why.startswith("it asks about the talk at hand")
    ja = decide("ご趣味は何かありますか？", hits, asks=True, lang="ja")
    assert len(ja.hits) == 3 and not ja.makes_room
    # none below half the best one's score
    assert [h.seq for h in decide("Got any fav tunes?", standing(9.0, 4.0), asks=True).hits] == [
        500
    ]
    # one that asks about someone by name asks what the conversation knows of them: every
    # window that shares its words, up to the room, for which a ready chapter folds
    named = decide("What tunes does Melanie like?", hits, asks=True)
    assert len(named.hits) == GATE["limit"] and named.makes_room
    assert named.why.startswith("it asks about 'Melanie'")
    assert decide("お母さんは元気？", hits, asks=True, lang="ja").makes_room
    # unless the talk it answers holds as much as the archive's best ("How's Oliver?" after
    # news of him); a question about the past in words is held back by less
    assert not decide("What tunes does Melanie like?", hits, asks=True, in_view=0.9).on
    assert decide("What tunes does Melanie like?", hits, asks=True, in_view=0.8).on
    assert not decide("When did we hear those tunes?", hits, asks=True, in_view=0.8).on


def test_what_the_conversation_knows_of_someone_is_in_the_windows_that_name_them() -> None:
    hits = standing(9.0, 8.5, 8.0, 7.5, 4.0, 3.5)
    on_mel = {501, 503}  # the windows that name Melanie (in what was said, or as its speaker)

    def names(hit: Hit, name: str) -> bool:
        return name == "Melanie" and hit.seq in on_mel

    named = decide("What tunes does Melanie like?", hits, asks=True, names=names)
    assert [h.seq for h in named.hits] == [501, 503] and named.makes_room
    assert named.why.startswith("it asks about 'Melanie'")
    # a name no window holds was never spoken of ("Do you watch Netflix?", the issue's
    # ネットフリックス): the question asks about the talk at hand, not the past
    brand = decide("Do you watch Netflix?", hits, asks=True, names=names)
    assert [h.seq for h in brand.hits] == [500, 501, 502] and not brand.makes_room
    assert brand.why.startswith("it asks about the talk at hand")
    # of everyone it names, a window that names any (LoCoMo 4: Tim names the city, not Ireland)
    city = decide(
        "Which city in Ireland will Tim be staying in?",
        hits,
        asks=True,
        names=lambda h, n: n == "Tim" and h.seq == 502,
    )
    assert [h.seq for h in city.hits] == [502] and city.makes_room
    # what names her is in view already: nothing else is shown in its place
    shown = decide("What tunes does Melanie like?", hits, seen=on_mel, asks=True, names=names)
    assert not shown.on and shown.why == "what it finds of 'Melanie' is in view already"
    # spoken of as ハナコ, asked of as ハナコさん
    ja = decide(
        "ハナコさんは元気？",
        hits,
        asks=True,
        lang="ja",
        names=lambda h, n: n == "ハナコ" and h.seq == 502,
    )
    assert [h.seq for h in ja.hits] == [502] and ja.makes_room


@pytest.mark.parametrize(
    ("text", "whom"),
    [
        ("What has Melanie painted?", "Melanie"),
        ("What kind of beer does McGee's bar serve?", "McGee"),
        ("How's Oliver?", "Oliver"),
        ("Wow, Mel! Any more paintings coming up?", ""),  # asked of Mel
        ("Thanks, Melanie! That plate is awesome! Did you make it?", ""),
        ("Hey Caroline, how are you?", ""),
        ("What are you up to, Mel?", ""),
        ("*hugs Seraphina tightly* Are you okay?", ""),  # a role-play action names her
        ("*sits down* How is Lily doing?", "Lily"),
        # a sentence's first word is no name, after a quote either (LoCoMo 7)
        ('My favourite is a track called "Savana." What songs do you like?', ""),
        ("It's inspiring, huh Jolene? Have you thought about the steps?", ""),
        ("ハナコさんは元気？", "ハナコさん"),
        ("ご趣味は何かありますか？", ""),
    ],
)
def test_whom_a_question_asks_about(text: str, whom: str) -> None:
    assert about(text) == whom


def test_what_the_prompt_shows_already_is_no_evidence() -> None:
    hits = standing(8.0, 7.5)
    assert not decide("Which kite?", hits, seen={500, 501}, asks=True).on
    partly = decide("Which kite?", hits, seen={500}, asks=True)
    assert [h.seq for h in partly.hits] == [501]


def test_a_message_that_points_at_the_past_takes_weaker_evidence() -> None:
    # the best hit holds a quarter of the message's meaning: enough when the past is asked for
    hits = standing(2.5 * 2.0, ceiling=20.0)
    assert not decide("Is that kite blue?", hits, asks=True).on
    assert decide("I remember that kite.", hits).on


def test_a_name_the_prompt_does_not_hold_points_at_the_past() -> None:
    hits = standing(5.0, ceiling=20.0)
    seen: set[int] = set()
    told = judge(
        "Is Hanako still flying it?",
        hits,
        seen=lambda h: h.seq in seen,
        holds=lambda name: name in "we talked about the weather",
        lang="en",
        **GATE,
    )
    assert told.on and told.cue == "Hanako"
    known = judge(
        "Is Hanako still flying it?",
        hits,
        seen=lambda h: h.seq in seen,
        holds=lambda name: name in "Hanako flew her kite today",
        lang="en",
        **GATE,
    )
    assert not known.on


def test_a_message_about_what_the_raw_window_shows_recalls_nothing() -> None:
    hits = standing(8.0, 7.5)  # the best holds 0.8 of the message's meaning
    told = "I remember the kite that had a dragon on it."
    assert decide(told, hits, in_view=0.4).on
    held = decide(told, hits, in_view=0.5)
    assert not held.on and held.why.startswith("the raw window holds it")


def test_a_statement_that_does_not_point_at_the_past_is_shown_nothing() -> None:
    # what it shares with the archive stands out, but it asks nothing: what it would be shown
    # stays in the window until the next fold
    hits = standing(8.0, 7.5)
    told = decide("The kite with the dragon is up again.", hits)
    assert not told.on and told.why.startswith("a statement that does not point at the past")
    assert decide("The kite with the dragon is up again, like last spring.", hits).on


def test_a_question_about_the_past_is_shown_every_match() -> None:
    # nothing stands out of the background and the best holds little of the message: a
    # question that does not point at the past is shown nothing, one that does every match
    hits = [Hit(900, 2.2, 0.12), *flat(BACKGROUND_HITS - 1)]
    assert not decide("What colour is the kite?", hits, asks=True).on
    asked = decide("When did we fly the kite?", hits, asks=True, limit=5)
    assert asked.on and asked.cue == "When did"
    assert [h.seq for h in asked.hits] == [900, 1000, 999, 998, 997]
    assert asked.why.startswith("it asks about the past ('When did')")
    # what the prompt shows already is still passed over
    shown = decide("When did we fly the kite?", hits, seen={900, 1000}, asks=True, limit=2)
    assert [h.seq for h in shown.hits] == [999, 998]
    # the talk it answers holds it (the caller measures a question's in-view on its newest
    # messages): it asks about what was just said
    held = decide("When did we fly the kite?", hits, asks=True, in_view=0.9)
    assert not held.on and held.why.startswith("nothing stands out")


def test_a_tense_with_a_pronoun_asks_about_the_talk_at_hand() -> None:
    # LoCoMo 0: "Cool! What did it look like?" was shown every window with "look" in it
    hits = [Hit(900, 2.2, 0.12), *flat(BACKGROUND_HITS - 1)]
    thin = decide("Cool! What did it look like?", hits, asks=True, limit=5)
    assert not thin.on and thin.why.startswith("nothing stands out") and not thin.cue
    # judged as any other question: what stands out is still shown
    standing_out = decide("Cool! What did it look like?", standing(8.0), asks=True)
    assert standing_out.on and "asks about the past" not in standing_out.why
    # a question that names what it asks about is still asked of the past
    named = decide("Wow! What did you paint at the lake last summer?", hits, asks=True, limit=5)
    assert named.on and named.why.startswith("it asks about the past")


@pytest.mark.parametrize(
    ("text", "at_hand"),
    [
        ("How was it? Anything fun?", True),
        ("That bowl is gorgeous! Where did you find it?", True),
        ("What did Caroline paint last week?", False),
        # LoCoMo 0, after a story of a camping trip: asked of the story just told
        ("What was the best part? Do you do it often with the kids?", True),
        ("What did Caroline paint?", False),  # it names whom
        ("When did we fly the kite?", False),  # a past the user shared
        ("What did we do last weekend?", False),  # it names when
        ("How did it go, remember?", False),
        ("昨日は何してたっけ？", False),
    ],
)
def test_what_a_question_about_the_past_names(text: str, at_hand: bool) -> None:
    from kioku.recall.need import at_hand as names_nothing

    lang = "ja" if any(ord(c) > 0x3000 for c in text) else "en"
    assert names_nothing(text, cue(text, lang)) is at_hand


def test_an_empty_archive_recalls_nothing() -> None:
    need = decide("Do you remember?", [])
    assert not need.on and need.why == "the archive holds nothing like it"


def test_the_note_says_what_the_turn_got() -> None:
    need = decide("Which kite had a dragon on it?", standing(8.0), asks=True)
    note = need.note([(499, 501)], 42)
    assert note["on"] and note["got"] == [[499, 501]] and note["tokens"] == 42
    # on, but nothing fitted: the note says so
    empty = need.note()
    assert not empty["on"] and "nothing shown" in empty["why"]
