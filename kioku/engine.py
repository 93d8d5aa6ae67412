"""The library's front door: `Kioku` (a store plus models and numbers) and `Conversation`.

    kk = Kioku(Store.open("chat.db"), reply_model=my_model)
    conv = kk.conversation("mika-and-me", system_prompt=CARD)
    reply = conv.chat("Do you remember what I promised you in spring?")

`prepare()` stores the user message first, then folds whatever summary became ready, schedules
new jobs, and builds the prompt; `record()` stores the reply. `chat()` does both around the reply
model. Summaries run on a worker (a background thread in the embedded mode), never in the turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from kioku import context, dates, policy, rolling
from kioku import notes as notes_layer
from kioku.alternation import alternate_chat
from kioku.budget import Margin, is_exact, template_of
from kioku.chat_messages import media_of, message_tokens, refs_of, reply_message
from kioku.client_parts import NO_PARTS, ClientParts
from kioku.compaction import SQUEEZE_SLACK, Compactor, TurnReport
from kioku.context import EXTRAS_KEY, RECALL_KEY, Prompt
from kioku.errors import (
    ConfigError,
    ContextOverflow,
    InputError,
    ModelError,
    TruncatedReply,
)
from kioku.fit import fitted, message_limit
from kioku.hooks import MemoryLayers
from kioku.lang import detect_lang
from kioku.memory import Memory, MemoryItem
from kioku.messages import LogEntry, Message, Role
from kioku.models import ChatModel, Completion
from kioku.no_layers import NO_LAYERS
from kioku.note import EditResult
from kioku.profiles import LOCAL_64K, Profile
from kioku.recall.need import Recall
from kioku.revisions import Change, Revised, revise, stand_ins
from kioku.store import ConversationInfo, Store
from kioku.summarizer import ExtractiveSummarizer, Summarizer
from kioku.takeback import take_back
from kioku.tokens import ScriptEstimator, TokenCounter
from kioku.turn_state import TurnState
from kioku.worker import BackgroundWorker, Worker

# usage.prompt_tokens ÷ kioku's own count outside this band is not believed: tokenizers differ
# by 1.6× at most on the same text (two common vocabularies on Japanese), never by 2×
CALIBRATION_BAND = (0.5, 2.0)


@dataclass(frozen=True)
class Reply:
    text: str
    finish_reason: str
    entry: LogEntry
    prompt: Prompt

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


# generational: chapters and major GCs (kioku) · rolling: one summary rewritten at each fold
# (the baseline of seeds 002/004, kept for comparison)
Strategy = Literal["generational", "rolling"]
POLICIES: dict[str, policy.Policy] = {"generational": policy.decide, "rolling": rolling.decide}


def as_message(
    value: str | Message, role: Role, author: str = "", at: datetime | None = None
) -> Message:
    """A Message as given, or text as a message dated `at` (when kioku received it)."""
    if isinstance(value, Message):
        return value
    if not isinstance(value, str):
        raise InputError(f"expected text or a Message, got {type(value).__name__}")
    return Message.of(role, value, author=author, at=at)


class Kioku:
    def __init__(
        self,
        store: Store | str = "sqlite:///kioku.db",
        *,
        profile: Profile = LOCAL_64K,
        counter: TokenCounter | None = None,
        reply_model: ChatModel | None = None,
        summarizer: Summarizer | None = None,
        clock: Callable[[], float] = time.time,
        tenant: str = "default",
        background: bool = False,
        simulated_duration_s: float = 0.0,
        strategy: Strategy = "generational",
        fold_immediately: bool = False,
        memory_in_system: bool = False,
        layers: MemoryLayers = NO_LAYERS,
    ) -> None:
        """`layers` are the memory layers beside the log (`kioku.layers.Layers`: archive recall,
        notes, the verbal-tic guard); by default the engine runs alone.

        `strategy`, `fold_immediately` and `memory_in_system` exist for the baselines kioku
        is measured against (rolling rewrite, folding in the trigger turn, memory in the system
        prompt); the defaults are kioku's design."""
        if strategy not in POLICIES:
            raise ConfigError(f"unknown strategy {strategy!r}; use generational or rolling")
        self.store = store if isinstance(store, Store) else Store.open(store)
        if fold_immediately:
            profile = replace(profile, summary_delay_s=0.0)
            simulated_duration_s = 0.0
        self.strategy = strategy
        self.policy: policy.Policy = POLICIES[strategy]
        self.fold_immediately = fold_immediately
        self.memory_in_system = memory_in_system
        self.profile = profile
        self.counter = counter or ScriptEstimator()
        self.reply_model = reply_model
        self.summarizer = summarizer or ExtractiveSummarizer(self.counter)
        self.extractive = ExtractiveSummarizer(self.counter)
        self.clock = clock
        self.tenant = tenant
        self.layers = layers
        # how far the prompts' accounts fall short of what the server reads (its usage)
        self.margin = Margin(exact=is_exact(self.counter))
        self._cards: dict[tuple[int, int], Profile] = {}
        self._worker = Worker(
            self.store,
            self.summarizer,
            self.profile_for,
            clock=clock,
            simulated_duration_s=simulated_duration_s,
            layers=layers,
        )
        self._background: BackgroundWorker | None = None
        if background:
            self.start_background()

    @property
    def worker(self) -> Worker:
        return self._worker

    def reprofile(self, profile: Profile) -> None:
        """Run on `profile` from the next turn on (the service learned that the upstream's
        window is smaller than the one it assumed); memory already made stays as it is."""
        self.profile = profile
        self._cards.clear()

    def card_profile(self, system_prompt: str) -> Profile:
        """The profile fitted to a card (`Profile.for_card`): a large card costs memory, not
        failed turns. Raises `CardTooLarge` for a card that cannot fit beside the minimum raw
        window."""
        key = (len(system_prompt), hash(system_prompt))
        p = self._cards.get(key)
        if p is None:
            tokens = self.counter.count(system_prompt) if system_prompt else 0
            p = self.profile.for_card(tokens + round(template_of(self.counter).per_message))
            if len(self._cards) > 256:
                self._cards.clear()
            self._cards[key] = p
        return p

    def profile_for(self, conversation_id: str) -> Profile:
        """The profile a conversation runs on (its card fitted in)."""
        return self.card_profile(self.store.conversation(conversation_id).system_prompt)

    def poke_worker(self) -> None:
        """A job was scheduled: the background worker (if any) looks now, not at its next poll."""
        if self._background is not None:
            self._background.poke()

    def start_background(self, poll_s: float = 1.0) -> BackgroundWorker:
        if self._background is None:
            self._background = BackgroundWorker(self._worker, poll_s).start()
        return self._background

    def close(self) -> None:
        if self._background is not None:
            self._background.stop()
            self._background = None

    def conversation(
        self,
        conversation_id: str,
        *,
        system_prompt: str | None = None,
        character: str = "",
        key: str | None = None,
    ) -> Conversation:
        """The conversation named `conversation_id`, created if new (with `key`: under that
        store key, `Store.ensure_conversation`)."""
        if not conversation_id or len(conversation_id) > 200:
            raise InputError("a conversation id is 1 to 200 characters")
        if system_prompt:
            self.card_profile(system_prompt)  # a card that can never be served: refuse it now
        info = self.store.ensure_conversation(
            conversation_id,
            tenant=self.tenant,
            system_prompt=system_prompt,
            character=character,
            profile=self.profile.name,
            key=key,
        )
        return Conversation(self, info.id)

    def conversations(self) -> list[ConversationInfo]:
        return self.store.conversations(self.tenant)


class Conversation:
    def __init__(self, kioku: Kioku, conversation_id: str) -> None:
        self.kioku = kioku
        self.id = conversation_id
        self.last_turn = TurnReport()  # what the last `prepare` did (for logs, demos, tests)
        self._last_prompt: Prompt | None = None
        self._raw: list[LogEntry] = []  # cache of the raw window; the log is append-only
        self._revision = 0  # the log's revision `_raw` was read at (an edit bumps it)
        self._lang: str | None = None
        self._character: str | None = None
        self._compactor = Compactor(kioku, conversation_id)

    # reading ---------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self.kioku.store

    def info(self) -> ConversationInfo:
        return self.store.conversation(self.id, tenant=self.kioku.tenant)

    @property
    def profile(self) -> Profile:
        """The numbers this conversation runs on: the engine's profile fitted to its card."""
        return self.kioku.card_profile(self.info().system_prompt)

    @property
    def lang(self) -> str:
        if self._lang is None:
            info = self.info()
            sample = [e.text for e in self.store.entries(self.id, 0, 30)]
            self._lang = detect_lang([info.system_prompt, *sample]) if sample else "en"
        return self._lang

    @property
    def character(self) -> str:
        """Who replies; fixed when the conversation is created, so read once, not every turn."""
        if self._character is None:
            self._character = self.info().character
        return self._character

    def memory(
        self, info: ConversationInfo | None = None, active: list[MemoryItem] | None = None
    ) -> Memory:
        """`active`: the active items, when the caller has read them."""
        if active is None:
            active = self.store.items(self.id, "active")
        if any(i.stale for i in active):
            # an edited message under memory: show the corrected messages until the re-summary
            k = self.kioku
            profile = k.card_profile((info or self.info()).system_prompt)
            active = stand_ins(self.store, self.id, active, profile, k.counter, self.lang)
        synopsis = next((i for i in active if i.kind == "synopsis"), None)
        chapters = tuple(i for i in active if i.kind == "chapter")
        return Memory(
            synopsis=synopsis, chapters=chapters, notes=self.store.notes_snapshot(self.id)
        )

    def refresh_notes(self) -> None:
        """Render the notes into the memory exchange now (after an operator edit; a fold does it
        in its transaction)."""
        self._compactor.refresh_notes(self.view())

    def edit_notes(self, edited: str, base: str | None = None) -> EditResult:
        """Write an operator's edit of the notes text to the ledger (diffed against `base`, the
        text the operator started from: by default the notes as they are now), and show it."""
        if base is None:
            base = notes_layer.render_editable(notes_layer.notes(self.store, self.id))
        result = notes_layer.apply_edit(self.store, self.id, edited, base=base)
        self.refresh_notes()  # an operator's edit is worth one cache break
        return result

    def message_limit(self) -> int:
        """The most tokens one message of this conversation may have (`kioku.fit`)."""
        k = self.kioku
        system = self.info().system_prompt
        return message_limit(system, k.card_profile(system), k.counter, k.margin.share)

    def raw_window(self, info: ConversationInfo | None = None) -> list[LogEntry]:
        info = info or self.info()
        if info.revision != self._revision:  # edited or deleted, by this process or another
            self._raw, self._revision = [], info.revision
        self._raw = [e for e in self._raw if e.seq >= info.raw_start]
        after = self._raw[-1].seq + 1 if self._raw else info.raw_start
        if after < info.next_seq:
            self._raw.extend(self.store.entries(self.id, after))
        return list(self._raw)

    # writing ---------------------------------------------------------------------------------

    def append(self, message: Message, meta: dict | None = None, tokens: int = 0) -> LogEntry:
        if message.is_empty():
            raise InputError("empty message: nothing to store (send some text)")
        k = self.kioku
        tokens = tokens or message_tokens(message, k.counter, k.profile.image_tokens)
        return self.store.append(self.id, message, tokens, meta)

    def revise(self, changes: Sequence[Change]) -> Revised:
        """Edit, delete or regenerate stored messages (versions kept, memory over them marked
        stale and re-summarized; `kioku.revisions`). The raw window cached here is read again."""
        k = self.kioku
        with self.store.atomic():
            done = revise(
                self.store,
                self.id,
                changes,
                k.counter,
                delay_s=k.profile.summary_delay_s,
                now=k.clock(),
                image_tokens=k.profile.image_tokens,
            )
            # what the user took back leaves every prompt in the same transaction
            back = take_back(self.store, self.id, changes, self.info().raw_start)
            if back.retracted:
                self.refresh_notes()
        self._raw = []
        return replace(done, retracted=back.retracted)

    def prepare(self, user_message: str | Message) -> Prompt:
        """Store the user message, apply what is ready, and build the prompt for the reply (a
        message that could never fit the window is refused before it is stored: `kioku.fit`)."""
        message = as_message(user_message, "user", "user", dates.received(self.kioku.clock()))
        k = self.kioku
        tokens = fitted(message, self.message_limit(), k.counter, k.profile.image_tokens)
        return self.prepare_for(self.append(message, tokens=tokens))

    def prepare_for(self, entry: LogEntry, client: ClientParts = NO_PARTS) -> Prompt:
        """Apply what is ready and build the prompt answering a stored message (`prepare` after
        its append; the service also calls it to retry or regenerate a turn). `client`: what
        the client adds around the chat itself (`kioku.client_parts`), placed as it put it and
        budgeted: memory folds to make room for it as for any part of the prompt."""
        view = self.view()
        # recall decides first: the room its best recollection needs is made now (a ready
        # chapter folds: worth a cache break), never held free on the turns that want none;
        # the rest take what room there is
        recall = self._recall(entry, view)
        wants = 0
        if recall and recall.least and recall.need.makes_room:
            wants = recall.least + context.LABEL_TOKENS
        room = client.tokens(self.kioku.counter, template_of(self.kioku.counter).per_message)
        report, view = self._compact_turn(view, room, wants)
        if report.folded:
            recall = None  # the raw window moved: what is in view changed
        prompt, report = self._build(entry, view, client, recall, report, room)
        self.last_turn = report
        self._keep_extras(entry, prompt)
        self._last_prompt = prompt
        return prompt

    def _compact_turn(self, view: TurnState, room: int, wants: int) -> tuple[TurnReport, TurnState]:
        """The turn's compaction: room made for the client's parts and for recall. The
        `fold_immediately` baseline then blocks on the summaries it scheduled and folds them in
        this same turn, and its report adds up both."""
        report, view = self._compact(view, squeeze=room, recall=wants)
        if not (self.kioku.fold_immediately and report.scheduled):
            return report, view
        self.kioku.worker.run_until_idle(self.id)
        again, view = self._compact(view, recall=wants)
        return TurnReport(
            folded=again.folded,
            forced_cut=report.forced_cut or again.forced_cut,
            major_gc=again.major_gc,
            scheduled=report.scheduled + again.scheduled,
            reasons=report.reasons + again.reasons,
            for_recall=again.for_recall,
        ), view

    def _build(
        self,
        entry: LogEntry,
        view: TurnState,
        client: ClientParts,
        recall: Recall | None,
        report: TurnReport,
        room: int,
    ) -> tuple[Prompt, TurnReport]:
        """The prompt from the compacted state; on overflow, squeezed once and built again."""
        try:
            return self._prompt(entry, view, client, recall), report
        except ContextOverflow as e:
            # The counts moved under the policy (a calibrating estimate, a longer card): cut as
            # at the ceiling, by what is missing, rather than fail a normal turn.
            squeeze = e.excess + SQUEEZE_SLACK + room
            again, view = self._compact(view, squeeze=squeeze)
            report = replace(again, reasons=(*report.reasons, *again.reasons))
            return self._prompt(entry, view, client), report

    def _recall(self, entry: LogEntry, turn: TurnState) -> Recall | None:
        """The recall layer's answer for a user message not answered before (None: no turn of
        recall, e.g. a tool result, or a retry that shows what it showed the first time)."""
        if entry.role != "user" or context.extras_of(entry) is not None:
            return None
        return self.kioku.layers.recall(turn, entry)

    def prompt_for(
        self,
        entry: LogEntry,
        *,
        info: ConversationInfo,
        window: Sequence[LogEntry],
        memory: Memory,
        client: ClientParts = NO_PARTS,
        recall: Recall | None = None,
    ) -> Prompt:
        """The prompt answering `entry` from a given memory state: no message is stored, nothing
        is folded. An evaluation asks its questions with it against the state a conversation
        ended in. `recall`: the recall layer's answer for this state, when the caller has it
        (else it is asked here)."""
        k = self.kioku
        profile = k.card_profile(info.system_prompt)
        turn = TurnState(info, list(window), memory, [], profile, k.counter, self.lang)
        return self._prompt(entry, turn, client, recall)

    def _prompt(
        self,
        entry: LogEntry,
        turn: TurnState,
        client: ClientParts = NO_PARTS,
        recall: Recall | None = None,
    ) -> Prompt:
        """The prompt answering `entry` from the state `turn` (`prepare_for` after compacting,
        `prompt_for` for an evaluation's question)."""
        info, k = turn.info, self.kioku
        plan = context.plan(
            system_prompt=info.system_prompt,
            memory=turn.memory,
            raw=turn.before(entry),
            new=entry,
            profile=turn.profile,
            counter=k.counter,
            lang=turn.lang,
            memory_version=info.memory_version,
            memory_in_system=k.memory_in_system,
            margin=k.margin.share,
            client=client,
        )
        # recollections and instructions go with the user's message only: never into a tool's
        # result (the model reads it as returned) nor a reply it is asked to continue
        if plan.kept is not None or entry.role != "user":  # answered before: shown as it was
            return context.finish(plan, k.counter)
        if recall is None:
            recall = k.layers.recall(turn, entry)
        return context.finish(
            plan, k.counter, recall.recollections, k.layers.instructions(turn), need=recall.need
        )

    def _keep_extras(self, entry: LogEntry, prompt: Prompt) -> None:
        """Keep what this turn was shown with its message, so later turns show it unchanged,
        and the turn's account of recall (on or off, why, what it got: the console shows it)."""
        meta = dict(entry.meta or {})
        if prompt.extras is not None:
            meta[EXTRAS_KEY] = prompt.extras.to_json()
        if prompt.recall is not None:
            meta[RECALL_KEY] = dict(prompt.recall)
        if meta == (entry.meta or {}):
            return
        self.store.set_meta(self.id, entry.seq, meta)
        kept = LogEntry(entry.seq, entry.message, entry.tokens, meta)
        self._raw = [kept if e.seq == entry.seq else e for e in self._raw]

    def record(
        self, reply: str | Message | Completion, author: str = "", meta: dict | None = None
    ) -> LogEntry:
        """Store the model's reply (`meta`: the request it answers, say). A cut reply is stored,
        marked and counted; `chat()` raises on it so it is never passed off as complete."""
        now = dates.received(self.kioku.clock())  # a reply given as text is dated on receipt
        if isinstance(reply, Completion):
            if reply.truncated:
                meta = {**(meta or {}), "finish_reason": "length"}
                self.store.incr(self.id, "truncated_replies")
                self.store.log(
                    self.id,
                    "truncated_reply",
                    "length",
                    output_tokens=reply.usage.completion_tokens,
                )
            self._calibrate(reply)
            message = replace(reply_message(reply, author=author or self.character), at=now)
        else:
            message = as_message(reply, "assistant", author or self.character, now)
        return self.append(message, meta)

    def chat(self, user_message: str | Message, *, strict: bool = True) -> Reply:
        model = self.kioku.reply_model
        if model is None:
            raise ConfigError(
                "no reply model configured: pass reply_model= to Kioku (or use prepare/record)"
            )
        prompt = self.prepare(user_message)
        request = prompt.request()
        if refs := refs_of(prompt.messages):  # images in the raw window go as they were sent
            request = replace(request, media=media_of(self.store.blobs(refs)))
        completion = model.complete(replace(request, messages=alternate_chat(request.messages)))
        if not completion.text.strip():
            # nothing to store; the user's message already is
            self.store.log(self.id, "reply", "empty", detail=completion.finish_reason)
            self.store.incr(self.id, "empty_replies")
            raise ModelError(
                f"the model returned an empty reply (finish_reason={completion.finish_reason!r}); "
                "your message is stored: send it again or check the model"
            )
        entry = self.record(completion)
        self.store.incr(self.id, "turns")
        if completion.truncated and strict:
            raise TruncatedReply(completion)
        return Reply(completion.text, completion.finish_reason, entry, prompt)

    def _calibrate(self, completion: Completion) -> None:
        """Learn the server's token counts from its `usage`, within reason: a figure far from
        what kioku counted (a proxy in between that reports something else, a buggy server) is
        ignored and logged, so one bad report cannot make every later message count as 1."""
        prompt, observed = self._last_prompt, completion.usage.prompt_tokens
        if prompt is None or not observed:
            return
        expected = max(1, prompt.tokens)
        if not CALIBRATION_BAND[0] <= observed / expected <= CALIBRATION_BAND[1]:
            self.store.log(
                self.id,
                "calibration",
                "ignored",
                detail=f"usage.prompt_tokens {observed} for a prompt counted as {expected}",
            )
            self.store.incr(self.id, "calibration_ignored")
            return
        self.kioku.margin.observe(prompt.tokens, observed)
        calibrate = getattr(self.kioku.counter, "calibrate", None)
        if calibrate is not None:
            # per message, so the template's per-message tokens are not read as text
            calibrate([m.content for m in prompt.messages], observed)

    # compaction --------------------------------------------------------------------------------

    def view(self) -> TurnState:
        """The state a turn is decided and built from, read in this one place."""
        info = self.info()
        items = self.store.items(self.id, "active", "ready")  # one read for both
        active = [i for i in items if i.status == "active"]
        ready = [i for i in items if i.status == "ready"]
        window, memory = self.raw_window(info), self.memory(info, active)
        k = self.kioku
        # an empty conversation has no language yet: reading it now would fix it at "en"
        lang = self.lang if info.next_seq or self._lang is not None else "en"
        return TurnState(
            info, window, memory, ready, k.card_profile(info.system_prompt), k.counter, lang
        )

    def settle(self, recall: int = 0) -> TurnReport:
        """Apply whatever became ready (folds, major GCs) without a new message: what the next
        turn would do first (`recall`: tokens that turn's recollections want). Evaluations call
        it to read the memory a conversation ends with."""
        return self._compact(self.view(), recall=recall)[0]

    def _compact(
        self, turn: TurnState, squeeze: int = 0, recall: int = 0
    ) -> tuple[TurnReport, TurnState]:
        return self._compactor.compact(turn, self.view, squeeze, recall)

    def forget_raw_window(self) -> None:
        """Read the raw window from the store again (a fold or an edit moved it)."""
        self._raw = []

    def cut(self) -> TurnReport:
        """区切り: fold everything not yet summarized now and start the raw window afresh
        (`Compactor.cut`)."""
        report = self._compactor.cut(self.view())
        self.forget_raw_window()
        return report
