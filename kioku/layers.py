"""The other memory layers, as one object the engine takes: archive recall, notes, the tic guard.

Each layer is its own module; `Layers` puts them behind the `kioku.hooks.MemoryLayers` protocol
(`Kioku(store, layers=Layers(store))`), so the engine's core stays ignorant of BM25, ledgers
and n-grams:
- recall: for a user message whose past is wanted (`kioku.recall.need`), the past exchanges that
  stand out become recollections at the end of the prompt (never in front of the raw window:
  the cache survives);
- notes: extracted in the background after each chapter (and at once, without a model, from what
  a forced or operator cut folds), rendered into the memory exchange at
  the next fold (an operator edit shows at once);
- tics: a phrase repeated across the last 20 replies raises an alert, adds an anti-repetition line
  at the end of the request, and is kept out of every summary.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

from kioku import notes as notes_layer
from kioku import tics as tics_layer
from kioku.context import asks_something
from kioku.errors import ConfigError
from kioku.lang import detect_lang
from kioku.messages import LogEntry
from kioku.models import ChatModel
from kioku.recall.archive import Hit
from kioku.recall.indexes import EXCHANGE_TOKENS, RecallIndexes, exchanges
from kioku.recall.need import BACKGROUND_HITS, STATEMENT, Need, Recall, judge, pointer
from kioku.recall.shown import shown
from kioku.store import Store
from kioku.turn_state import TurnState

TIC_WINDOW = 20
TIC_CONVERSATIONS = 1024  # conversations whose last replies `Layers` keeps in memory
_ASIDE = re.compile(r"\[[^\]]*\]")
_QUOTES = "「」『』\"'“”‘’()（）"


def _unquote(phrase: str) -> str:
    return phrase.strip().strip(_QUOTES + " 、。,.!?！？~～…").strip()


def _core(text: str) -> str:
    return re.sub(r"[\W_]+", "", text).casefold()


# (seq, content hash) of the replies read; the alerts; the replies
_TicState = tuple[tuple[tuple[int, str], ...], list[tics_layer.TicAlert], list[LogEntry]]


def _speakers(entry: LogEntry) -> list[str]:
    return [p.speaker for p in entry.message.parts if p.speaker]


class Layers:
    """Archive recall, notes and the verbal-tic guard, as `Kioku(layers=...)` takes them (the
    `kioku.hooks.MemoryLayers` protocol). A layer turned off answers as `NoLayers` does."""

    def __init__(
        self,
        store: Store,
        *,
        recall: bool = True,
        notes: bool = True,
        tics: bool = True,
        notes_model: ChatModel | None = None,
        tic_threshold: int = tics_layer.DEFAULT_THRESHOLD,
    ) -> None:
        self.store = store
        self.indexes = RecallIndexes(store) if recall else None
        self.notes_on = notes
        self.tics_on = tics
        self.notes_extractor = notes_layer.NotesExtractor(notes_model) if notes_model else None
        self.tic_threshold = tic_threshold
        self._alerted: dict[str, set[str]] = {}
        # the last detection per conversation, keyed by the replies it read (kept, so the next
        # reply is added to them, not read again): every turn asks, but the answer changes only
        # when a reply is added or edited. The conversations served lately, not every one.
        self._tics: OrderedDict[str, _TicState] = OrderedDict()
        self._tics_lock = threading.Lock()

    def recall(self, turn: TurnState, entry: LogEntry) -> Recall:
        """The gate (`kioku.recall.need.judge`) on the archive's best hits for the message, and the
        recollections of the hits it takes: each a turn with its neighbours, all of them
        within `Profile.recall_room` of the ceiling (the room is the prompt's to give)."""
        if self.indexes is None:
            return Recall(Need.off("recall is off"))
        raw_start = turn.info.raw_start
        if raw_start == 0:
            return Recall(Need.off("the raw window holds the whole conversation"))
        p, cid, window = turn.profile, turn.conversation_id, turn.before(entry)
        text = entry.message.text
        asks = asks_something(entry)
        view = shown(window, turn.memory, turn.lang)

        def holds(name: str) -> bool:
            return name in view.memory_text or any(name in e.message.text for e in window)

        if not asks and not pointer(text, turn.lang, holds):
            return Recall(Need.off(STATEMENT))  # most turns: no search for what nothing asks
        idx = self.indexes.sync(cid)
        # a question's are shown once (in front of it); what a statement is shown stays
        limit = max(1, p.recall_tokens // EXCHANGE_TOKENS) if asks else p.recall_limit
        hits = idx.search(text, k=max(BACKGROUND_HITS, limit), before_seq=raw_start)
        # the raw window's own best match (the message itself excluded): what is in view; for
        # a question, what its newest messages say (the talk it answers)
        near = idx.search(text, k=BACKGROUND_HITS, before_seq=entry.seq) if hits else []
        present = max(raw_start, entry.seq - p.recall_present) if asks else raw_start
        in_view = max((h.relevance for h in near if h.seq >= present), default=0.0)
        lookup = self.indexes.lookup(cid, hits)

        def seen(hit: Hit) -> bool:
            line = lookup(hit.seq, hit.seq)
            return bool(line) and view.line(line[0])

        windows: dict[int, str] = {}  # judge asks of the same hits for each name it weighs

        def names(hit: Hit, name: str) -> bool:
            # the hit's window as it is recalled (±1 turn): said, or the speaker ("Kat" is
            # Katherine); one line each, so a name never spans two of them
            if (said := windows.get(hit.seq)) is None:
                said = windows[hit.seq] = "\n".join(
                    f"{e.message.author}\n{e.message.text}"
                    for e in lookup(max(0, hit.seq - 1), hit.seq + 1)
                )
            return name in said

        need = judge(
            text,
            hits,
            seen=seen,
            holds=holds,
            lang=turn.lang,
            relevance=p.recall_relevance,
            cued_relevance=p.recall_cued_relevance,
            standout=p.recall_standout,
            in_view_share=p.recall_in_view,
            in_view=in_view,
            limit=limit,
            asks=asks,
            names=names,
        )
        if not need.on:
            return Recall(need)
        recs = exchanges(
            need.hits,
            lookup,
            before_seq=raw_start,
            budget_tokens=p.recall_tokens,
            counter=turn.counter,
            limit=len(need.hits),
            lang=turn.lang,
            skip=view.line,
        )
        return Recall(need, tuple(recs))

    def tic_alerts(
        self, conversation_id: str, window: Sequence[LogEntry] = ()
    ) -> list[tics_layer.TicAlert]:
        """`window`: the raw window a turn read (newest last). When it holds the last replies
        and they are the ones the last detection saw, nothing is read."""
        hit = self._tics.get(conversation_id)
        if hit is not None and window:
            # from the newest end: a long raw window holds hundreds of messages
            newest = islice((e for e in reversed(window) if e.role == "assistant"), TIC_WINDOW)
            replies = list(newest)[::-1]
            if len(replies) == TIC_WINDOW or window[0].seq == 0:  # it holds them all
                seen = hit[2]
                if len(seen) == len(replies) and all(
                    a.seq == b.seq and a.message == b.message
                    for a, b in zip(seen, replies, strict=True)
                ):
                    return list(hit[1])
        key = tuple(self.store.tail_hashes(conversation_id, TIC_WINDOW, role="assistant"))
        if hit is not None and hit[0] == key:
            return list(hit[1])
        replies = self.store.tail(conversation_id, TIC_WINDOW, role="assistant")
        return self._detect(conversation_id, key, replies)

    def after_reply(self, conversation_id: str, reply: LogEntry) -> list[tics_layer.TicAlert]:
        """The alerts once `reply` is stored, from the replies this process saw last time and
        the new one, without reading them again (a turn's cost); read when that is not known."""
        hit = self._tics.get(conversation_id)
        if hit is None or reply.role != "assistant" or (hit[0] and reply.seq <= hit[0][-1][0]):
            return self.tic_alerts(conversation_id)
        key = (*hit[0], (reply.seq, reply.message.content_hash()))[-TIC_WINDOW:]
        return self._detect(conversation_id, key, [*hit[2], reply][-TIC_WINDOW:])

    def _detect(
        self, conversation_id: str, key: tuple[tuple[int, str], ...], replies: list[LogEntry]
    ) -> list[tics_layer.TicAlert]:
        # bracketed asides ([shares a photo: …]) are markup, not the character's voice
        texts = [_ASIDE.sub("", e.text) for e in replies]
        alerts = tics_layer.detect_tics(texts, threshold=self.tic_threshold, window=TIC_WINDOW)
        # A name opening narration ("Mina smiled…") repeats, but it is not a way of speaking.
        names = {_core(n) for e in replies for n in (e.message.author, *_speakers(e))}
        alerts = [a for a in alerts if _core(a.phrase) not in names and _core(a.phrase)]
        with self._tics_lock:  # turns of other conversations run in other threads
            self._tics[conversation_id] = (key, alerts, replies)
            self._tics.move_to_end(conversation_id)
            while len(self._tics) > TIC_CONVERSATIONS:
                self._tics.popitem(last=False)
        return list(alerts)

    def instructions(self, turn: TurnState) -> list[str]:
        if not self.tics_on:
            return []
        cid = turn.conversation_id
        alerts = self.tic_alerts(cid, turn.window)
        if not alerts:
            return []
        known = self._known(cid)
        for a in alerts:
            if a.phrase not in known:
                self.store.log(cid, "tic_alert", "alert", detail=a.phrase)
                self.store.incr(cid, "tic_alerts")
                known.add(a.phrase)
        return [tics_layer.anti_repetition_line(alerts, turn.lang)]

    def avoid_phrases(self, conversation_id: str) -> list[str]:
        """Every phrase ever alerted, not only the live ones: a tic whose count dipped below the
        threshold this turn must still stay out of memory. Matched without the quotes around
        speech, since summaries quote differently."""
        if not self.tics_on:
            return []
        live = {a.phrase for a in self.tic_alerts(conversation_id)}
        known = self._known(conversation_id)
        return sorted({_unquote(p) for p in live | known} - {""})

    def _known(self, conversation_id: str) -> set[str]:
        known = self._alerted.get(conversation_id)
        if known is None:
            log = self.store.log_entries(conversation_id)
            known = {e["detail"] for e in log if e["event"] == "tic_alert" and e["detail"]}
            self._alerted[conversation_id] = known
        return known

    def notes(self, turn: TurnState) -> str | None:
        if not self.notes_on:
            return None
        current = notes_layer.notes(self.store, turn.conversation_id)
        budget = turn.profile.notes_tokens
        return notes_layer.render_notes(current, budget, turn.counter, turn.lang).text

    def chapter_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        if self.notes_on:
            lang = detect_lang([e.text for e in entries[:20]])
            notes_layer.update_notes(
                self.store, conversation_id, entries, self.notes_extractor, lang
            )

    def cut_written(self, conversation_id: str, entries: Sequence[LogEntry]) -> None:
        """A cut folded these messages without a chapter job: their facts go to the ledger now,
        by the model-free extractor (no model call inside a turn)."""
        if self.notes_on:
            lang = detect_lang([e.text for e in entries[:20]])
            notes_layer.update_notes(self.store, conversation_id, entries, None, lang)

    def conversation_deleted(self, conversation_id: str) -> None:
        if self.indexes is not None:
            self.indexes.forget(conversation_id)
        with self._tics_lock:
            self._tics.pop(conversation_id, None)
        self._alerted.pop(conversation_id, None)

    def search(self, conversation_id: str, query: str, k: int) -> list[Hit]:
        if self.indexes is None:
            raise ConfigError("archive recall is off in these layers: nothing to search")
        return self.indexes.sync(conversation_id).search(query, k=k)
