"""Grounding: every line a model writes is checked against the messages it cites (en and ja),
and the chronicler stores none of what a weak model makes up: scripted doubles for the failure
kinds a 1.5B model showed (echoing the prompt, swapping names, citing the wrong author)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest

from kioku.chronicle_prompt import instructions
from kioku.chronicler import ChroniclerConfig, LLMChronicler
from kioku.grounding.check import Statement
from kioku.grounding.evidence import evidence_for
from kioku.grounding.records import ground_record, record_from_reply
from kioku.messages import LogEntry, Message, Part
from kioku.models import ChatRequest, ScriptedModel
from kioku.reply_format import parse_lines
from kioku.structure import Claim, KeyLine, Record, UserFact
from kioku.summarizer import ExtractiveSummarizer, SummaryTask
from tests.chronicle_requests import numbered

AT = datetime(2023, 5, 8, 13, 56)


class QuarterCounter:
    def count(self, text: str) -> int:
        return max(1, len(text) // 4)


COUNTER = QuarterCounter()


def friends() -> tuple[LogEntry, ...]:
    """Caroline (the user) and Melanie, LoCoMo-style: plain text, dated."""
    said = [
        ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
        ("Melanie", "Wow, that's cool! I painted a lake sunrise last year, it's special to me."),
        ("Caroline", "I'm keen on counseling or working in mental health."),
        ("Melanie", "I've been married to my husband for five years and we have three kids."),
        ("Caroline", "My grandma gave me this necklace; she is from Sweden."),
        ("Melanie", "We went camping in the mountains last week with the kids."),
        ("Caroline", "Thanks, Melanie! Is this your own painting?"),
    ]
    out = []
    for i, (who, text) in enumerate(said):
        role = "user" if who == "Caroline" else "assistant"
        m = Message(role, (Part("text", text),), author=who, at=AT + timedelta(minutes=i))
        out.append(LogEntry(seq=20 + i, message=m, tokens=20))
    return tuple(out)


def evidence(**kw: Any) -> Any:
    return evidence_for(friends(), lang="en", user_name="Caroline", character="Melanie", **kw)


def check(text: str, seqs: tuple[int, ...], author: str | None = None, **kw: Any) -> Any:
    return evidence().check(Statement("line", text, seqs, author, **kw))


# --- the check, in English ---------------------------------------------------------------------


def test_a_faithful_paraphrase_is_grounded() -> None:
    assert check("went to an LGBTQ support group on 7 May 2023", (20,), "Caroline").ok
    assert check("painted a lake sunrise in 2022", (21,), "Melanie").ok  # "last year (2022)"
    assert check("Melanie has been married for 5 years and has 3 kids", (23,)).ok  # five → 5
    assert check("Caroline's grandma from Sweden gave her a necklace", (24,)).ok


@pytest.mark.parametrize(
    ("text", "seqs", "author", "reason"),
    [
        # the prompt's old example, copied with seqs that happen to be in the span
        ("Aoi and the user reached the harbour town at night", (20,), None, "name"),
        # Caroline renamed
        ("Aoi went to an LGBTQ support group", (20,), None, "name"),
        # Melanie's marriage stored as the user's
        ("has been married for five years", (23,), "Caroline", "author"),
        ("Caroline has been married for five years", (23,), None, "author"),
        # a thing the cited message does not say
        ("went to a pottery class with her husband", (20,), "Caroline", "unsupported"),
        ("painted a lake sunrise in 2019", (21,), "Melanie", "unsupported"),  # the wrong year
        ("has been married for seven years", (23,), "Melanie", "unsupported"),
        ("never went to a support group", (20,), "Caroline", "unsupported"),  # turned around
        # a message outside the span
        ("went camping", (13,), "Melanie", "seq"),
        # a line that says nothing a reader could use
        ("Melanie asked Caroline how she was", (21,), None, "empty"),
        # who asked whom, turned around: Caroline thanks Melanie and asks about the painting
        ("Melanie asked whether the painting was her own", (26,), None, "author"),
    ],
)
def test_what_a_weak_model_invents_fails_with_its_reason(
    text: str, seqs: tuple[int, ...], author: str | None, reason: str
) -> None:
    v = check(text, seqs, author)
    assert not v.ok and v.reason == reason, v


def test_the_prompts_own_words_and_placeholders_are_never_memory() -> None:
    task = SummaryTask(
        "chapter", 300, friends(), lang="en", character="Melanie", user_name="Caroline"
    )
    ev = evidence(prompt=instructions(task))
    placeholder = ev.check(
        Statement("line", "<what that message says, in a short sentence>", (20,))
    )
    assert placeholder.reason == "prompt"
    rule = ev.check(Statement("line", "Skip greetings, thanks and small talk", (20,), "Caroline"))
    assert rule.reason == "prompt"
    # words the conversation itself uses are never the prompt's, whatever the prompt says
    assert ev.check(Statement("line", "went to a support group", (20,), "Caroline")).ok


def test_a_line_without_a_seq_cites_the_one_message_that_says_it() -> None:
    v = check("Melanie went camping in the mountains with the kids", ())
    assert v.ok and v.seqs == (25,)
    assert check("Melanie flew to Paris", ()).reason == "seq"


def test_a_claim_is_confirmed_only_by_narration_or_a_thought_that_says_so() -> None:
    lie = (
        LogEntry(
            11,
            Message(
                "assistant",
                (
                    Part("speech", "Never. This is my first time here.", speaker="Aoi"),
                    Part("thought", "I grew up in this town. He must not find out.", "Aoi"),
                ),
                author="Aoi",
                at=AT,
            ),
        ),
    )
    ev = evidence_for(lie, lang="en", user_name="Ren", character="Aoi")
    record = Record(
        claims=(
            Claim(11, "Aoi", "she has never been to this town", "Ren", "thought"),
            Claim(
                11, "Aoi", "this is her first time here", "Ren", "none", "she grew up in this town"
            ),
        )
    )
    grounded, g = ground_record(record, ev)
    # the thought contradicts the first claim: it is no confirmation; the "actually" stands
    assert grounded.claims[0].supported_by == "none"
    assert grounded.claims[1].actual == "she grew up in this town"
    assert g.corrected == 1 and g.share == 1.0


# --- Japanese (SudachiPy) ---------------------------------------------------------------------


def japanese() -> tuple[LogEntry, ...]:
    said = [
        ("AC", "user", "九州に住んでいます。博多のラーメンが大好きです。"),
        ("CP", "assistant", "私も九州です！　去年、東京へ旅行に行きました。"),
        ("AC", "user", "来月、妹の結婚式で大阪に行く予定です。"),
    ]
    return log_of(said)


def log_of(said: list[tuple[str, str, str]]) -> tuple[LogEntry, ...]:
    """(writer, role, text) rows as a log, seq from 0."""
    return tuple(
        LogEntry(i, Message(role, (Part("text", text),), author=who, at=AT))
        for i, (who, role, text) in enumerate(said)
    )


def ja_check(text: str, seqs: tuple[int, ...], author: str | None = None) -> Any:
    ev = evidence_for(japanese(), lang="ja", user_name="partner", character="CP")
    return ev.check(Statement("line", text, seqs, author))


def test_japanese_lines_are_read_by_their_dictionary_forms() -> None:
    assert ja_check("九州に住んでいて、博多のラーメンが好き", (0,), "AC").ok
    assert ja_check("去年東京へ旅行に行った", (1,), "CP").ok  # 行きました → 行く
    assert ja_check("来月妹の結婚式で大阪へ行く", (2,), "AC").ok
    assert ja_check("去年東京へ旅行に行ってきた", (1,), "CP").ok  # done, as the message tells it
    assert ja_check("来月、妹の結婚式で大阪に行きたい", (2,), "AC").ok  # not done either


@pytest.mark.parametrize(
    ("text", "seqs", "author", "reason"),
    [
        ("アオイとユーザーは夜に港町に着いた。", (0,), None, "name"),  # the old example
        ("港町で育った", (1,), "CP", "unsupported"),
        ("去年、京都へ旅行に行った", (1,), "CP", "name"),  # a place not in the span
        ("妹の結婚式で大阪に行く予定", (2,), "CP", "author"),  # AC's plan as CP's
        ("来年、妹の結婚式に行く", (2,), "AC", "unsupported"),  # the wrong time
        ("九州に住んでいない", (0,), "AC", "unsupported"),  # turned around
        ("来月、妹の結婚式で大阪に行きました", (2,), "AC", "unsupported"),  # a plan made done
        ("妹の結婚式で大阪に行ってきた", (2,), "AC", "unsupported"),
        ("九州に住んでいて、博多のラーメンが好きだ。长い", (0,), "AC", "unsupported"),  # Chinese
        ("我也九州です", (1,), "CP", "unsupported"),  # 私も, in Chinese
    ],
)
def test_japanese_inventions_fail(
    text: str, seqs: tuple[int, ...], author: str | None, reason: str
) -> None:
    v = ja_check(text, seqs, author)
    assert not v.ok and v.reason == reason, v


def test_a_line_in_its_writers_first_person_is_their_words_cut_not_reworded() -> None:
    assert check("I'm keen on counseling.", (22,), "Caroline").ok  # a cut of the message
    assert check("Caroline is keen on counseling and mental health work.", (22,), "Caroline").ok
    # the 1.5B model on LoCoMo 0 #31: "doing my best" stood for "thrilled"
    v = check("I'm doing my best at counseling or working in mental health.", (22,), "Caroline")
    assert not v.ok and v.reason == "unsupported" and "rewords" in v.detail, v
    assert check("I'm keen on counseling [image shared]", (22,), "Caroline").ok  # no word
    # under a heading of her name ("- Jon: Your help means so much" for "means a lot")
    v = check(
        "I'm doing my best at counseling or working in mental health.", (22,), subject="Caroline"
    )
    assert not v.ok and "rewords" in v.detail, v


def test_a_line_that_answers_what_its_message_only_asks_fails() -> None:
    # RealPersonaChat FZ #152: "晩御飯はもう食べましたか？" stored as "DV 晩御飯は食べました"
    said = [
        ("DV", "user", "こんばんは！晩御飯はもう食べましたか？"),
        ("FZ", "assistant", "まだです。"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="DV", character="FZ")
    v = ev.check(Statement("line", "DV 晩御飯は食べました。", (0,), "DV"))
    assert not v.ok and v.reason == "unsupported" and "asks" in v.detail, v
    assert ev.check(Statement("line", "DV は晩御飯を食べたか尋ねた", (0,), "DV")).ok
    assert ev.check(Statement("line", "晩御飯はもう食べましたか？", (0,), "DV")).ok
    # one sentence answers, the next asks (CP #205: "釣るやつです。水風船って、釣るやつですか？")
    v = ev.check(Statement("line", "DV 食べました。晩御飯はもう食べましたか？", (0,), "DV"))
    assert not v.ok and "asks" in v.detail, v
    assert check("Caroline asked Melanie whether this is her own painting.", (26,), "Caroline").ok
    assert not check("Caroline has her own painting.", (26,), "Caroline").ok


def test_a_line_that_puts_a_neighbours_words_in_another_mouth_fails() -> None:
    # RealPersonaChat CP #46–#49: the 1.5B model made CP's swimming AC's, citing AC's reply
    said = [
        ("CP", "user", "近くのプールが1回200円なんですよ。"),
        ("AC", "assistant", "激安ですね！200円なら、毎日通えちゃう。"),
        ("CP", "user", "ええ。安いので週に3回通っています。続けたいです。"),
        (
            "AC",
            "assistant",
            "がんばってください！水泳を週3回もやってたら、身体もビシッと引き締まりそうですね。",
        ),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="CP", character="AC")
    v = ev.check(Statement("line", "AC 週3回水泳を通っています。", (3,), "AC"))
    assert not v.ok and v.reason == "author" and "CP said at #2" in v.detail, v
    assert ev.check(Statement("line", "週に3回プールに通っている", (2,), "CP")).ok
    assert ev.check(Statement("line", "水泳を週3回もやってたら引き締まりそう", (3,), "AC")).ok
    # DD #25–#26: FZ named Greece, DD answered "ギリシャいいですね"; every term is FZ's too
    said = [
        ("FZ", "user", "私はギリシャに行こうと思ってます"),
        ("DD", "assistant", "ギリシャいいですね！"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="FZ", character="DD")
    assert not ev.check(Statement("line", "ギリシャいいですね", (0,), "FZ")).ok
    assert ev.check(Statement("line", "ギリシャいいですね", (1,), "DD")).ok


def test_a_line_is_grounded_as_it_is_stored_with_its_dates_resolved() -> None:
    # RealPersonaChat FZ: "昨年" for the message's "昔" passed as written; stored with the year it
    # means ("昨年(2021年)"), it names a year no message does
    said = [
        ("FZ", "user", "寒くても半袖で過ごす人っていますよね。"),
        ("DV", "assistant", "昔私の同級生で年中半袖の子がいました。"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="FZ", character="DV")
    reply = parse_lines(
        "#1 DV: 昨年の同級生で年中半袖の子がいました\n#1 DV: 同級生で年中半袖の子がいました"
    )
    record, g = record_from_reply(reply, ev)
    assert [c.claim for c in record.claims] == ["同級生で年中半袖の子がいました"]
    assert [(d.reason, d.text) for d in g.dropped] == [
        ("unsupported", f"昨年({AT.year - 1}年)の同級生で年中半袖の子がいました")
    ]
    # a day the message names itself is stored with its date and stays grounded
    said = [("CP", "user", "昨日、友達と映画を観に行きました。")]
    ev = evidence_for(log_of(said), lang="ja", user_name="CP", character="AC")
    record, g = record_from_reply(parse_lines("#0 CP: 昨日友達と映画を観に行きました"), ev)
    assert g.dropped == () and "5月7日" in record.user_facts[0].fact, record


def test_a_shortened_media_marker_is_stored_as_the_message_has_it() -> None:
    # LoCoMo 0 #138: the 1.5B model kept "[shares a photo]" and lost what the photo showed
    said = [
        (
            "Melanie",
            "assistant",
            "They made this! [shares a photo: a photo of a cup with a dog face on it]",
        )
    ]
    ev = evidence_for(log_of(said), user_name="Caroline", character="Melanie")
    reply = parse_lines("#0 Melanie: They made this! [shares a photo]")
    record, g = record_from_reply(reply, ev)
    assert g.dropped == ()
    assert record.claims[0].claim == (
        "They made this! [shares a photo: a photo of a cup with a dog face on it]"
    )


def test_a_line_that_opens_with_its_writers_name_stores_their_words_once() -> None:
    # RealPersonaChat FZ: the 1.5B model wrote "- FQ 暗くなるのが早くなりましたね。", stored as
    # "#63 FQ: FQ 暗くなるのが…", the name shown twice
    said = [
        ("FZ", "user", "最近寒くなってきましたね。"),
        ("FQ", "assistant", "そうですね、暗くなるのが早くなりましたね。"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="FZ", character="FQ")
    reply = parse_lines("- FQ 暗くなるのが早くなりましたね。\n- FZ：最近寒くなってきましたね。")
    record, g = record_from_reply(reply, ev)
    assert g.dropped == ()
    assert [(c.speaker, c.claim) for c in record.claims] == [
        ("FQ", "暗くなるのが早くなりましたね。")
    ]
    assert [(f.by, f.fact) for f in record.user_facts] == [("FZ", "最近寒くなってきましたね。")]


def test_a_writers_name_before_a_number_is_their_label_too() -> None:
    # RealPersonaChat CP #51: the 1.5B model wrote "- AC 1年たった腹筋が…", stored as
    # "#51 AC: AC 1年たった…"
    said = [
        ("CP", "user", "水泳を始めて半年です。"),
        ("AC", "assistant", "あれれー？私は1年たったら、腹筋がシックスパックでした。"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="CP", character="AC")
    record, g = record_from_reply(parse_lines("- AC 1年たったら、腹筋がシックスパックでした。"), ev)
    assert g.dropped == ()
    assert [(c.speaker, c.claim) for c in record.claims] == [
        ("AC", "1年たったら、腹筋がシックスパックでした。")
    ]


def test_a_japanese_line_in_its_writers_voice_must_be_their_words() -> None:
    # RealPersonaChat CP #62: "- AC は、家事を好むために頑張らないと家の中がヤバいです。" was
    # stored as AC's words; AC never said she likes housework (好む). Japanese speech drops the
    # 私, so a polite or spoken ending gives a line out as its writer's words
    said = [
        ("CP", "user", "今日は何をしますか？"),
        ("AC", "assistant", "さて、今日は家事をいい加減、頑張らないと家の中がヤバいです。"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="CP", character="AC")
    v = ev.check(Statement("claim", "家事を好むために頑張らないと家の中がヤバいです。", (1,), "AC"))
    assert not v.ok and v.reason == "unsupported" and "rewords" in v.detail, v
    assert ev.check(Statement("claim", "家事を頑張らないと家の中がヤバいです。", (1,), "AC")).ok
    # plain, it is a summary and is read for its terms ("ACは…と言う" too)
    assert ev.check(Statement("claim", "今日は家事を頑張らないといけない", (1,), "AC")).ok
    reply = parse_lines("- AC は、家事を好むために頑張らないと家の中がヤバいです。")
    record, g = record_from_reply(reply, ev)
    assert not record.claims and [d.reason for d in g.dropped] == ["unsupported"], g.dropped


def test_a_line_is_grounded_as_it_is_stored_under_its_writer() -> None:
    # FZ #24: "- FZ え！そんなことあるんですか！…" passed as a line of no one's, and was stored
    # as FZ's words: "え！そんなことあるんですか！" is not what FZ said
    said = [
        ("FQ", "assistant", "マンガアプリは毎日無料で読めるんですよ。"),
        ("FZ", "user", "すごい！それは知らなかったですー！いい情報聞けました！"),
    ]
    ev = evidence_for(log_of(said), lang="ja", user_name="FZ", character="FQ")
    reply = parse_lines("- FZ え！そんなことあるんですか！知らなかったですー！いい情報聞けました！")
    record, g = record_from_reply(reply, ev)
    assert not record.user_facts and not record.claims, record
    cut = parse_lines("- FZ それは知らなかったですー！いい情報聞けました！")
    record, _ = record_from_reply(cut, ev)
    assert [f.fact for f in record.user_facts] == ["それは知らなかったですー！いい情報聞けました！"]


# --- the line format ----------------------------------------------------------------------------


def test_what_a_line_is_comes_from_the_message_that_bears_it_out() -> None:
    reply = parse_lines(
        "Here are the lines:\n"
        "#20 Caroline: went to an LGBTQ support group on 7 May 2023\n"
        "- #21 Melanie (character): painted a lake sunrise last year\n"
        "**#23 Caroline:** has been married for five years\n"
        "#24 Caroline: her grandma from Sweden gave her a necklace\n"
        "OPEN career: what Caroline will study in counseling\n"
        "DONE camping #25: Melanie went camping in the mountains\n"
        'QUOTE #22 Caroline: "I\'m keen on counseling or working in mental health."\n'
        "Aoi smiled."
    )
    record, g = record_from_reply(reply, evidence())
    assert record.user_facts == (
        UserFact(20, "went to an LGBTQ support group on 7 May 2023", "Caroline"),
        UserFact(24, "her grandma from Sweden gave her a necklace", "Caroline"),
    )
    # "last year" is stored with the year it meant, as the transcript showed it
    assert record.claims == (
        Claim(21, "Melanie", "painted a lake sunrise last year (2022)", "Caroline"),
    )
    assert record.key_lines == (
        KeyLine(22, "Caroline", "I'm keen on counseling or working in mental health."),
    )
    assert [t.id for t in record.threads] == ["career", "camping"]
    assert g.by_reason() == {"author": 1, "format": 1}  # Melanie's marriage; "Aoi smiled."
    assert g.written == 8 and g.kept == 6  # the heading is no line; the 4 shapes are


def test_a_transcript_copied_back_is_read_as_lines_of_their_writers() -> None:
    reply = parse_lines(
        "#20 · 2023-05-08 (Mon) 13:56 · Caroline (user): I went to a LGBTQ support group"
    )
    assert (reply.lines[0].name, reply.lines[0].text) == (
        "Caroline",
        "I went to a LGBTQ support group",
    )


def test_a_bullet_that_opens_with_a_name_is_about_that_person_not_said_twice() -> None:
    """ "- Melanie: …" is how a small model often writes a fact: the name says whom it is
    about, and is not stored again inside the text ("Melanie told Caroline: Melanie: …")."""
    reply = parse_lines(
        "- Melanie: married to her husband for five years (#23)\n"
        "- Caroline: her grandma from Sweden gave her a necklace (#24)"
    )
    assert [(ln.about, ln.text) for ln in reply.lines] == [
        ("Melanie", "married to her husband for five years"),
        ("Caroline", "her grandma from Sweden gave her a necklace"),
    ]
    record, g = record_from_reply(reply, evidence())
    assert g.dropped == ()
    assert [(c.speaker, c.claim) for c in record.claims] == [
        ("Melanie", "married to her husband for five years")
    ]
    assert [f.fact for f in record.user_facts] == ["her grandma from Sweden gave her a necklace"]


# --- scripted doubles for the failure kinds ----------------------------------------------------


def transcript_of(request: ChatRequest) -> list[tuple[int, str, str]]:
    """(seq, author, text) of the messages a chronicler request shows."""
    user = numbered(request)
    out = []
    for block in re.split(r"\n\n(?=#\d+ ·)", user):
        m = re.match(r"#(\d+) · (?:[^·\n]+ · )?([^(\n]+) \((?:user|character)\)\n  (.+)", block)
        if m:
            out.append((int(m.group(1)), m.group(2).strip(), m.group(3).split("\n")[0]))
    return out


def echo_prompt(request: ChatRequest) -> str:
    """The prompt's own form and rules, written back as if they were the record."""
    asked = request.messages[-1].content
    first = transcript_of(request)[0][0]
    tail = asked[asked.index("Now list") :]
    forms = [ln for ln in tail.splitlines() if ln.startswith(("- <", "OPEN <", "DONE <"))]
    rules = [ln[3:] for ln in tail.splitlines() if re.match(r"\d\. ", ln)]
    return "\n".join(forms + [f"- {r} (#{first})" for r in rules])


NAMES = {"Caroline": "Aoi", "Melanie": "Mika"}


def swap_names(request: ChatRequest) -> str:
    """True lines with the people renamed (Caroline → Aoi, as the 1.5B model did)."""
    return "\n".join(f"#{seq} {NAMES[who]}: {text}" for seq, who, text in transcript_of(request))


def wrong_author(request: ChatRequest) -> str:
    """True words, each cited as said by the other person."""
    other = {"Caroline": "Melanie", "Melanie": "Caroline"}
    return "\n".join(f"#{seq} {other[who]}: {text}" for seq, who, text in transcript_of(request))


def stored_lines(summary: Any) -> list[str]:
    return [ln for ln in summary.text.splitlines() if ln.startswith("- ")]


def chapter(model: ScriptedModel, **config: Any) -> Any:
    task = SummaryTask(
        "chapter", 300, friends(), lang="en", character="Melanie", user_name="Caroline"
    )
    ch = LLMChronicler(model, COUNTER, ExtractiveSummarizer(COUNTER), ChroniclerConfig(**config))
    return ch.summarize(task)


@pytest.mark.parametrize("double", [echo_prompt, swap_names, wrong_author])
def test_a_double_that_invents_stores_nothing_of_it_and_falls_back(double: Any) -> None:
    s = chapter(ScriptedModel(default=double))
    assert s.source == "extractive" and s.events[-1] == "fallback"
    assert s.events.count("ungrounded") == 3  # asked three times, each reply rejected
    assert "Aoi" not in s.text and "Mika" not in s.text
    assert "<" not in s.text and "greetings" not in s.text
    for line in s.text.splitlines():  # the fallback quotes each line with its true speaker
        m = re.match(r"\[(\d+)\] (\w+): (.*)", line.split(" — ")[-1])
        if m:
            who = friends()[int(m.group(1)) - 20].message.author
            assert m.group(2) == who
    attempts = s.data["grounding"]["attempts"]
    assert len(attempts) == 3 and all(a["share"] < 0.5 for a in attempts)


def test_a_mostly_true_reply_keeps_its_true_lines_and_drops_the_rest() -> None:
    def mostly(request: ChatRequest) -> str:
        return "\n".join(
            [
                "#20 Caroline: went to an LGBTQ support group",
                "#21 Melanie: painted a lake sunrise last year",
                "#22 Caroline: wants to work in counseling or mental health",
                "#23 Caroline: has been married for five years",  # Melanie's marriage
                "#25 Melanie: went camping in the mountains with the kids",
                "#24 Aoi: grew up in the harbour town",  # the old example's name
            ]
        )

    s = chapter(ScriptedModel(default=mostly), fill=False)
    assert s.source == "llm"
    assert s.data["grounding"]["dropped"] == {"author": 1, "name": 1}
    assert s.events.count("dropped_author") == 1 and s.events.count("dropped_name") == 1
    assert "Aoi" not in s.text and "harbour" not in s.text
    assert "- #23 Caroline" not in s.text
    # the dropped line about #23 is replaced by #23's own words, with its true author
    assert "- #23 Melanie: I've been married to my husband for five years" in s.text
    assert s.data["added"] == [
        {
            "seq": 23,
            # the span up to the day it was said carries the year it began
            "text": (
                "I've been married to my husband for five years (since 2018) and we have three kids."
            ),
            "why": "replaced",
        }
    ]
    for line in stored_lines(s):
        assert "Caroline: has been married" not in line


def test_the_room_the_model_left_is_filled_with_the_spans_own_lines() -> None:
    s = chapter(ScriptedModel(["#20 Caroline: went to an LGBTQ support group"]))
    assert s.source == "llm" and s.data["grounding"]["filled"] >= 3
    assert "Sweden" in s.text  # not in the model's line: the span's own words, verbatim
    assert all(a["why"] == "filled" for a in s.data["added"])
    assert s.tokens <= 300 * 1.3


def test_a_line_is_borne_out_by_the_one_message_it_is_stored_citing() -> None:
    # Caroline's answer and Melanie's next question together hold every word of "Caroline
    # asked what kind of counseling and mental health services she wanted to pursue", which
    # is false (Melanie asked, before). A line is stored citing one message, so one message
    # must bear it out, found or cited.
    said = [
        ("Melanie", "What kind of counseling and mental health services do you want to persue?"),
        (
            "Caroline",
            "I want to work with trans people, supporting their mental health; I went to a counseling workshop.",
        ),
        ("Melanie", "What motivated you to pursue it? What kind of services do you like?"),
    ]
    entries = tuple(
        LogEntry(
            seq=60 + i,
            message=Message(
                "user" if who == "Caroline" else "assistant",
                (Part("text", text),),
                author=who,
                at=AT + timedelta(minutes=i),
            ),
            tokens=20,
        )
        for i, (who, text) in enumerate(said)
    )
    ev = evidence_for(entries, lang="en", user_name="Caroline", character="Melanie")
    line = "Caroline asked what kind of counseling and mental health services she wanted to pursue."
    assert not ev.check(Statement("line", line, ())).ok  # found nowhere alone
    assert not ev.check(Statement("line", line, (61, 62))).ok  # cited as a pair
    # one message that says it all is found, and cited
    true = ev.check(Statement("line", "Caroline went to a counseling workshop.", ()))
    assert true.ok and true.seqs == (61,)
