from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kioku.messages import LogEntry, Message
from kioku.recall import (
    ArchiveIndex,
    BM25Params,
    EmbeddingScorer,
    Fused,
    RecallIndexes,
    Segment,
    Terms,
    index_text,
    recall,
)
from kioku.recollection import RecalledLine, Recollection
from kioku.store import Store
from kioku.tokens import ScriptEstimator

FILLER = [
    "the weather was grey all afternoon",
    "we talked about nothing much",
    "dinner was rice and soup again",
    "the train came late as usual",
    "work kept me busy until evening",
    "i watched an old film on the sofa",
    "the neighbours were noisy tonight",
    "i should clean the kitchen tomorrow",
]


def entries_of(texts: list[str], authors: tuple[str, str] = ("Aki", "Mika")) -> list[LogEntry]:
    out = []
    for i, t in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        out.append(LogEntry(seq=i, message=Message.of(role, t, author=authors[i % 2])))
    return out


def filler(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(FILLER) for _ in range(n)]


def lookup_of(entries: list[LogEntry]):
    return lambda first, last: [e for e in entries if first <= e.seq <= last]


def test_terms_stem_english_and_drop_stop_words():
    terms = Terms()
    out = terms("The dogs were running to Caroline's support groups")
    assert "the" not in out and "to" not in out
    assert "dog" in out and "run" in out and "group" in out
    assert any(t.startswith("carolin") for t in out)


def test_terms_cut_japanese_into_bigrams():
    out = Terms()("来週は私の誕生日なの")
    assert "誕生" in out and "生日" in out and "来週" in out
    assert "誕" in out  # single Han characters too: 「猫」 is a word on its own


def test_search_finds_the_planted_turn():
    texts = filler(60)
    texts[17] = "my sister Yuki is getting married in Kyoto next spring"
    index = ArchiveIndex()
    index.add(entries_of(texts))
    hits = index.search("when is Yuki's wedding in Kyoto?", k=5)
    assert hits and hits[0].seq == 17


def test_search_never_returns_the_raw_window():
    texts = filler(40)
    texts[35] = "the red lighthouse by the harbour"
    index = ArchiveIndex()
    index.add(entries_of(texts))
    assert index.search("red lighthouse harbour", k=5, before_seq=40)[0].seq == 35
    # the only matching turn is in the raw window: nothing, not even its neighbours' windows
    assert index.search("red lighthouse harbour", k=5, before_seq=35) == []
    assert index.search("red lighthouse harbour", k=5, before_seq=0) == []


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["tea", "cat", "rain", "moon", "bike", "猫", "誕生日"]),
        min_size=30,
        max_size=80,
    ),
    before=st.integers(min_value=0, max_value=90),
    query=st.sampled_from(["tea cat", "rain moon bike", "猫の誕生日", "moon"]),
)
def test_no_hit_at_or_after_before_seq(words, before, query):
    index = ArchiveIndex()
    index.add(entries_of(words))
    for hit in index.search(query, k=10, before_seq=before):
        assert hit.seq < before


def reference_scores(
    docs: list[list[str]], query: list[str], n: int, p: BM25Params
) -> dict[int, float]:
    """BM25 over weighted windows, the slow obvious way."""
    tfs = [Counter(d) for d in docs[:n]]
    lens = [len(d) for d in docs[:n]]
    shifts = p.shifts()
    win_tf: list[Counter[str]] = []
    win_len: list[float] = []
    for i in range(n):
        c: Counter[str] = Counter()
        length = float(lens[i])
        for t, v in tfs[i].items():
            c[t] += v
        for d, w in shifts:
            for j in (i - d, i + d):
                if 0 <= j < n:
                    length += w * lens[j]
                    for t, v in tfs[j].items():
                        c[t] += w * v
        win_tf.append(c)
        win_len.append(length)
    units = [i for i in range(n) if lens[i] > 0]
    avg = sum(win_len[i] for i in units) / len(units)
    out: dict[int, float] = {}
    for t in dict.fromkeys(query):
        df = sum(1 for i in units if win_tf[i][t] > 0)
        if not df:
            continue
        idf = math.log(1 + (len(units) - df + 0.5) / (df + 0.5))
        for i in units:
            tf = win_tf[i][t]
            if tf:
                norm = p.k1 * (1 - p.b + p.b * win_len[i] / avg)
                out[i] = out.get(i, 0.0) + idf * tf * (p.k1 + 1) / (tf + norm)
    return out


@pytest.mark.parametrize(
    "params",
    [
        BM25Params(),
        BM25Params(neighbour_weight=1.0, reach=1, b=0.75),
        BM25Params(neighbour_weight=0),
    ],
)
def test_scores_match_reference_bm25_on_windows(params):
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    docs = [[rng.choice(vocab[: 5 + i % 35]) for _ in range(rng.randint(0, 9))] for i in range(400)]
    docs[123] = ["rareword", "w1"]  # one posting: the sparse path; w1..w4: the dense one
    index = ArchiveIndex(terms=Terms(stem=False), params=params)
    index.add(entries_of([" ".join(d) for d in docs], authors=("", "")))
    terms = Terms(stem=False)
    for query, n in (("rareword w1", 400), ("w2 w3 w30", 300), ("rareword", 124)):
        want = reference_scores([terms(" ".join(d)) for d in docs], terms(query), n, params)
        got = {h.seq: h.score for h in index.search(query, k=1000, before_seq=n)}
        assert set(got) == set(want)
        for seq, score in want.items():
            assert got[seq] == pytest.approx(score, rel=1e-5)


def test_incremental_add_then_search_finds_the_new_message():
    index = ArchiveIndex()
    entries = entries_of(filler(30))
    index.add(entries)
    assert index.search("volcano", k=3) == []
    new = LogEntry(seq=30, message=Message.user("we climbed the volcano at dawn", author="Aki"))
    index.add([new])
    index.add([new])  # replaying a seq is harmless
    assert index.size == 31
    assert index.search("volcano climb", k=3)[0].seq == 30


def test_japanese_conversation():
    texts = [
        "今日は雨だったね。",
        "うん、傘を忘れて濡れちゃった。",
        "来月の十日は私の誕生日なんだ。",
        "そうなんだ！何か欲しいものある？",
        "新しいマグカップが欲しいな。",
        "駅前のパン屋さん、閉店するらしいよ。",
        "えー、あそこのメロンパン好きだったのに。",
        "週末は映画を見に行こうか。",
    ] * 3
    index = ArchiveIndex()
    entries = entries_of(texts)
    index.add(entries)
    hits = index.search("誕生日のプレゼント、何がいい？", k=3, before_seq=20)
    assert hits and hits[0].seq in (2, 10, 18)
    recs = recall(
        index,
        lookup_of(entries),
        "誕生日いつだっけ",
        before_seq=20,
        budget_tokens=400,
        counter=ScriptEstimator(),
    )
    assert recs and any("誕生日" in ln.text for ln in recs[0].lines)
    assert all(ln.seq < 20 for r in recs for ln in r.lines)


def test_recall_returns_exchanges_with_speaker_and_date():
    at = datetime(2024, 5, 8, 13, 56)
    entries = [
        LogEntry(
            i,
            Message.of(
                "user" if i % 2 == 0 else "assistant",
                t,
                author="Aki" if i % 2 == 0 else "Mika",
                at=at,
            ),
        )
        for i, t in enumerate(filler(20))
    ]
    entries[9] = LogEntry(
        9, Message.assistant("I adopted a kitten named Mochi", author="Mika", at=at)
    )
    index = ArchiveIndex()
    index.add(entries)
    recs = recall(
        index,
        lookup_of(entries),
        "how is Mochi the kitten?",
        before_seq=18,
        budget_tokens=500,
        counter=ScriptEstimator(),
    )
    r = recs[0]
    assert (r.first_seq, r.last_seq) == (8, 10)
    assert [ln.speaker for ln in r.lines] == ["Aki", "Mika", "Aki"]
    assert r.at == at
    text = r.text
    # the raw window's date line, and the neighbour's "tomorrow" as the day it meant
    assert text.splitlines()[1] == "⟦Wednesday, 8 May 2024⟧"
    assert "Mika: I adopted a kitten named Mochi" in text
    assert "Aki: i should clean the kitchen tomorrow (9 May 2024)" in text
    assert r.tokens == ScriptEstimator().count(text)


def test_a_recollection_dates_each_day_it_spans_in_the_conversations_language() -> None:
    first, second = datetime(2024, 5, 8, 21, tzinfo=UTC), datetime(2024, 5, 12, 9, tzinfo=UTC)
    lines = (
        RecalledLine(3, "アキ", "昨日ミカと映画を見た", first),
        RecalledLine(4, "ミカ", "楽しかったね", first),
        RecalledLine(5, "アキ", "先週の話だけど", second),
    )
    text = Recollection(3, 5, 1.0, lines, lang="ja").text.splitlines()
    assert text == [
        "⟦#3–5⟧",
        "⟦2024年5月8日(水)⟧",
        "アキ: 昨日(2024年5月7日)ミカと映画を見た",
        "ミカ: 楽しかったね",
        "⟦2024年5月12日(日)⟧",
        "アキ: 先週(2024年4月29日の週)の話だけど",  # said on a Sunday: the week before
    ]


def test_recall_clips_neighbours_at_the_raw_window():
    texts = filler(20)
    texts[9] = "I adopted a kitten named Mochi"
    entries = entries_of(texts)
    index = ArchiveIndex()
    index.add(entries)
    recs = recall(
        index,
        lookup_of(entries),
        "Mochi kitten",
        before_seq=10,
        budget_tokens=500,
        counter=ScriptEstimator(),
    )
    assert recs[0].last_seq == 9 and all(ln.seq < 10 for ln in recs[0].lines)


@pytest.mark.parametrize("budget", [0, 10, 25, 40, 80, 2000])
def test_recall_respects_the_budget(budget):
    counter = ScriptEstimator()
    texts = filler(200, seed=5)
    for i in (20, 60, 100, 140):
        texts[i] = "the kitten Mochi chased a moth " + "around the garden " * 6
    entries = entries_of(texts)
    index = ArchiveIndex()
    index.add(entries)
    recs = recall(
        index,
        lookup_of(entries),
        "Mochi the kitten",
        before_seq=190,
        budget_tokens=budget,
        counter=counter,
        limit=3,
    )
    assert sum(r.tokens for r in recs) <= budget
    assert all(counter.count(r.text) == r.tokens for r in recs)
    if budget >= 2000:
        assert len(recs) == 3 and all(len(r.lines) == 3 for r in recs)
    if budget == 40:  # too small for an exchange: the centre line alone, or cut short
        assert recs and all(len(r.lines) == 1 for r in recs)
    seqs = [ln.seq for r in recs for ln in r.lines]
    assert len(seqs) == len(set(seqs))  # overlapping exchanges are not repeated


def test_segment_roundtrip():
    index = ArchiveIndex()
    index.add(entries_of(["alpha beta", "gamma 誕生日", "", "beta beta"]))
    seg = index.take_segment()
    assert seg is not None and index.take_segment() is None
    back = Segment.from_bytes(seg.first_seq, seg.last_seq, seg.tokenizer, seg.to_bytes())
    assert back.vocab == seg.vocab and np.array_equal(back.seqs, seg.seqs)
    copy = ArchiveIndex()
    copy.load_segment(back)
    assert copy.size == 4
    assert copy.search("beta", k=5) == index.search("beta", k=5)


def stored_conversation(
    path: Path, texts: list[str], indexes_kw: dict | None = None
) -> tuple[Store, RecallIndexes]:
    """A conversation stored message by message, each indexed as it is stored (as live)."""
    store = Store.open(str(path))
    store.ensure_conversation("c1")
    indexes = RecallIndexes(store, **(indexes_kw or {}))
    for i, t in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        msg = Message.of(role, t, author="Aki" if role == "user" else "Mika")
        indexes.add("c1", [store.append("c1", msg, tokens=5)])
    return store, indexes


def test_index_survives_restart(tmp_path):
    texts = filler(50)
    texts[7] = "grandma's apple pie recipe uses cinnamon and cardamom"
    db = tmp_path / "k.db"
    # a segment every 16 messages: three, and 2 messages pending until the flush
    store, indexes = stored_conversation(db, texts, {"segment_size": 16})
    indexes.flush()
    store.close()

    store2 = Store.open(str(db))
    store2.append("c1", Message.user("a cardamom latte today", author="Aki"), tokens=5)  # unindexed
    again = RecallIndexes(store2, segment_size=16)
    idx = again.index("c1")
    stats = again.stats["c1"]
    assert stats.segments == 4 and stats.replayed == 1 and not stats.rebuilt
    assert idx.size == 51
    recs = again.recall(
        "c1",
        "the apple pie recipe with cardamom",
        before_seq=40,
        budget_tokens=300,
        counter=ScriptEstimator(),
    )
    assert recs[0].first_seq <= 7 <= recs[0].last_seq
    store2.close()


def test_recall_picks_up_messages_stored_by_someone_else(tmp_path):
    store, indexes = stored_conversation(tmp_path / "k.db", filler(10))
    store.append("c1", Message.user("the tarot reader said something odd", author="Aki"), tokens=5)
    for t in filler(5):
        store.append("c1", Message.user(t, author="Aki"), tokens=5)
    recs = indexes.recall(
        "c1",
        "what did the tarot reader say?",
        before_seq=14,
        budget_tokens=300,
        counter=ScriptEstimator(),
    )
    assert any(ln.seq == 10 for ln in recs[0].lines)


def test_a_tokenizer_change_rebuilds_from_the_log(tmp_path):
    texts = filler(30)
    texts[3] = "the running club meets on thursdays"
    store, old = stored_conversation(
        tmp_path / "k.db", texts, {"terms": Terms(stem=False), "segment_size": 8}
    )
    old.flush()
    new = RecallIndexes(store, segment_size=8)
    idx = new.index("c1")
    assert new.stats["c1"].rebuilt and idx.size == 30
    assert idx.search("run club", k=1)[0].seq == 3


def test_many_segments_are_merged_on_load(tmp_path):
    store, _ = stored_conversation(tmp_path / "k.db", filler(40), {"segment_size": 4})
    second = RecallIndexes(store, segment_size=4, max_segments=3)
    assert second.index("c1").size == 40 and second.stats["c1"].segments == 10
    third = RecallIndexes(store, segment_size=4, max_segments=3)
    assert third.index("c1").size == 40 and third.stats["c1"].segments == 1


def test_index_text_skips_system_messages():
    assert index_text(LogEntry(0, Message.of("system", "secret rules"))) == ""
    assert "Mika" in index_text(LogEntry(1, Message.assistant("hello", author="Mika")))


def bag_of_letters(texts):
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out


def test_embedding_scorer_and_fusion_keep_to_the_boundary():
    texts = filler(30)
    texts[12] = "zzz quiz jazz"
    entries = entries_of(texts)
    emb = EmbeddingScorer(bag_of_letters)
    emb.add(entries)
    assert emb.search("jazz quiz", k=3)[0].seq in (11, 12, 13)
    assert all(h.seq < 12 for h in emb.search("jazz quiz", k=10, before_seq=12))
    bm25 = ArchiveIndex()
    fused = Fused([bm25, emb])
    fused.add(entries)
    hits = fused.search("jazz quiz", k=5, before_seq=25)
    assert 12 in [h.seq for h in hits[:3]] and all(h.seq < 25 for h in hits)
