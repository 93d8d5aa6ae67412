"""Notes: the stable facts of a relationship (names, relations, habits, anniversaries, promises,
preferences) as plain text a person can edit, over an append-only ledger.

Seed 003's third layer. Summaries drift and fold; a birthday or a promise must not. Notes are
extracted from messages (by a model, or by a few regexes when none is configured) and shown in
the memory exchange. The operator reads them as lines `- [kind] subject: text` and edits that
text; `apply_edit` turns the diff into ledger entries. Nothing is ever updated or deleted: an
edit or a retraction is a new entry that `supersedes` an older one, so the history stays, and
once the operator has written about a subject and kind, later extracted entries about the same
subject and kind no longer show: the person wins over the extractor.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING

from kioku import prompts
from kioku.cast import as_recorded
from kioku.dates import date_line
from kioku.errors import BadNotes, InputError
from kioku.facts import Fact, facts_in
from kioku.inert import indented, inert, mark, one_line
from kioku.messages import LogEntry
from kioku.models import ChatMessage, ChatModel, ChatRequest
from kioku.note import NOTE_KINDS, Author, EditResult, Note, NoteDraft, norm
from kioku.relative_dates import resolve
from kioku.sensitive import looks_secret, opened_by_earlier, withheld
from kioku.tokens import TokenCounter

if TYPE_CHECKING:
    from kioku.grounding.records import Dropped
    from kioku.store import Store

NOTES_PROMPT_VERSION = "notes-2"  # the version line of prompts/<lang>/notes.txt
HEURISTIC_VERSION = "notes-heuristic-2"


def current_notes(ledger: Iterable[Note]) -> list[Note]:
    """The notes in force, oldest first: the ledger replayed in id order. An extractor entry
    about a subject and kind the operator has already written about is ignored, and so is one
    that would supersede an operator entry."""
    live: dict[int, Note] = {}
    by_id: dict[int, Note] = {}
    locked: set[tuple[str, str]] = set()
    for e in sorted(ledger, key=lambda n: n.id):
        by_id[e.id] = e
        if e.author == "extractor":
            target = by_id.get(e.supersedes) if e.supersedes is not None else None
            if e.key in locked or (target is not None and target.author == "operator"):
                continue
        else:
            locked.add(e.key)
        if e.supersedes is not None:
            live.pop(e.supersedes, None)
        if not e.retracted:
            live[e.id] = e
    return list(live.values())


# the ledger in the store ---------------------------------------------------------------------


def ledger(store: Store, conversation_id: str) -> list[Note]:
    """Every entry ever written for the conversation, superseded and retracted ones included,
    with who said it, its date, its slot and how often it was stated."""
    return store.note_ledger(conversation_id)


def notes(store: Store, conversation_id: str) -> list[Note]:
    return current_notes(ledger(store, conversation_id))


def _check(draft: NoteDraft) -> None:
    if draft.kind not in NOTE_KINDS:
        raise InputError(f"unknown note kind {draft.kind!r}; use one of {', '.join(NOTE_KINDS)}")
    if not norm(draft.subject) or ":" in draft.subject or "\n" in draft.text:
        raise InputError(f"a note needs a subject without ':' and one line of text: {draft}")


def _insert(
    store: Store,
    conversation_id: str,
    d: NoteDraft,
    author: Author,
    origin: str,
    retracted: bool = False,
) -> int:
    draft = NoteDraft(norm(d.subject), d.kind, norm(d.text), d.source_seq, d.supersedes)
    return store.add_note(conversation_id, draft, author=author, origin=origin, retracted=retracted)


def add_notes(
    store: Store,
    conversation_id: str,
    drafts: Sequence[NoteDraft],
    *,
    author: Author = "extractor",
    origin: str = "",
) -> list[int]:
    """Append drafts to the ledger in one transaction; return the new ids.

    A draft identical to a note in force (same subject, kind and text) adds nothing but a
    mention of it (facts that come up again rank higher). A draft with a slot that a note in
    force about the same subject and kind already fills, with other text, supersedes that note:
    the newest statement is the one in force, the older stays in the ledger, marked.

    Text is made inert (`kioku.inert`); an extracted fact that looks like a secret (a password,
    a key, a card number: `kioku.sensitive`) is not kept: it stays in the log only."""
    drafts = [
        replace(d, subject=one_line(d.subject), text=inert(d.text))
        for d in drafts
        if author != "extractor" or not looks_secret(f"{d.subject} {d.text}")
    ]
    for d in drafts:
        _check(d)
    with store.atomic():
        in_force = current_notes(store.note_ledger(conversation_id))
        have = {(n.key, norm(n.text).casefold()): n.id for n in in_force}
        slots = {(n.key, n.slot): n.id for n in in_force if n.slot}
        ids = []
        for d in drafts:
            key = (norm(d.subject).casefold(), d.kind)
            sig = (key, norm(d.text).casefold())
            if sig in have:
                store.add_note_mention(conversation_id, have[sig], d.source_seq)
                continue
            if d.slot and d.supersedes is None and (key, d.slot) in slots:
                d = replace(d, supersedes=slots[(key, d.slot)])
            nid = _insert(store, conversation_id, d, author, origin)
            have[sig] = nid
            if d.slot:
                slots[(key, d.slot)] = nid
            store.add_note_facts(
                conversation_id,
                nid,
                said_by=d.said_by,
                on_date=d.on_date,
                slot=d.slot,
                seq=d.source_seq,
            )
            ids.append(nid)
        return ids


# what the user takes back ---------------------------------------------------------------------

# a change of a stored message → how a retraction says why (the ledger entry's origin)
TAKEN_BACK = {"delete": "deleted", "edit": "edited", "regenerate": "regenerated"}


def retraction_reason(seq: int, change: str) -> str:
    return f"retracted: message #{seq} {TAKEN_BACK.get(change, change)}"


def retract_sources(store: Store, conversation_id: str, taken: Mapping[int, str]) -> list[int]:
    """Retract every extracted note in force that was taken from a message the user deleted
    or edited (`taken`: seq → the change, a key of `TAKEN_BACK`); return the new entries' ids.

    Each retraction is a ledger entry (the note stays in the history, marked) whose origin says
    why: "retracted: message #2 deleted". An edited message's facts are extracted again from
    its new text when its chapter is written again (`kioku.revisions`). A note the operator
    wrote has no source message and is never retracted here: the person wins.

    A retracted note that had replaced an older one in its slot ("moved to Kyoto" over "lives
    in Osaka") gives the older one back, when a message still in the log said it: the user took
    back the newer statement, not the older."""
    out: list[int] = []
    with store.atomic():
        entries = store.note_ledger(conversation_id)
        by_id = {e.id: e for e in entries}
        for n in current_notes(entries):
            if n.author != "extractor" or n.source_seq is None or n.source_seq not in taken:
                continue
            tomb = NoteDraft(n.subject, n.kind, "", n.source_seq, n.id)
            why = retraction_reason(n.source_seq, taken[n.source_seq])
            out.append(_insert(store, conversation_id, tomb, "extractor", why, retracted=True))
            older = _still_said(by_id, n.supersedes, taken)
            if older is not None:
                again = NoteDraft(older.subject, older.kind, older.text, older.source_seq)
                nid = _insert(store, conversation_id, again, "extractor", f"restored: {why}")
                store.add_note_facts(
                    conversation_id,
                    nid,
                    said_by=older.said_by,
                    on_date=older.on_date,
                    slot=older.slot,
                    seq=older.source_seq,
                )
    return out


def _still_said(
    by_id: Mapping[int, Note], ref: int | None, taken: Mapping[int, str]
) -> Note | None:
    """The newest note in a chain of replaced ones (from `ref` back) that a message still in
    the log said, or None (a retraction or an operator's entry ends the chain)."""
    seen: set[int] = set()
    while ref is not None and ref not in seen:
        seen.add(ref)
        e = by_id.get(ref)
        if e is None or e.retracted or e.author != "extractor":
            return None
        if e.source_seq is not None and e.source_seq not in taken and e.text:
            return e
        ref = e.supersedes
    return None


# plain text for people --------------------------------------------------------------------------

EDIT_HEADER = (
    "# Notes: one fact per line, as `- [kind] subject: text`.\n"
    f"# kinds: {', '.join(NOTE_KINDS)}. Delete a line to retract it; lines starting with # are ignored.\n"
)
_LINE = re.compile(
    r"^\s*[-*•]\s*\[\s*(?P<kind>[^\]]+?)\s*\]\s*(?P<subject>[^:：]+?)\s*[:：]\s*(?P<text>.+?)\s*$"
)


def _order(n: Note) -> tuple[int, str, int]:
    return (NOTE_KINDS.index(n.kind) if n.kind in NOTE_KINDS else 99, n.key[0], n.id)


def render_editable(notes_in_force: Sequence[Note]) -> str:
    """The whole notes layer as text for a person to edit and hand to `apply_edit`."""
    return EDIT_HEADER + "".join(n.line() + "\n" for n in sorted(notes_in_force, key=_order))


@dataclass(frozen=True)
class RenderedNotes:
    text: str
    tokens: int
    kept: int
    dropped: int  # notes left out for the budget


KIND_WEIGHT = {
    "name": 4.0,
    "relation": 3.5,
    "anniversary": 3.5,
    "promise": 3.0,
    "preference": 2.0,
    "habit": 2.0,
    "fact": 2.0,
}


def rank(notes_in_force: Sequence[Note]) -> list[Note]:
    """The notes in the order they earn their place when the budget is short, across the
    whole conversation: the operator's first, then by kind (names before habits), how often
    the fact was stated, and how much the conversation is about its subject (the person in
    every dialogue before a one-off partner); the oldest first among equals, since what is
    recent is still in the chapters and the raw window, and the notes are what outlives them."""
    about: Counter[str] = Counter()
    for n in notes_in_force:
        about[n.key[0]] += n.mentions

    def score(n: Note) -> float:
        return (
            KIND_WEIGHT.get(n.kind, 1.0)
            + 1.5 * math.log2(1 + n.mentions)
            + 0.5 * math.log2(1 + about[n.key[0]])
        )

    return sorted(notes_in_force, key=lambda n: (n.author != "operator", -score(n), n.id))


def render_notes(
    notes_in_force: Sequence[Note], budget_tokens: int, counter: TokenCounter, lang: str = "en"
) -> RenderedNotes:
    """The notes for the memory exchange within `budget_tokens`, each with its date and who
    said it (`Note.shown`). When they do not all fit, `rank` decides which stay."""
    chosen: list[Note] = []
    used = 0
    for n in rank(notes_in_force):
        cost = counter.count(n.shown(lang)) + 1
        if used + cost <= budget_tokens:
            chosen.append(n)
            used += cost
    chosen.sort(key=_order)
    while chosen:
        text = "\n".join(n.shown(lang) for n in chosen)
        tokens = counter.count(text)
        if tokens <= budget_tokens:
            return RenderedNotes(text, tokens, len(chosen), len(notes_in_force) - len(chosen))
        chosen.pop()
    return RenderedNotes("", 0, 0, len(notes_in_force))


def parse_lines(text: str) -> list[NoteDraft]:
    """Note lines → drafts. A line that is neither a note, blank nor a # comment is an error."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        m = _LINE.match(raw)
        if m is None:
            raise InputError(f"line {n} is not `- [kind] subject: text`: {raw.strip()!r}")
        d = NoteDraft(norm(m["subject"]), m["kind"].casefold(), norm(m["text"]))
        try:
            _check(d)
        except InputError as e:
            raise InputError(f"line {n}: {e}") from e
        out.append(d)
    return out


def apply_edit(
    store: Store, conversation_id: str, edited: str, base: str | None = None
) -> EditResult:
    """Write the operator's edit as ledger entries, in one transaction.

    The edit is diffed against `base` (the text the operator started from; by default the
    current rendering): a removed line retracts its note, an added line adds one, and a removed
    and an added line with the same subject and kind are a change (the new entry supersedes the
    old). Notes the extractor added meanwhile are untouched, because the diff is against `base`."""
    new = parse_lines(edited)
    with store.atomic():
        in_force = current_notes(store.note_ledger(conversation_id))
        old = (
            parse_lines(base)
            if base is not None
            else [NoteDraft(n.subject, n.kind, n.text) for n in in_force]
        )

        def sig(d: NoteDraft | Note) -> tuple[str, str, str]:
            return (d.kind, norm(d.subject).casefold(), norm(d.text).casefold())

        removed = list((Counter(map(sig, old)) - Counter(map(sig, new))).elements())
        first_of = {sig(d): d for d in reversed(new)}
        added_d = [
            first_of[g] for g in (Counter(map(sig, new)) - Counter(map(sig, old))).elements()
        ]
        notes_by_sig: dict[tuple[str, str, str], list[Note]] = {}
        for n in in_force:
            notes_by_sig.setdefault(sig(n), []).append(n)
        result: dict[str, list[int]] = {"added": [], "changed": [], "retracted": []}
        for d in added_d:
            pair = next((r for r in removed if r[:2] == sig(d)[:2]), None)
            target = notes_by_sig.get(pair, []) if pair else []
            if pair:
                removed.remove(pair)
            sup = target.pop(0).id if target else None
            nid = _insert(
                store,
                conversation_id,
                NoteDraft(d.subject, d.kind, d.text, None, sup),
                "operator",
                "edit",
            )
            result["changed" if sup is not None else "added"].append(nid)
        for r in removed:
            target = notes_by_sig.get(r, [])
            if not target:
                continue  # already gone since the operator's base was rendered
            victim = target.pop(0)
            tomb = NoteDraft(victim.subject, victim.kind, "", None, victim.id)
            result["retracted"].append(
                _insert(store, conversation_id, tomb, "operator", "edit", retracted=True)
            )
    return EditResult(tuple(result["added"]), tuple(result["changed"]), tuple(result["retracted"]))


# extraction ------------------------------------------------------------------------------------


def dated_lines(entries: Sequence[LogEntry], lang: str = "en") -> str:
    """Messages as `⟦seq⟧ author: text`, a date line where the day changes, and each relative
    date followed by the date it means, so the extractor can write dates that last. kioku's
    lines are in its mark and a message's further lines indented under its own, so no message
    can add a line by anyone (`kioku.inert`); a line that looks like a secret is withheld
    (`kioku.sensitive`)."""
    out: list[str] = []
    day: date | None = None
    opened = opened_by_earlier([(e.message.role, e.message.text) for e in entries])
    for e, value in zip(entries, opened, strict=True):
        if e.message.is_empty():
            continue  # deleted: nothing of it is read
        at = e.message.at
        if at is not None and at.date() != day:
            day = at.date()
            out.append(date_line(day, lang))
        text = indented(withheld(resolve(e.message.text, at, lang), opened=value), "    ")
        out.append(f"{mark(str(e.seq))} {one_line(e.message.author or e.message.role)}: {text}")
    return "\n".join(out)


class NotesExtractor:
    """Stable facts from a range of messages, by a chat model, parsed strictly: a reply that is
    not exactly JSON lines (or NONE) raises `BadNotes` and nothing is stored."""

    def __init__(self, model: ChatModel, lang: str = "en", max_tokens: int = 1024) -> None:
        self.model = model
        self.lang = lang if lang in prompts.NOTES_LANGS else "en"
        self.max_tokens = max_tokens
        self.version = f"{NOTES_PROMPT_VERSION}-{self.lang}"

    def request(self, entries: Sequence[LogEntry], current: Sequence[Note]) -> ChatRequest:
        prompt = prompts.template(prompts.NOTES_TASK, self.lang)
        cur = "\n".join(f"#{n.id} [{n.kind}] {n.subject}: {n.text}" for n in current) or "-"
        msgs = dated_lines(entries, self.lang)
        system = prompt.render("system")
        body = prompt.render("user", current=cur, messages=msgs, kinds="|".join(NOTE_KINDS))
        return ChatRequest(
            messages=(ChatMessage("system", system), ChatMessage("user", body)),
            max_tokens=self.max_tokens,
            temperature=0.0,
            purpose="notes",
        )

    def parse(
        self, text: str, entries: Sequence[LogEntry], current: Sequence[Note]
    ) -> list[NoteDraft]:
        body = text.strip()
        fence = re.fullmatch(r"```(?:json|jsonl)?\s*\n(.*?)\n?```", body, re.DOTALL)
        if fence:
            body = fence.group(1).strip()
        if body == "NONE":
            return []
        if not body:
            raise BadNotes("empty reply (expected JSON lines or NONE)", text)
        by_seq = {e.seq: e for e in entries}
        seqs = set(by_seq)
        ids = {n.id for n in current}
        out = []
        for n, line in enumerate(body.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadNotes(f"line {n} is not JSON ({e.msg})", text) from e
            if not isinstance(d, dict):
                raise BadNotes(f"line {n} is not a JSON object", text)
            subject, kind, fact, seq = d.get("subject"), d.get("kind"), d.get("text"), d.get("seq")
            sup = d.get("supersedes")
            if not (
                isinstance(subject, str)
                and subject.strip()
                and isinstance(fact, str)
                and fact.strip()
            ):
                raise BadNotes(f"line {n}: subject and text must be non-empty strings", text)
            if kind not in NOTE_KINDS:
                raise BadNotes(
                    f"line {n}: kind {kind!r} is not one of {', '.join(NOTE_KINDS)}", text
                )
            if not isinstance(seq, int) or seq not in seqs:
                raise BadNotes(f"line {n}: seq {seq!r} is not one of the messages given", text)
            if sup is not None and (not isinstance(sup, int) or sup not in ids):
                raise BadNotes(f"line {n}: supersedes {sup!r} is not a note in force", text)
            m = by_seq[seq].message
            draft = NoteDraft(
                norm(subject).replace(":", " "),
                kind,
                norm(fact),
                seq,
                sup,
                said_by=m.author or m.role,
                on_date=m.at.date().isoformat() if m.at else None,
            )
            out.append(draft)
        return out

    def extract(self, entries: Sequence[LogEntry], current: Sequence[Note] = ()) -> list[NoteDraft]:
        return self.extract_grounded(entries, current)[0]

    def extract_grounded(
        self, entries: Sequence[LogEntry], current: Sequence[Note] = ()
    ) -> tuple[list[NoteDraft], list[Dropped]]:
        """The model's notes that the messages they cite bear out, and the ones dropped (each
        with its reason: `kioku.grounding`), so a note a model invented never enters
        the ledger."""
        if not entries:
            return [], []
        request = self.request(entries, current)
        completion = self.model.complete(request)
        if completion.truncated:
            raise BadNotes("cut at max_tokens (finish_reason == 'length')", completion.text)
        drafts = self.parse(completion.text, entries, current)
        # the words of the instructions: the same request with no messages in it
        prompt = "\n".join(m.content for m in self.request((), current).messages)
        from kioku.grounding.records import ground_notes

        return ground_notes(drafts, entries, current, self.lang, prompt)


# the no-model extractor ----------------------------------------------------------------------


def draft_of(f: Fact) -> NoteDraft:
    return NoteDraft(
        f.subject.replace(":", " "),
        f.kind,
        f.text,
        f.seq,
        said_by=f.said_by,
        on_date=f.on.isoformat() if f.on else None,
        slot=f.slot,
    )


def extract_notes_heuristic(entries: Iterable[LogEntry], lang: str = "en") -> list[NoteDraft]:
    """Facts the model-free extractor can see (`kioku.facts`): names, relations, dates,
    promises, preferences, habits, where someone lives or works, dated events."""
    return [draft_of(f) for f in facts_in(entries, lang)]


def update_notes(
    store: Store,
    conversation_id: str,
    entries: Sequence[LogEntry],
    extractor: NotesExtractor | None = None,
    lang: str = "en",
) -> list[int]:
    """Extract facts from `entries` and append them; return the new ledger ids. With no model,
    the heuristic extractor runs; so it does when the model's reply is not notes (prose, broken
    JSON: `BadNotes`), logged and counted, so the notes miss nothing the extractor can see."""
    entries = as_recorded(entries)  # a user message is the user's, whatever its name
    drafts: list[NoteDraft] = []
    origin = HEURISTIC_VERSION
    if extractor is not None:
        try:
            drafts, dropped = extractor.extract_grounded(entries, notes(store, conversation_id))
            origin = extractor.version
        except BadNotes as e:
            store.log(conversation_id, "notes", "fallback", detail=str(e)[:300])
            store.incr(conversation_id, "notes_fallbacks")
            extractor = None
        else:
            for d in dropped:  # a guard event each, never silent
                store.log(
                    conversation_id,
                    f"note_dropped_{d.reason}",
                    "dropped",
                    first_seq=d.seqs[0] if d.seqs else None,
                    detail=d.note(),
                )
    if extractor is None:
        drafts = extract_notes_heuristic(entries, lang)
    return add_notes(store, conversation_id, drafts, origin=origin)
