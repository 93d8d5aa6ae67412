"""One TLS context for every HTTP client kioku makes.

httpx builds a fresh context, loading the whole CA bundle, for each client it creates: 0.2 s
each, and `kioku serve` makes three (the upstream, the reply model, the chronicler's), so a
start took 0.7 s in it. The context is made once, on first use, and shared; it verifies servers
exactly as httpx's own would.
"""

from __future__ import annotations

import ssl
from functools import cache

import certifi


@cache
def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())
