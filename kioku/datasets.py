"""Reading long conversations from files: LoCoMo, RealPersonaChat, SillyTavern and kioku's own JSONL.

Benchmarks, `kioku import` and the evals all replay a conversation through the engine; they read it
through here so each format is parsed in one place. Shared evaluation data is found in `../shared`
beside the repository, or wherever `KIOKU_SHARED` points; it is never copied into the repo.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kioku.errors import InputError
from kioku.messages import Message, Part, Role

Format = Literal["locomo", "realpersonachat", "kioku", "sillytavern"]
FORMATS: tuple[str, ...] = ("locomo", "realpersonachat", "kioku", "sillytavern")


@dataclass(frozen=True)
class Transcript:
    messages: tuple[Message, ...]
    meta: tuple[Mapping[str, Any], ...]  # per message: dia_id, session, dialogue_id, ...
    user: str = "user"
    character: str = "assistant"
    system_prompt: str = ""
    lang: str = "en"
    info: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.messages)


def shared_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("KIOKU_SHARED"):
        return Path(env["KIOKU_SHARED"])
    return Path(__file__).resolve().parent.parent.parent / "shared"


def default_path(fmt: str, env: Mapping[str, str] | None = None) -> Path:
    base = shared_dir(env) / "datasets"
    if fmt == "locomo":
        return base / "locomo" / "locomo10.json"
    if fmt == "realpersonachat":
        return base / "realpersonachat" / "dialogues_top3.jsonl"
    raise InputError(f"format {fmt!r} has no default data path; pass --data")


def _parse_locomo_date(s: str) -> datetime | None:
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(s.strip(), fmt)
        except ValueError:
            continue
    return None


# SillyTavern has written `send_date` as epoch milliseconds, as ISO 8601, and as
# "January 15, 2024 10:20am"
_SEND_DATE_FORMATS = ("%B %d, %Y %I:%M%p", "%B %d, %Y %I:%M %p", "%b %d, %Y %I:%M%p")


def parse_send_date(value: object) -> datetime | None:
    """A client's `send_date`, whichever of SillyTavern's forms it has; None when unreadable
    (a message without a date is still a message)."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 1e11 else value
        try:
            return datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            return None
    text = str(value).strip()
    try:
        parsed = datetime.fromisoformat(text)
        return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed
    except ValueError:
        pass
    for fmt in _SEND_DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            continue
    return None


def load_locomo(path: Path, conversation: int = 0) -> Transcript:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not 0 <= conversation < len(data):
        raise InputError(f"LoCoMo has conversations 0..{len(data) - 1}, not {conversation}")
    sample = data[conversation]
    conv = sample["conversation"]
    a, b = conv["speaker_a"], conv["speaker_b"]
    sessions = sorted(
        (int(k.split("_")[1]) for k in conv if k.startswith("session_") and k.count("_") == 1),
    )
    messages: list[Message] = []
    meta: list[dict[str, Any]] = []
    for n in sessions:
        turns = conv.get(f"session_{n}") or []
        when = _parse_locomo_date(conv.get(f"session_{n}_date_time", ""))
        for t in turns:
            text = t["text"]
            if t.get("blip_caption"):
                text = f"{text} [shares a photo: {t['blip_caption']}]"
            role: Role = "user" if t["speaker"] == a else "assistant"
            messages.append(
                Message(role=role, parts=(Part("text", text),), author=t["speaker"], at=when)
            )
            meta.append({"dia_id": t["dia_id"], "session": n})
    return Transcript(
        messages=tuple(messages),
        meta=tuple(meta),
        user=a,
        character=b,
        system_prompt=f"You are {b}, talking with your friend {a}.",
        lang="en",
        info={
            "sample_id": sample.get("sample_id"),
            "qa": sample.get("qa", []),
            "sessions": len(sessions),
        },
    )


def load_realpersonachat(path: Path, speaker: str | None = None) -> Transcript:
    """One speaker's dialogues in time order as one long timeline: that speaker is the
    "character" (assistant), every partner is the user."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    dialogues = [json.loads(x) for x in lines if x.strip()]
    if speaker is None:
        speaker = dialogues[0]["interlocutors"][0]
    picked = [d for d in dialogues if speaker in d["interlocutors"]]
    if not picked:
        raise InputError(f"no dialogue with speaker {speaker!r}")
    messages: list[Message] = []
    meta: list[dict[str, Any]] = []
    for d in picked:
        for u in d["utterances"]:
            mine = u["interlocutor_id"] == speaker
            at = None
            if u.get("timestamp"):
                try:
                    at = datetime.fromisoformat(str(u["timestamp"]))
                except ValueError:
                    at = None
            messages.append(
                Message(
                    role="assistant" if mine else "user",
                    parts=(Part("text", u["text"]),),
                    author=u["interlocutor_id"],
                    at=at,
                )
            )
            meta.append({"dialogue_id": d["dialogue_id"], "utterance_id": u.get("utterance_id")})
    return Transcript(
        messages=tuple(messages),
        meta=tuple(meta),
        user="partner",
        character=speaker,
        system_prompt=f"あなたは{speaker}です。相手と雑談をしてください。",
        lang="ja",
        info={"dialogues": len(picked), "speaker": speaker},
    )


def message_from_json(d: Mapping[str, Any]) -> Message:
    role = d.get("role", "user")
    at = datetime.fromisoformat(d["at"]) if d.get("at") else None
    if "parts" in d:
        parts = tuple(Part.from_json(p) for p in d["parts"])
    else:
        parts = (Part("text", str(d.get("content", d.get("text", "")))),)
    return Message(role=role, parts=parts, author=d.get("author", d.get("name", "")), at=at)


def message_to_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": m.role,
        "author": m.author,
        "parts": [p.to_json() for p in m.parts],
    }
    if m.at:
        out["at"] = m.at.isoformat()
    return out


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSONL file; a line that is not JSON is a clear error naming it."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not JSON ({e.msg})") from e


def load_kioku(path: Path) -> Transcript:
    """kioku's JSONL: an optional first line {"kioku": 1, "system_prompt", "user", "character",
    "lang"}, then one message per line ({"role", "author", "at", "parts" | "content"})."""
    info: dict[str, Any] = {}
    messages: list[Message] = []
    for d in json_lines(path):
        if "kioku" in d:
            info = d
            continue
        messages.append(message_from_json(d))
    return Transcript(
        messages=tuple(messages),
        meta=tuple({} for _ in messages),
        user=info.get("user", "user"),
        character=info.get("character", "assistant"),
        system_prompt=info.get("system_prompt", ""),
        lang=info.get("lang", "en"),
        info=info,
    )


def load_sillytavern(path: Path) -> Transcript:
    """SillyTavern chat JSONL: a header line (user_name, character_name), then one line per
    message ({name, is_user, mes, send_date, swipes, swipe_id}). The chosen swipe is `mes`; the
    message is dated by its `send_date`."""
    header: dict[str, Any] = {}
    messages: list[Message] = []
    for d in json_lines(path):
        if "mes" not in d:
            header = d
            continue
        role: Role = (
            "system" if d.get("is_system") else ("user" if d.get("is_user") else "assistant")
        )
        messages.append(
            Message(
                role=role,
                parts=(Part("text", d["mes"]),),
                author=d.get("name", ""),
                at=parse_send_date(d.get("send_date")),
            )
        )
    return Transcript(
        messages=tuple(messages),
        meta=tuple({} for _ in messages),
        user=header.get("user_name", "user"),
        character=header.get("character_name", "assistant"),
        info=header,
    )


def load(
    path: Path | str | None,
    fmt: str,
    *,
    speaker: str | None = None,
    conversation: int = 0,
) -> Transcript:
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    p = Path(path) if path else default_path(fmt)
    if not p.exists():
        raise InputError(f"no such file: {p} (set KIOKU_SHARED or pass --data)")
    if fmt == "locomo":
        return load_locomo(p, conversation)
    if fmt == "realpersonachat":
        return load_realpersonachat(p, speaker)
    if fmt == "sillytavern":
        return load_sillytavern(p)
    return load_kioku(p)
