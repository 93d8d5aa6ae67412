"""A chronicle record as the prompt shows it, per track, in the conversation's language.

`story` is what happened in the fiction, with every claim attributed (who told whom, backed by
narration or thought, or unconfirmed; "ostensibly … / actually …" side by side); `user` is what
the user said about their real self, as facts; threads show open or resolved by data, never by
hoping the prose says so; key lines keep their speaker and seq.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kioku.prompts import resolve_lang
from kioku.scenes import Scene, marked
from kioku.structure import Claim, KeyLine, Record, Thread, ThreadNote, UserFact, norm_text


@dataclass(frozen=True)
class RenderLabels:
    story: str
    user: str
    threads: str
    key_lines: str
    said_to: str  # {speaker} {listener} {claim}
    said: str  # {speaker} {claim}
    unconfirmed: str
    by_narration: str
    by_thought: str
    ostensibly: str  # {said} {actual}
    open: str
    resolved: str


RENDER: Mapping[str, RenderLabels] = {
    "en": RenderLabels(
        story="Story",
        user="About the user (facts)",
        threads="Threads",
        key_lines="Key lines (verbatim)",
        said_to="{speaker} told {listener}: {claim}",
        said="{speaker} said: {claim}",
        unconfirmed=" (claim, unconfirmed)",
        by_narration=" (borne out by narration)",
        by_thought=" (borne out by their inner thought)",
        ostensibly="Ostensibly: {said}. Actually: {actual}",
        open="open",
        resolved="resolved",
    ),
    "ja": RenderLabels(
        story="物語",
        user="ユーザーについて(事実)",
        threads="スレッド",
        key_lines="残す台詞(原文のまま)",
        said_to="{speaker}は{listener}に「{claim}」と言った",
        said="{speaker}は「{claim}」と言った",
        unconfirmed="(本人の主張、未確認)",
        by_narration="(地の文で裏付けあり)",
        by_thought="(本音で裏付けあり)",
        ostensibly="表向き: {said} / 実際は: {actual}",
        open="未解決",
        resolved="解決",
    ),
    "zh": RenderLabels(
        story="故事",
        user="关于用户(事实)",
        threads="线索",
        key_lines="保留的原话",
        said_to="{speaker}对{listener}说:“{claim}”",
        said="{speaker}说:“{claim}”",
        unconfirmed="(仅为其说法,未经证实)",
        by_narration="(有旁白证实)",
        by_thought="(有内心证实)",
        ostensibly="表面上:{said} / 实际上:{actual}",
        open="未解决",
        resolved="已解决",
    ),
}


def render_labels(lang: str) -> RenderLabels:
    return RENDER[resolve_lang(lang)]


def _at(seq: int | None) -> str:
    return f"#{seq} " if seq is not None else ""


def render_claim(c: Claim, lab: RenderLabels) -> str:
    said = (
        lab.said_to.format(speaker=c.speaker, listener=c.listener, claim=c.claim)
        if c.listener
        else lab.said.format(speaker=c.speaker, claim=c.claim)
    )
    if c.actual:
        return lab.ostensibly.format(said=said, actual=c.actual)
    tail = {"narration": lab.by_narration, "thought": lab.by_thought}.get(
        c.supported_by, lab.unconfirmed
    )
    return said + tail


def quote(seq: int | None, speaker: str, text: str) -> str:
    """A key line as memory shows it: who said it and where, then their words as they were.
    Quotation marks would say nothing more and cost a token or two a line: the extractive
    chapter's "[76] Mika: …" held more lines in the same room."""
    return f"- {_at(seq)}{speaker}: {text}"


def quoted(key_lines: Iterable[KeyLine]) -> list[tuple[int | None, str]]:
    """Key lines in order, a message's further lines indented under its first, without its seq
    again: a model's chapters of an English chat spent ~20 tokens more than the extractive
    chapter on the same lines, and memory folded a chapter sooner for it."""
    out: list[tuple[int | None, str]] = []
    prev: int | None = None
    for k in key_lines:
        if k.seq is not None and k.seq == prev:
            out.append((k.seq, " " * (len(str(k.seq)) + 4) + f"{k.speaker}: {k.text}"))
        else:
            out.append((k.seq, quote(k.seq, k.speaker, k.text)))
        prev = k.seq
    return out


def render_story(record: Record, lang: str, scenes: Mapping[int, Scene] | None = None) -> str:
    """The story track: events and claims in story order, then the key lines; with `scenes`
    (by first seq), each list marks where a scene starts, with its date and who talks."""
    lab = render_labels(lang)
    known = scenes or {}
    rows: list[tuple[int, int, str]] = []
    for n, e in enumerate(record.events):
        said = f"{e.by}: {e.text}" if e.by else e.text
        rows.append((e.seq if e.seq is not None else -1, n, f"- {_at(e.seq)}{said}"))
    for n, c in enumerate(record.claims, len(rows)):
        rows.append(
            (c.seq if c.seq is not None else -1, n, f"- {_at(c.seq)}{render_claim(c, lab)}")
        )
    # events without a seq keep their place relative to each other, before numbered ones
    lines = marked(
        ((seq if seq >= 0 else None, text) for seq, _, text in sorted(rows)), known, lang
    )
    if record.key_lines:
        if rows:  # the model's own lines above: which lines are its words and which theirs
            lines.append(f"{lab.key_lines}:")
        lines.extend(marked(quoted(record.key_lines), known, lang))
    return "\n".join(lines)


def render_user(
    facts: Iterable[UserFact], scenes: Mapping[int, Scene] | None = None, lang: str = "en"
) -> str:
    """The facts about the user, once each; with `scenes`, in story order under the markers of
    the scenes they were said in."""
    seen: set[str] = set()
    rows: list[tuple[int | None, str]] = []
    for f in facts:
        key = norm_text(f.fact).lower()
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            (f.seq, f"- {_at(f.seq)}{f.by}: {f.fact}" if f.by else f"- {_at(f.seq)}{f.fact}")
        )
    if scenes:
        rows.sort(key=lambda r: -1 if r[0] is None else r[0])
        return "\n".join(marked(rows, scenes, lang))
    return "\n".join(text for _, text in rows)


def render_threads(threads: Iterable[Thread | ThreadNote], lang: str) -> str:
    lab = render_labels(lang)
    out = []
    for t in threads:
        status = lab.open if t.status == "open" else lab.resolved
        seq = t.changed_seq if isinstance(t, Thread) else t.seq
        out.append(f"- [{status}] {t.id}: {t.title}" + (f" (#{seq})" if seq is not None else ""))
    return "\n".join(out)


def render_record(record: Record, lang: str, scenes: Mapping[int, Scene] | None = None) -> str:
    """`Summary.text`: the record as the prompt will show it, one section per track."""
    lab = render_labels(lang)
    blocks = [f"### {lab.story}\n{render_story(record, lang, scenes)}"]
    if record.threads:
        blocks.append(f"### {lab.threads}\n{render_threads(record.threads, lang)}")
    if record.user_facts:
        blocks.append(f"### {lab.user}\n{render_user(record.user_facts, scenes, lang)}")
    return "\n\n".join(blocks)
