"""What `kioku serve` prints: uvicorn's own log lines, and kioku's (a fold, each summary job and
its outcome, a fallback and why) beside them on stderr.

uvicorn configures only its own loggers, and Python's default shows nothing below WARNING, so
without this the INFO lines of `kioku.worker` and `kioku.compaction` never reach the terminal
that runs the service. The config is uvicorn's, passed to it, so every process of
`serve --workers N` applies it too.
"""

from __future__ import annotations

import copy
from typing import Any

from uvicorn.config import LOGGING_CONFIG


def log_config(level: str = "info") -> dict[str, Any]:
    """uvicorn's logging config plus the `kioku` loggers at `level`, one line each, named."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["kioku"] = {
        "()": "uvicorn.logging.DefaultFormatter",
        "fmt": "%(levelprefix)s %(name)s: %(message)s",
        "use_colors": None,
    }
    config["handlers"]["kioku"] = {
        "formatter": "kioku",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["kioku"] = {
        "handlers": ["kioku"],
        "level": level.upper(),
        "propagate": False,
    }
    return config
