"""API keys: one tenant per key, only a salted hash at rest, compared in constant time.

A key reads `kioku_<id>_<secret>`. The id is public (`kioku keys list` shows it, `revoke` takes
it) and finds the row; the secret is checked against `sha256(salt + secret)`. The key itself is
printed once, by `kioku keys create`, and never stored.

A key has scopes: `chat` (the chat-completions proxy and the model list), `read` (every GET of
the REST API, the metrics) and `operator` (what changes memory: editing notes, correcting a line,
a cut; an operator can read too). A key made without `--scope`, and every key made before scopes
existed, has all three: existing deployments and the SillyTavern panel (which edits notes with
the key it chats with) work as they did. A key that chats in an app should have `chat` alone.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kioku.errors import InputError
from kioku.store import Store
from kioku.store_keys import StoredKey

PREFIX = "kioku"
_KEY = re.compile(r"^kioku_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,199}$")
DEFAULT_CACHE_S = 5.0  # a revoked key stops working within this many seconds
SCOPES = ("chat", "read", "operator")
IMPLIED = {"operator": ("read",)}  # an operator reads what it changes


@dataclass(frozen=True)
class ApiKey:
    id: str
    tenant: str
    created_at: float
    revoked_at: float | None = None
    scopes: tuple[str, ...] = SCOPES

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Grant:
    """What a checked key gives: its tenant and what it may do there."""

    tenant: str
    scopes: frozenset[str]


def parse_scopes(given: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """Scopes as `kioku keys create --scope` takes them (repeated or comma-separated), checked
    and in order; None when none are given (every scope)."""
    if not given:
        return None
    names = [given] if isinstance(given, str) else list(given)
    wanted = {n.strip().lower() for part in names for n in part.split(",") if n.strip()}
    unknown = sorted(wanted - set(SCOPES))
    if unknown:
        raise InputError(f"unknown scope {', '.join(unknown)}; use {', '.join(SCOPES)}")
    return tuple(sc for sc in SCOPES if sc in wanted) or None


def _granted(scopes: tuple[str, ...] | None) -> frozenset[str]:
    given = set(scopes or SCOPES)
    for sc in list(given):
        given.update(IMPLIED.get(sc, ()))
    return frozenset(given)


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256((salt + secret).encode()).hexdigest()


def create_key(
    store: Store, tenant: str, scopes: tuple[str, ...] | None = None
) -> tuple[ApiKey, str]:
    """A new key for `tenant` (with `scopes`, only those; by default every scope): its record,
    and the key text to hand out once."""
    if not _TENANT.match(tenant):
        raise InputError(
            f"tenant {tenant!r}: use 1-200 letters, digits, '_', '.', '@' or '-' "
            "(starting with a letter or digit)"
        )
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    now = time.time()
    store.add_api_key(StoredKey(key_id, tenant, salt, _digest(salt, secret), now, None, scopes))
    return ApiKey(key_id, tenant, now, None, scopes or SCOPES), f"{PREFIX}_{key_id}_{secret}"


def _record(r: StoredKey) -> ApiKey:
    return ApiKey(r.id, r.tenant, r.created_at, r.revoked_at, r.scopes or SCOPES)


def list_keys(store: Store) -> list[ApiKey]:
    return [_record(r) for r in store.api_keys()]


def revoke_key(store: Store, key_id: str) -> ApiKey:
    return _record(store.revoke_api_key(key_id, time.time()))


class KeyRing:
    """Checks keys against the store, remembering good ones for `cache_s` seconds so a turn does
    not pay a database read for its key."""

    def __init__(
        self,
        store: Store,
        cache_s: float = DEFAULT_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.cache_s = cache_s
        self.clock = clock
        self._cache: dict[str, tuple[Grant, float]] = {}
        self._lock = threading.Lock()

    def cached(self, key: str) -> Grant | None:
        """What a key checked less than `cache_s` ago gives, without touching the store."""
        with self._lock:
            hit = self._cache.get(key)
        return hit[0] if hit is not None and hit[1] > self.clock() else None

    def tenant(self, key: str) -> str | None:
        """The tenant a key belongs to, or None for a wrong, unknown or revoked key."""
        grant = self.grant(key)
        return grant.tenant if grant is not None else None

    def grant(self, key: str) -> Grant | None:
        """The tenant a key belongs to and its scopes, or None for a wrong, unknown or revoked
        key."""
        now = self.clock()
        hit = self.cached(key)
        if hit is not None:
            return hit
        m = _KEY.match(key)
        if m is None:
            return None
        key_id, secret = m.groups()
        row = self.store.api_key(key_id)
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(_digest(row.salt, secret), row.hash):
            return None
        grant = Grant(str(row.tenant), _granted(row.scopes))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (grant, now + self.cache_s)
        return grant
