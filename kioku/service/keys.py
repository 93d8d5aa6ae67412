"""API keys: one tenant per key, only a salted hash at rest, compared in constant time.

A key reads `kioku_<id>_<secret>`. The id is public (`kioku keys list` shows it, `revoke` takes
it) and finds the row; the secret is checked against `sha256(salt + secret)`. The key itself is
printed once, by `kioku keys create`, and never stored.
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


@dataclass(frozen=True)
class ApiKey:
    id: str
    tenant: str
    created_at: float
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256((salt + secret).encode()).hexdigest()


def create_key(store: Store, tenant: str) -> tuple[ApiKey, str]:
    """A new key for `tenant`: (its record, the key text to hand out once)."""
    if not _TENANT.match(tenant):
        raise InputError(
            f"tenant {tenant!r}: use 1-200 letters, digits, '_', '.', '@' or '-' "
            "(starting with a letter or digit)"
        )
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    now = time.time()
    store.add_api_key(StoredKey(key_id, tenant, salt, _digest(salt, secret), now))
    return ApiKey(key_id, tenant, now), f"{PREFIX}_{key_id}_{secret}"


def list_keys(store: Store) -> list[ApiKey]:
    return [ApiKey(r.id, r.tenant, r.created_at, r.revoked_at) for r in store.api_keys()]


def revoke_key(store: Store, key_id: str) -> ApiKey:
    r = store.revoke_api_key(key_id, time.time())
    return ApiKey(r.id, r.tenant, r.created_at, r.revoked_at)


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
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def cached(self, key: str) -> str | None:
        """The tenant of a key checked less than `cache_s` ago, without touching the store."""
        with self._lock:
            hit = self._cache.get(key)
        return hit[0] if hit is not None and hit[1] > self.clock() else None

    def tenant(self, key: str) -> str | None:
        """The tenant a key belongs to, or None for a wrong, unknown or revoked key."""
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
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (row.tenant, now + self.cache_s)
        return str(row.tenant)
