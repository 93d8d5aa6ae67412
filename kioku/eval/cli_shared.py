"""What `kioku eval`'s commands share: their consoles (progress on stderr, tables on stdout),
JSON output, a chat model from a URL, and a list of conversations."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from kioku.config import Settings
from kioku.errors import InputError

err = Console(stderr=True)
out = Console()
# kioku.eval.strategies.HEADLINE, spelled out so that registering the commands imports no arm
HEADLINE_DEFAULT = (
    "generational,generational-norecall,rolling,rolling+recall,rolling-long,truncation,"
    "retrieval,full"
)


def emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=1, default=str) + "\n")


def chat_model(url: str | None, model_id: str | None, settings: Settings) -> Any:
    """An OpenAI-compatible model at `url`; the model name and key default to the settings'
    (KIOKU_LLM_MODEL, KIOKU_LLM_API_KEY)."""
    if not url:
        return None
    from kioku.client import OpenAIChatModel, Timeouts

    # the reply timeout is the user's (--reply-timeout, KIOKU_REPLY_TIMEOUT); the rest default
    reply = settings.reply_timeout_s
    timeouts = Timeouts(reply=reply) if reply is not None else None
    return OpenAIChatModel(
        url, model=model_id or settings.llm_model, api_key=settings.api_key, timeouts=timeouts
    )


def conversations_of(spec: str) -> tuple[int, ...]:
    return indexes_of(spec, "--conversations", "indexes like 0-4,7")


def indexes_of(spec: str, flag: str, takes: str) -> tuple[int, ...]:
    """Numbers and ranges, "0-4,7", in the order written; `flag takes …` when one is not."""
    picked: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                picked.extend(range(lo, hi + 1))
            else:
                picked.append(int(part))
        except ValueError:
            raise InputError(f"{flag} takes {takes}, not {spec!r}") from None
    return tuple(picked)
