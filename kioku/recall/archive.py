"""The archive index: BM25 over windows of turns, incremental, persisted as segments.

Scoring is BM25 over *windows*: each turn is scored together with its neighbours, whose words
count half (one turn away) and a quarter (two away). On the English evaluation's dev half
single turns gave evidence recall@10 59, ±1 concatenated 73, this weighting 76; a window is
ranked by the turn it is centred on. The index is an inverted index of our own (per-term arrays
of seq and term frequency) so a live conversation adds a message in microseconds; windows are
assembled at query time from turn postings, so a turn's window includes its successor without
re-indexing anything. Segments (`Segment`) are what `kioku.recall` persists in the store.

Tokens: English words lowercased, stop words dropped, Snowball-stemmed (PyStemmer; a crude
suffix stripper if it is missing); Chinese/Japanese/Korean runs as character bigrams plus single
Han characters, so 「誕生日」 is found without a dictionary.
"""

from __future__ import annotations

import io
import math
import re
import threading
import unicodedata
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from bm25s.stopwords import STOPWORDS_EN_PLUS

from kioku.errors import InputError
from kioku.lang import EN
from kioku.messages import LogEntry

TOKENIZER_VERSION = "terms-1"
DEFAULT_K1 = 1.2
DEFAULT_B = 0.5  # windows vary in length less than turns do: normalise less (tuned on dev)
DEFAULT_NEIGHBOUR_WEIGHT = 0.5  # a neighbour's words count half, two turns away a quarter
DEFAULT_REACH = 2
MAX_QUERY_TERMS = 48  # a pasted essay as a user message must not cost a scan per word

# tokenizer ---------------------------------------------------------------------------------

_CJK = "\u3005\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_]+(?:['\u2019][^\W_]+)*)")
_HAN = re.compile(r"[\u3005\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CLITICS = EN.clitics  # the words of a language are data (`kioku.lang`)
_STOP = frozenset(STOPWORDS_EN_PLUS) | EN.contracted


def _crude_stem(word: str) -> str:
    """Used only when PyStemmer is missing: strips the commonest English inflections."""
    for suf, min_len in (("ies", 5), ("ing", 6), ("ed", 5), ("es", 5), ("s", 4), ("ly", 6)):
        if word.endswith(suf) and len(word) >= min_len and not word.endswith("ss"):
            return word[: -len(suf)] + ("y" if suf == "ies" else "")
    return word


class Terms:
    """Text → index terms. Its `version` is stored with every segment: change the rules, bump it."""

    def __init__(self, stem: bool = True) -> None:
        self._stem: Callable[[str], str]
        if not stem:
            self._stem, name = (lambda w: w), "nostem"
        else:
            try:
                import Stemmer  # PyStemmer: the Snowball English stemmer, in C

                self._stem, name = Stemmer.Stemmer("english").stemWord, "snowball"
            except ImportError:
                self._stem, name = _crude_stem, "crude"
        self.version = f"{TOKENIZER_VERSION}+{name}"
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> list[str]:
        out: list[str] = []
        for m in _TOKEN.finditer(unicodedata.normalize("NFKC", text).lower()):
            run, word = m.group(1), m.group(2)
            if run:
                if len(run) == 1:
                    out.append(run)
                    continue
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
                out.extend(_HAN.findall(run))
                continue
            pieces = re.split("['\u2019]", word)
            if len(pieces) > 1:
                tail = pieces[1:] if pieces[-1] not in _CLITICS else pieces[1:-1]
                word = "".join([pieces[0], *tail])
            if len(word) < 2 and not word.isdigit() or word in _STOP:
                continue
            stem = self._cache.get(word)
            if stem is None:
                stem = self._cache[word] = self._stem(word)
            out.append(stem)
        return out


def index_text(entry: LogEntry) -> str:
    """What a message contributes to the index: who spoke and what they said (a deleted
    message: nothing)."""
    if entry.message.role not in ("user", "assistant") or entry.message.is_empty():
        return ""
    return f"{entry.message.author} {entry.message.text}"


# the index ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    seq: int  # the turn the matching window is centred on
    score: float
    # score ÷ the most any window could score for this query (every term, saturated): how much
    # of the query's meaning, weighted by rarity, the window holds — comparable across queries
    relevance: float = 0.0


@runtime_checkable
class Scorer(Protocol):
    """The retrieval boundary: BM25 (`ArchiveIndex`) is the default, embeddings are optional."""

    def add(self, entries: Sequence[LogEntry]) -> None: ...

    def search(self, query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]: ...


@dataclass(frozen=True)
class BM25Params:
    k1: float = DEFAULT_K1
    b: float = DEFAULT_B
    neighbour_weight: float = DEFAULT_NEIGHBOUR_WEIGHT  # 0 = single turns, 1 = ±1 concatenated
    reach: int = DEFAULT_REACH  # neighbours each side; the one d turns away weighs weight**d

    def shifts(self) -> list[tuple[int, float]]:
        if not self.neighbour_weight:
            return []
        return [(d, self.neighbour_weight**d) for d in range(1, self.reach + 1)]


class ArchiveIndex:
    """An incremental BM25 index over one conversation's messages, searched as ±1-turn windows.

    Messages must arrive in seq order; a seq already indexed is ignored, so replaying is safe.
    Thread-safe: one lock guards adds and searches."""

    def __init__(self, terms: Terms | None = None, params: BM25Params | None = None) -> None:
        self.terms = terms or Terms()
        self.params = params or BM25Params()
        self._post: dict[str, tuple[array[int], array[float]]] = {}
        self._lens: array[float] = array("f")  # terms per seq; 0 = not a unit
        self._pending: list[tuple[int, Counter[str]]] = []  # added since the last segment
        self._segment_start = 0  # first seq the next segment covers
        self._norm_cache: tuple[int, tuple[np.ndarray, np.ndarray, int]] | None = None
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """One past the last seq indexed."""
        return len(self._lens)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, entries: Sequence[LogEntry]) -> None:
        with self._lock:
            for e in entries:
                if e.seq < len(self._lens):
                    continue
                counts = Counter(self.terms(index_text(e)))
                self._put(e.seq, counts)
                self._pending.append((e.seq, counts))

    def _put(self, seq: int, counts: Mapping[str, int]) -> None:
        gap = seq - len(self._lens)
        if gap > 0:
            self._lens.extend([0.0] * gap)  # unindexed seqs (system messages, missing rows)
        self._lens.append(float(sum(counts.values())))
        for term, tf in counts.items():
            post = self._post.get(term)
            if post is None:
                post = self._post[term] = (array("i"), array("f"))
            post[0].append(seq)
            post[1].append(tf)

    def search(self, query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]:
        """The k best windows centred on a seq < before_seq, best first. Turns at or after
        before_seq (the raw window) neither match nor lend their words to a window."""
        with self._lock:
            n = len(self._lens) if before_seq is None else max(0, min(before_seq, len(self._lens)))
            wanted = [t for t in dict.fromkeys(self.terms(query)) if t in self._post]
            if n == 0 or k <= 0 or not wanted:
                return []
            if len(wanted) > MAX_QUERY_TERMS:  # keep the rarest: they carry the meaning
                wanted = sorted(wanted, key=lambda t: len(self._post[t][0]))[:MAX_QUERY_TERMS]
            scored = self._score(wanted, n)
        if scored is None:
            return []
        scores, ceiling = scored
        units = np.flatnonzero(scores > 0)
        if len(units) > k:
            units = units[np.argpartition(-scores[units], k - 1)[:k]]
        order = sorted(units.tolist(), key=lambda u: (-scores[u], -u))
        return [
            Hit(seq=int(u), score=float(scores[u]), relevance=float(scores[u]) / ceiling)
            for u in order
        ]

    def _norms(self, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Per window: BM25's length normaliser, whether it is a unit, and the unit count.

        Depends on n only (seqs below n never change), and n is the raw-window start, which
        stays put between folds: so it is computed once per n, not per query."""
        if self._norm_cache is not None and self._norm_cache[0] == n:
            return self._norm_cache[1]
        k1, b = self.params.k1, self.params.b
        lens = np.frombuffer(self._lens, dtype=np.float32, count=n).astype(np.float64)
        is_unit = lens > 0
        ulen = lens.copy()
        for d, wd in self.params.shifts():  # a window's length: its turns', weighted like words
            if d < n:
                ulen[d:] += wd * lens[:-d]
                ulen[:-d] += wd * lens[d:]
        n_units = int(np.count_nonzero(is_unit))
        mean = float(ulen[is_unit].mean()) if n_units else 1.0
        norm = k1 * (1 - b + b * ulen / mean) + 1e-9  # + ε: b = 1 and an empty window
        self._norm_cache = (n, (norm, is_unit, n_units))
        return norm, is_unit, n_units

    @property
    def _kernel(self) -> np.ndarray:
        """Weights of a window's turns, centre in the middle: [.25, .5, 1, .5, .25] by default."""
        side = [wd for _, wd in self.params.shifts()]
        return np.array(side[::-1] + [1.0] + side)

    def _score(self, wanted: list[str], n: int) -> tuple[np.ndarray, float] | None:
        """Window scores, and the most a window could score (every term saturated)."""
        norm, is_unit, n_units = self._norms(n)
        if n_units == 0:
            return None
        k1, shifts = self.params.k1, self.params.shifts()
        spread = 1 + 2 * len(shifts)
        scores = np.zeros(n)
        ceiling = 0.0
        for term in wanted:
            seqs_a, tfs_a = self._post[term]
            all_seqs = np.frombuffer(seqs_a, dtype=np.int32)
            cut = int(np.searchsorted(all_seqs, n))
            if cut == 0:
                continue
            sq, tf = all_seqs[:cut], np.frombuffer(tfs_a, dtype=np.float32, count=cut)
            # turn postings → window postings: a turn's words count in the windows around it
            if cut * spread * 8 < n:  # a rare term: work on its postings only
                idx = np.concatenate([sq] + [sq + o for d, _ in shifts for o in (-d, d)])
                val = np.concatenate([tf] + [wd * tf for _, wd in shifts for _ in (0, 1)])
                ok = (idx >= 0) & (idx < n)
                u, inv = np.unique(idx[ok], return_inverse=True)
                tfu = np.bincount(inv, weights=val[ok])
                keep = is_unit[u]
                u, tfu = u[keep].astype(np.int64), tfu[keep]
                df = len(u)
                idf = math.log(1 + (n_units - df + 0.5) / (df + 0.5))
                ceiling += idf * (k1 + 1)
                scores[u] += idf * tfu * (k1 + 1) / (tfu + norm[u])
            else:  # a common term: dense vectors over all n windows beat sorting
                turn = np.bincount(sq, weights=tf, minlength=n)
                # a window's term frequency: its turns' weighted like words, in one C pass
                reach = len(shifts)
                win = np.convolve(turn, self._kernel)[reach : reach + n] if shifts else turn
                win *= is_unit
                df = int(np.count_nonzero(win))
                idf = math.log(1 + (n_units - df + 0.5) / (df + 0.5))
                ceiling += idf * (k1 + 1)
                part = win + norm  # in place from here: these vectors are n long
                np.divide(win, part, out=part)
                part *= idf * (k1 + 1)
                scores += part
        return (scores, ceiling) if ceiling > 0 else None

    # segments: how the index is persisted ---------------------------------------------------

    def take_segment(self) -> Segment | None:
        """The postings added since the last call, as an immutable segment to persist."""
        with self._lock:
            if not self._pending:
                return None
            pending, self._pending = self._pending, []
            first, last = self._segment_start, len(self._lens) - 1
            self._segment_start = len(self._lens)
            lens = np.frombuffer(self._lens, dtype=np.float32)[first : last + 1].copy()
            by_term: dict[str, tuple[list[int], list[float]]] = {}
            for seq, counts in pending:
                for term, tf in counts.items():
                    sl = by_term.setdefault(term, ([], []))
                    sl[0].append(seq)
                    sl[1].append(float(tf))
            return Segment.build(first, last, lens, by_term, self.terms.version)

    def whole_segment(self) -> Segment:
        """Everything indexed, as one segment (to merge many small ones)."""
        with self._lock:
            lens = np.frombuffer(self._lens, dtype=np.float32).copy()
            by_term = {t: (p[0], p[1]) for t, p in self._post.items()}
            self._pending = []
            self._segment_start = len(lens)
            return Segment.build(0, len(lens) - 1, lens, by_term, self.terms.version)

    def load_segment(self, seg: Segment) -> None:
        with self._lock:
            if seg.tokenizer != self.terms.version:
                raise InputError(f"segment tokenized by {seg.tokenizer}, not {self.terms.version}")
            if seg.first_seq != len(self._lens):
                raise InputError(f"segment starts at {seg.first_seq}, index is at {self.size}")
            self._lens.frombytes(seg.lens.astype(np.float32).tobytes())
            for j, term in enumerate(seg.vocab):
                a, z = int(seg.ptr[j]), int(seg.ptr[j + 1])
                post = self._post.get(term)
                if post is None:
                    post = self._post[term] = (array("i"), array("f"))
                post[0].frombytes(seg.seqs[a:z].tobytes())
                post[1].frombytes(seg.tfs[a:z].tobytes())
            self._segment_start = len(self._lens)


@dataclass(frozen=True)
class Segment:
    """The postings of seqs first_seq..last_seq, grouped by term (CSR: vocab, ptr, seqs, tfs)."""

    first_seq: int
    last_seq: int
    tokenizer: str
    vocab: tuple[str, ...]
    ptr: np.ndarray
    seqs: np.ndarray
    tfs: np.ndarray
    lens: np.ndarray

    @classmethod
    def build(
        cls,
        first: int,
        last: int,
        lens: np.ndarray,
        by_term: Mapping[str, tuple[Sequence[int] | array[int], Sequence[float] | array[float]]],
        tokenizer: str,
    ) -> Segment:
        vocab = tuple(by_term)
        sizes = np.fromiter((len(by_term[t][0]) for t in vocab), dtype=np.int64, count=len(vocab))
        ptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(sizes, out=ptr[1:])
        empty: list[np.ndarray] = [np.zeros(0)]
        seqs = np.concatenate([np.asarray(by_term[t][0]) for t in vocab] or empty)
        tfs = np.concatenate([np.asarray(by_term[t][1]) for t in vocab] or empty)
        return cls(
            first, last, tokenizer, vocab, ptr, seqs.astype(np.int32), tfs.astype(np.float32), lens
        )

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        vocab = np.frombuffer("\n".join(self.vocab).encode(), dtype=np.uint8)
        np.savez(buf, vocab=vocab, ptr=self.ptr, seqs=self.seqs, tfs=self.tfs, lens=self.lens)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, first: int, last: int, tokenizer: str, data: bytes) -> Segment:
        z = np.load(io.BytesIO(data), allow_pickle=False)
        text = z["vocab"].tobytes().decode()
        vocab = tuple(text.split("\n")) if text else ()
        return cls(first, last, tokenizer, vocab, z["ptr"], z["seqs"], z["tfs"], z["lens"])
