"""Reading long conversations from files: LoCoMo, RealPersonaChat, SillyTavern and kioku's own JSONL.

Benchmarks, `kioku import` and the evals all replay a conversation through the engine; they read it
through here so each format is parsed in one place. Shared evaluation data is found in `../shared`
beside the repository, or wherever `KIOKU_SHARED` points; it is never copied into the repo.
"""

from __future__ import annotations

import json
import os
import re
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


def read_locomo(path: Path | str) -> list[dict[str, Any]]:
    """LoCoMo's JSON list of conversations, or an InputError naming the format the file has."""
    p = check_file(Path(path))
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        found = sniff(p)
        hint = f"it looks like a {found} file" if found else f"formats: {', '.join(FORMATS)}"
        raise InputError(f"{p} is not a LoCoMo file ({hint})") from e
    if not isinstance(data, list) or not all(
        isinstance(d, dict) and "conversation" in d for d in data
    ):
        raise InputError(f"{p} is not a LoCoMo file (a JSON list of conversations)")
    return data


def _parse_locomo_date(s: str) -> datetime | None:
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(s.strip(), fmt)
        except ValueError:
            continue
    return None


def load_locomo(path: Path, conversation: int = 0) -> Transcript:
    data = read_locomo(path)
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
            raise InputError(
                f"{path}:{n}: not JSON ({e.msg}); check the file and its --format"
            ) from e


def load_kioku(path: Path) -> Transcript:
    """kioku's JSONL (docs/formats.md): an optional first line {"kioku": 1, "system_prompt",
    "user", "character", "lang"}, then one message per line ({"role", "author", "at",
    "parts" | "content"})."""
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


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december"]  # fmt: skip
_TAVERN_DATES = (
    # "June 19, 2023 2:20pm" (what SillyTavern writes now)
    re.compile(r"(?P<month>[A-Za-z]+) (?P<d>\d{1,2}), (?P<y>\d{4}) (?P<h>\d{1,2}):(?P<mi>\d{2}) ?(?P<ap>am|pm)", re.I),
    # "2024-7-12@01h31m37s", "2024-6-5 @14h 56m 50s 682ms" (older files)
    re.compile(r"(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2}) ?@(?P<h>\d{1,2})h ?(?P<mi>\d{1,2})m ?(?P<s>\d{1,2})s"),
)  # fmt: skip


def parse_tavern_date(value: Any) -> datetime | None:
    """A SillyTavern `send_date`, in any of the forms its versions wrote (as its own
    `timestampToMoment` reads them): epoch milliseconds, ISO 8601, or the two text forms."""
    if isinstance(value, int | float) or (isinstance(value, str) and value.strip().isdigit()):
        return datetime.fromtimestamp(int(value) / 1000, UTC)
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        pass
    for pattern in _TAVERN_DATES:
        m = pattern.search(value)
        if m is None:
            continue
        g = m.groupdict()
        name = (g.get("month") or "").lower()
        if not g.get("mo") and name not in _MONTHS:
            return None
        month = int(g["mo"]) if g.get("mo") else _MONTHS.index(name) + 1
        hour = int(g["h"])
        if g.get("ap"):
            hour = hour % 12 + (12 if g["ap"].lower() == "pm" else 0)
        try:
            return datetime(
                int(g["y"]), month, int(g["d"]), hour, int(g["mi"]), int(g.get("s") or 0)
            )
        except ValueError:
            return None
    return None


def load_sillytavern(path: Path) -> Transcript:
    """SillyTavern chat JSONL: a header line (user_name, character_name), then one line per
    message ({name, is_user, is_system, mes, send_date, swipes, swipe_id}). The chosen swipe is
    `mes`; the time is `send_date`. System messages (the narrator, and messages hidden from the
    prompt) are left out: SillyTavern never sends them as chat, so the live log has none."""
    header: dict[str, Any] = {}
    messages: list[Message] = []
    hidden = 0
    for d in json_lines(path):
        if "mes" not in d:
            header = d
            continue
        if d.get("is_system"):
            hidden += 1
            continue
        role: Role = "user" if d.get("is_user") else "assistant"
        messages.append(
            Message(
                role=role,
                parts=(Part("text", str(d["mes"])),),
                author=str(d.get("name", "")),
                at=parse_tavern_date(d.get("send_date")),
            )
        )
    return Transcript(
        messages=tuple(messages),
        meta=tuple({} for _ in messages),
        user=header.get("user_name", "user"),
        character=header.get("character_name", "assistant"),
        info={**header, "system_messages_left_out": hidden},
    )


def load(
    path: Path | str | None,
    fmt: str | None,
    *,
    speaker: str | None = None,
    conversation: int = 0,
) -> Transcript:
    """The conversation in a file. Without `fmt` the format is sniffed from the file; with one
    that the file plainly is not, the error names the format that fits."""
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if path:
        p = check_file(resolve(path))
    elif fmt is None:
        raise InputError("pass --data FILE (and --format, if kioku cannot tell it)")
    else:
        p = default_path(fmt)
        if not p.exists():
            raise InputError(f"no such file: {p} (set KIOKU_SHARED or pass --data)")
        p = check_file(p)
    found = sniff(p)
    if fmt is None:
        if found is None:
            raise InputError(f"cannot tell the format of {p}: pass --format ({', '.join(FORMATS)})")
        fmt = found
    elif found is not None and found != fmt:
        raise InputError(f"{p} looks like a {found} file, not {fmt}: pass --format {found}")
    try:
        if fmt == "locomo":
            return load_locomo(p, conversation)
        if fmt == "realpersonachat":
            return load_realpersonachat(p, speaker)
        if fmt == "sillytavern":
            return load_sillytavern(p)
        return load_kioku(p)
    except UnicodeDecodeError as e:
        raise InputError(f"{p} is not UTF-8 text; save it as UTF-8") from e
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        what = e.msg if isinstance(e, json.JSONDecodeError) else f"{type(e).__name__}: {e}"
        raise InputError(f"{p} is not a {fmt} file ({what}); formats: {', '.join(FORMATS)}") from e


def resolve(path: Path | str, env: Mapping[str, str] | None = None) -> Path:
    """`path`, or, when it does not exist and runs through a `shared` folder
    (`../shared/datasets/…`), the same file under `KIOKU_SHARED`: benchmarks run from any
    folder."""
    p = Path(path)
    env = os.environ if env is None else env
    if p.exists() or not env.get("KIOKU_SHARED") or "shared" not in p.parts:
        return p
    below = p.parts[len(p.parts) - p.parts[::-1].index("shared") :]
    alt = Path(env["KIOKU_SHARED"]).joinpath(*below)
    return alt if alt.exists() else p


def check_file(p: Path) -> Path:
    """A readable file, or an InputError that says what is wrong with the path."""
    if p.is_dir():
        raise InputError(f"{p} is a folder; --data takes a file")
    if not p.exists():
        hint = ""
        if "shared" in p.parts:
            hint = f" (relative to {Path.cwd()}; set KIOKU_SHARED to the shared folder)"
        raise InputError(f"no such file: {p}{hint}")
    return p


def sniff(path: Path) -> str | None:
    """The format a file looks like, from its first object; None when it is none of kioku's."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096)
        if head.lstrip().startswith("["):
            return "locomo" if '"conversation"' in head or '"qa"' in head else None
        f.seek(0)
        for _ in range(20):
            line = f.readline()
            if not line:
                return None
            if line.strip():
                break
    try:
        first = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(first, dict):
        return None
    keys = set(first)
    if keys & {"mes", "user_name", "character_name", "chat_metadata"}:
        return "sillytavern"
    if keys & {"interlocutors", "utterances", "dialogue_id"}:
        return "realpersonachat"
    if keys & {"kioku", "role", "parts"}:
        return "kioku"
    return None
