"""Archive recall: for each user message, find the closest past exchanges outside the raw window.

The fourth memory layer (seed 003): every message stays in the archive, and "last month's topic
can be continued" because a light relevance search (`kioku.recall.archive`) puts the best-matching
old exchange next to the new user message as a recollection (after the raw window, so the prompt
cache survives). The index persists as immutable segments in the store (`recall_segments`); the
messages table stays the source of truth, so a lost or outdated segment only costs a rebuild.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kioku.cast import as_recorded
from kioku.messages import LogEntry
from kioku.recall.archive import (
    ArchiveIndex,
    BM25Params,
    Hit,
    Scorer,
    Segment,
    Terms,
    index_text,
)
from kioku.recall.recollection import RecalledLine, Recollection
from kioku.sensitive import WITHHELD, opened_by_earlier, withheld
from kioku.store import Store
from kioku.store.segments import StoredSegment
from kioku.tokens import TokenCounter

DEFAULT_SEGMENT_SIZE = 512  # messages per persisted segment
DEFAULT_MAX_SEGMENTS = 8  # more than this on load: merge them into one
DEFAULT_LIMIT = 3  # recollections per user message
# what one recalled exchange (a turn and its neighbours) takes, about: how many recollections
# a question's room holds
EXCHANGE_TOKENS = 48
SECRET_LOOKBACK = 4  # messages read before an exchange for a secret's keyword (`_line`)
MIN_CUT_TOKENS = 24  # below this, a cut-down recollection says too little to be worth it


# recollections -----------------------------------------------------------------------------


Lookup = Callable[[int, int], Sequence[LogEntry]]  # (first, last) inclusive → entries


def _line(e: LogEntry, opened: bool = False) -> RecalledLine:
    # a line held back from memory is not brought back by recall either (`kioku.sensitive`):
    # the raw window shows the log as it is, a recollection is memory
    text = withheld(e.message.text, opened=opened)
    return RecalledLine(e.seq, e.message.author or e.message.role, text, e.message.at)


def _fit(
    lines: tuple[RecalledLine, ...],
    centre: int,
    score: float,
    budget: int,
    counter: TokenCounter,
    lang: str = "en",
) -> Recollection | None:
    """The exchange within `budget` tokens: whole, else its centre line, else that line cut."""

    def counted(cand: tuple[RecalledLine, ...]) -> Recollection:
        rec = Recollection(cand[0].seq, cand[-1].seq, score, cand, lang=lang)
        return replace(rec, tokens=counter.count(rec.text))

    middle = tuple(ln for ln in lines if ln.seq == centre)
    for cand in (lines, middle):
        if cand and (rec := counted(cand)).tokens <= budget:
            return rec
    if not middle or budget < MIN_CUT_TOKENS:
        return None
    ln = middle[0]

    def cut(n: int) -> Recollection:
        return counted((RecalledLine(ln.seq, ln.speaker, ln.text[:n] + "…", ln.at),))

    lo, hi = 0, len(ln.text)  # the longest prefix of the centre line that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cut(mid).tokens <= budget:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo) if lo else None


def recall(
    scorer: Scorer,
    lookup: Lookup,
    query: str,
    *,
    before_seq: int,
    budget_tokens: int,
    counter: TokenCounter,
    limit: int = DEFAULT_LIMIT,
    neighbours: int = 1,
    min_score: float = 0.0,
    min_relevance: float = 0.0,
    lang: str = "en",
) -> list[Recollection]:
    """The best past exchanges for `query` among seqs < before_seq, best first, together within
    `budget_tokens` (measured on `Recollection.text`, dates written for `lang`). Each is the
    matching turn with its ±`neighbours`, clipped below before_seq; overlapping exchanges are
    not repeated."""
    if budget_tokens <= 0 or limit <= 0 or not query.strip():
        return []
    hits = []
    for hit in scorer.search(query, k=limit * 4, before_seq=before_seq):
        if hit.relevance < min_relevance:
            break  # hits come best first
        if hit.score > min_score:
            hits.append(hit)
    return exchanges(
        hits,
        lookup,
        before_seq=before_seq,
        budget_tokens=budget_tokens,
        counter=counter,
        limit=limit,
        neighbours=neighbours,
        lang=lang,
    )


def exchanges(
    hits: Sequence[Hit],
    lookup: Lookup,
    *,
    before_seq: int,
    budget_tokens: int,
    counter: TokenCounter,
    limit: int = DEFAULT_LIMIT,
    neighbours: int = 1,
    lang: str = "en",
    skip: Callable[[LogEntry], bool] | None = None,
) -> list[Recollection]:
    """The recollections of `hits` (in their order): each hit's turn with its ±`neighbours`,
    clipped below before_seq, together within `budget_tokens`; an exchange that overlaps one
    already taken keeps only its new lines, and lines `skip` names (what the prompt shows
    already) are left out."""
    taken: set[int] = set()
    out: list[Recollection] = []
    left = budget_tokens
    blank = False  # a recollection of withheld lines only was taken: one says all they can
    for hit in hits:
        if hit.seq in taken or hit.seq >= before_seq or left <= 0:
            continue
        lo, hi = max(0, hit.seq - neighbours), min(before_seq - 1, hit.seq + neighbours)
        seqs = [q for q in range(lo, hi + 1) if q not in taken]
        if not seqs:
            continue
        # read from a few messages before: a value typed as the message after its keyword
        # ("my password is", a reply, "hunter2") is withheld as the keyword's; a user's line
        # is the user's, whatever its name
        around = as_recorded(lookup(max(0, seqs[0] - SECRET_LOOKBACK), seqs[-1]))
        opened = opened_by_earlier([(e.message.role, e.message.text) for e in around])
        lines = tuple(
            _line(e, value)
            for e, value in zip(around, opened, strict=True)
            if e.seq in seqs
            and e.seq < before_seq
            and e.message.role in ("user", "assistant")
            and not e.message.is_empty()  # deleted: nothing of it is recalled
            and not (skip and skip(e))
        )
        if not lines:
            continue
        if all(ln.text == WITHHELD for ln in lines):
            if blank:
                continue
            blank = True
        fitted = _fit(lines, hit.seq, hit.score, left, counter, lang)
        if fitted is None:
            continue
        out.append(fitted)
        left -= fitted.tokens
        taken.update(range(fitted.first_seq, fitted.last_seq + 1))
        if len(out) >= limit:
            break
    return out


@dataclass(frozen=True)
class _Searching:
    """A scorer that only searches (through a function that also keeps the hits it found)."""

    search_fn: Callable[..., list[Hit]]

    def add(self, entries: Sequence[LogEntry]) -> None:
        raise NotImplementedError

    def search(self, query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]:
        return self.search_fn(query, k=k, before_seq=before_seq)


# persistence: one index per conversation, kept in the store ------------------------------------


@dataclass
class LoadStats:
    segments: int = 0
    replayed: int = 0
    seconds: float = 0.0
    rebuilt: bool = False


class RecallIndexes:
    """Archive indexes by conversation id, loaded from and saved to a `Store`.

    `index(conv)` loads the persisted segments and replays newer messages from the log;
    `add(conv, entries)` indexes messages the caller just stored and writes a segment every
    `segment_size` messages; `recall(...)` first pulls any messages another process stored.
    An edit or a delete of a stored message (by any process) bumps the conversation's
    `revision` and drops the segments from it on (`kioku.store.edits`): the index is loaded
    again, so the old text is found by no search."""

    def __init__(
        self,
        store: Store,
        *,
        terms: Terms | None = None,
        params: BM25Params | None = None,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        max_segments: int = DEFAULT_MAX_SEGMENTS,
    ) -> None:
        self.store = store
        self.terms = terms or Terms()
        self.params = params or BM25Params()
        self.segment_size = segment_size
        self.max_segments = max_segments
        self.stats: dict[str, LoadStats] = {}
        self._indexes: dict[str, ArchiveIndex] = {}
        self._born: dict[str, float] = {}  # when each indexed conversation was made
        self._revisions: dict[str, int] = {}  # the log's revision each index was loaded at
        self._lock = threading.RLock()  # a load may save a segment

    def index(self, conversation_id: str) -> ArchiveIndex:
        with self._lock:
            idx = self._indexes.get(conversation_id)
            if idx is None:
                idx = self._indexes[conversation_id] = self._load(conversation_id)
            return idx

    def add(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        idx = self.index(conversation_id)
        idx.add(entries)
        if idx.pending >= self.segment_size:
            self._save(conversation_id, idx)

    def sync(self, conversation_id: str) -> ArchiveIndex:
        """Index whatever the log holds beyond the index (messages stored by someone else);
        after an edit or a delete, the index as the log is now. A conversation deleted and
        begun again under the same key (by another process) is another: its index is read
        again from what the store holds now."""
        info = self.store.conversation(conversation_id)
        with self._lock:
            if self._revisions.get(conversation_id, info.revision) != info.revision:
                self._indexes.pop(conversation_id, None)
        idx = self.index(conversation_id)
        born = self._born.setdefault(conversation_id, info.created_at)
        if born != info.created_at or info.next_seq < idx.size:
            self.forget(conversation_id)
            idx = self.index(conversation_id)
            self._born[conversation_id] = info.created_at
        if info.next_seq > idx.size:
            self.add(conversation_id, self.store.entries(conversation_id, idx.size))
        return idx

    def forget(self, conversation_id: str) -> None:
        """Drop the conversation's index from memory, unsaved (it was deleted)."""
        with self._lock:
            self._indexes.pop(conversation_id, None)
            self._born.pop(conversation_id, None)
            self._revisions.pop(conversation_id, None)
            self.stats.pop(conversation_id, None)

    def flush(self, conversation_id: str | None = None) -> None:
        ids = [conversation_id] if conversation_id else list(self._indexes)
        for cid in ids:
            if cid in self._indexes:
                self._save(cid, self._indexes[cid])

    def recall(
        self,
        conversation_id: str,
        query: str,
        *,
        before_seq: int,
        budget_tokens: int,
        counter: TokenCounter,
        limit: int = DEFAULT_LIMIT,
        min_relevance: float = 0.0,
        lang: str = "en",
    ) -> list[Recollection]:
        idx = self.sync(conversation_id)
        found: list[Hit] = []

        def search(query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]:
            found[:] = idx.search(query, k=k, before_seq=before_seq)
            return list(found)

        return recall(
            _Searching(search),
            self.lookup(conversation_id, found),
            query,
            before_seq=before_seq,
            budget_tokens=budget_tokens,
            counter=counter,
            limit=limit,
            min_relevance=min_relevance,
            lang=lang,
        )

    def lookup(self, conversation_id: str, hits: Sequence[Hit], block: int = 12) -> Lookup:
        """Messages by seq range, read from the store: a range not read yet is read together
        with the neighbourhoods of the next `block` hits (`hits` as they are by then), so a
        turn that looks at its best hits reads them in one query, not one per hit."""
        cache: dict[int, LogEntry] = {}
        done = [0]  # hits whose neighbourhoods were read

        def read(first: int, last: int) -> Sequence[LogEntry]:
            missing = [q for q in range(first, last + 1) if q not in cache]
            if missing:
                ahead = hits[done[0] : done[0] + block]
                done[0] += len(ahead)
                # a hit's neighbours, and the messages `exchanges` reads before them
                near = {h.seq + d for h in ahead for d in range(-1 - SECRET_LOOKBACK, 2)}
                wanted = sorted(q for q in near.union(missing) if q >= 0 and q not in cache)
                cache.update((e.seq, e) for e in self.store.entries_at(conversation_id, wanted))
            return [cache[q] for q in range(first, last + 1) if q in cache]

        return read

    def _save(self, conversation_id: str, idx: ArchiveIndex) -> None:
        if self.store.readonly:
            return  # a read-only command searches in memory and persists nothing
        if self.store.conversation(conversation_id).revision != self._revisions.get(
            conversation_id
        ):
            # the log was edited since this index was loaded: its postings may hold old text
            with self._lock:
                self._indexes.pop(conversation_id, None)
            return
        seg = idx.take_segment()
        if seg is not None:
            _write_segments(self.store, conversation_id, [seg])

    def _load(self, conversation_id: str) -> ArchiveIndex:
        t0 = time.perf_counter()
        stats = LoadStats()
        # read first: an edit landing while this loads is seen at the next `sync`
        self._revisions[conversation_id] = self.store.conversation(conversation_id).revision
        idx = ArchiveIndex(self.terms, self.params)
        segs = _read_segments(self.store, conversation_id)
        usable = bool(segs) and all(g.tokenizer == self.terms.version for g in segs)
        usable = usable and all(
            a.last_seq + 1 == z.first_seq for a, z in zip(segs, segs[1:], strict=False)
        )
        usable = usable and segs[0].first_seq == 0
        if segs and not usable:
            # written by another tokenizer version, or broken: the log rebuilds it
            if not self.store.readonly:
                _drop_segments(self.store, conversation_id)
            stats.rebuilt = True
            segs = []
        for seg in segs:
            idx.load_segment(seg)
        stats.segments = len(segs)
        if len(segs) > self.max_segments and not self.store.readonly:
            _write_segments(self.store, conversation_id, [idx.whole_segment()], replace=True)
        tail = self.store.entries(conversation_id, idx.size)
        idx.add(tail)
        stats.replayed = len(tail)
        if idx.pending >= self.segment_size:
            self._save(conversation_id, idx)
        stats.seconds = time.perf_counter() - t0
        self.stats[conversation_id] = stats
        return idx


def _read_segments(store: Store, conversation_id: str) -> list[Segment]:
    return [
        Segment.from_bytes(g.first_seq, g.last_seq, g.tokenizer, g.data)
        for g in store.recall_segments(conversation_id)
    ]


def _drop_segments(store: Store, conversation_id: str) -> None:
    store.drop_recall_segments(conversation_id)


def _write_segments(
    store: Store, conversation_id: str, segs: Iterable[Segment], replace: bool = False
) -> None:
    stored = (StoredSegment(g.first_seq, g.last_seq, g.tokenizer, g.to_bytes()) for g in segs)
    store.save_recall_segments(conversation_id, stored, replace=replace)


# an optional embedding scorer ----------------------------------------------------------------


Embed = Callable[[Sequence[str]], np.ndarray]  # texts → (n, dim) vectors


@dataclass
class EmbeddingScorer:
    """Cosine similarity over ±1-turn windows of sentence embeddings, in memory.

    Not the default: no embedding model ships with kioku. Pass any `embed` function (for example
    a model2vec static model) and use it wherever a `Scorer` goes, alone or through `fuse`."""

    embed: Embed
    neighbour_weight: float = 1.0
    _vecs: list[np.ndarray] = field(default_factory=list)
    _size: int = 0

    def add(self, entries: Sequence[LogEntry]) -> None:
        fresh = [e for e in entries if e.seq >= self._size]
        if not fresh:
            return
        texts = [index_text(e) for e in fresh]
        vecs = np.asarray(self.embed(texts), dtype=np.float32)
        for e, text, v in zip(fresh, texts, vecs, strict=True):
            while self._size < e.seq:  # gaps: zero vectors never match
                self._vecs.append(np.zeros_like(v))
                self._size += 1
            norm = float(np.linalg.norm(v))
            self._vecs.append(v / norm if norm and text else np.zeros_like(v))
            self._size += 1

    def search(self, query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]:
        n = self._size if before_seq is None else max(0, min(before_seq, self._size))
        if n == 0 or k <= 0:
            return []
        m = np.stack(self._vecs[:n])
        win = m.copy()
        if self.neighbour_weight and n > 1:
            win[1:] += self.neighbour_weight * m[:-1]
            win[:-1] += self.neighbour_weight * m[1:]
        norms = np.linalg.norm(win, axis=1)
        q = np.asarray(self.embed([query]), dtype=np.float32)[0]
        qn = float(np.linalg.norm(q)) or 1.0
        sims = np.where(norms > 0, win @ q / (np.where(norms > 0, norms, 1.0) * qn), 0.0)
        sims[~m.any(axis=1)] = 0.0
        top = np.argsort(-sims)[:k]
        return [Hit(int(u), float(sims[u])) for u in top if sims[u] > 0]


@dataclass
class Fused:
    """Reciprocal-rank fusion of several scorers (e.g. BM25 + embeddings)."""

    scorers: Sequence[Scorer]
    k_rrf: int = 60

    def add(self, entries: Sequence[LogEntry]) -> None:
        for sc in self.scorers:
            sc.add(entries)

    def search(self, query: str, k: int = 10, before_seq: int | None = None) -> list[Hit]:
        fused: dict[int, float] = {}
        for sc in self.scorers:
            for rank, hit in enumerate(sc.search(query, k * 3, before_seq)):
                fused[hit.seq] = fused.get(hit.seq, 0.0) + 1.0 / (self.k_rrf + rank + 1)
        best = sorted(fused.items(), key=lambda x: (-x[1], -x[0]))[:k]
        return [Hit(seq, score) for seq, score in best]
