"""The options commands share (one name and one help each, across `kioku`'s commands and the
ones its extensions add), and the settings they make: kept apart from the commands so every
command module imports them without importing another's commands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from kioku.config import Settings

FORMATS = "kioku, sillytavern, locomo or realpersonachat"


def data_path(value: Path | None) -> Path | None:
    """`--data`: `../shared/…` also resolves under KIOKU_SHARED, from any folder."""
    if value is None:
        return None
    from kioku.datasets import resolve

    return resolve(value)


DbOpt = Annotated[
    str | None, typer.Option("--db", help="Database URL or SQLite path (env KIOKU_DB).")
]
ProfileOpt = Annotated[
    str | None, typer.Option("--profile", help="local-64k, cloud-1m or local-8k.")
]
WindowOpt = Annotated[
    int | None, typer.Option("--window", help="Scale the profile to this window (tokens).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
TenantOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        envvar="KIOKU_TENANT",
        show_envvar=False,
        help="The tenant (of your `kioku serve` key; env KIOKU_TENANT). Default: the "
        "database's only tenant; with several, say which.",
    ),
]
ConvArg = Annotated[str, typer.Argument(help="Conversation id (`kioku memory` lists them).")]
DataOpt = Annotated[
    Path | None,
    typer.Option("--data", help="The conversation file.", callback=data_path),
]
# a dataset's conversation: RealPersonaChat by speaker, LoCoMo by number
SpeakerOpt = Annotated[
    str | None, typer.Option("--speaker", help="realpersonachat: whose timeline.")
]
LocomoOpt = Annotated[int, typer.Option("--conversation", help="locomo: which conversation.")]
# a profile by name for a replay (no settings file or environment to fall back on)
ReplayProfileOpt = Annotated[str, typer.Option("--profile", help="The model profile.")]
# one name each across commands; the names commands had before stay, hidden, so scripts run on
MessagesOpt = Annotated[
    int | None, typer.Option("--messages", min=1, help="Only the first N messages.")
]
LegacyLimitOpt = Annotated[int | None, typer.Option("--limit", hidden=True)]
LegacyIndexOpt = Annotated[int | None, typer.Option("--conversation-index", hidden=True)]
LegacyMaxMessagesOpt = Annotated[int | None, typer.Option("--max-messages", hidden=True)]
SummaryTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--summary-timeout",
        min=1,
        metavar="<seconds>",
        help="Seconds to wait for one chronicler reply (env KIOKU_SUMMARY_TIMEOUT; default: "
        "the profile's, 300, 900 for local-8k).",
    ),
]
ReplyTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--reply-timeout",
        min=1,
        metavar="<seconds>",
        help="Seconds to wait for the reply model: the whole answer, or a streamed answer's "
        "longest silence (env KIOKU_REPLY_TIMEOUT; default 120; a local model on a CPU needs "
        "minutes for a long prompt).",
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        min=0,
        max=2,
        metavar="<0-2>",
        help="The chronicler's temperature (env KIOKU_SUMMARY_TEMPERATURE; default 0.2).",
    ),
]


def either(value: Any, legacy: Any) -> Any:
    """An option's value, or the value given under its old (hidden) name."""
    return value if value is not None else legacy


def settings(
    db: str | None = None, profile: str | None = None, window: int | None = None, **kw: Any
) -> Settings:
    from kioku.config import from_env

    return from_env().with_(db=db, profile=profile, window=window, **kw)
