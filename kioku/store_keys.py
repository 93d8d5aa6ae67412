"""API keys in the store: only a salted hash of each secret, when it was revoked, and what it
may do (its scopes; none recorded: everything).

`kioku.service.keys` makes and checks keys; this is the SQL of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import insert, select, update

from kioku import schema as s
from kioku.db import Database
from kioku.errors import NotFound


@dataclass(frozen=True)
class StoredKey:
    id: str
    tenant: str
    salt: str
    hash: str
    created_at: float
    revoked_at: float | None = None
    scopes: tuple[str, ...] | None = None  # None: every scope (a key made without --scope)


def _key(r: Any) -> StoredKey:
    scopes = tuple(r.scopes.split(",")) if r.scopes else None
    return StoredKey(r.id, r.tenant, r.salt, r.hash, r.created_at, r.revoked_at, scopes)


# a key with the scopes it was given, if any (a key without a scopes row may do everything)
_WITH_SCOPES = select(s.api_keys, s.api_key_scopes.c.scopes).select_from(
    s.api_keys.outerjoin(s.api_key_scopes, s.api_key_scopes.c.key_id == s.api_keys.c.id)
)


class ApiKeys(Database):
    def add_api_key(self, key: StoredKey) -> None:
        with self.atomic() as conn:
            conn.execute(
                insert(s.api_keys).values(
                    id=key.id,
                    tenant=key.tenant,
                    salt=key.salt,
                    hash=key.hash,
                    created_at=key.created_at,
                    revoked_at=key.revoked_at,
                )
            )
            if key.scopes is not None:
                conn.execute(
                    insert(s.api_key_scopes).values(key_id=key.id, scopes=",".join(key.scopes))
                )

    def api_keys(self) -> list[StoredKey]:
        """Every key, revoked ones included, by tenant then age."""
        k = s.api_keys.c
        with self.reading() as conn:
            rows = conn.execute(_WITH_SCOPES.order_by(k.tenant, k.created_at))
            return [_key(r) for r in rows]

    def api_key(self, key_id: str) -> StoredKey | None:
        with self.reading() as conn:
            row = conn.execute(_WITH_SCOPES.where(s.api_keys.c.id == key_id)).first()
        return _key(row) if row is not None else None

    def revoke_api_key(self, key_id: str, at: float) -> StoredKey:
        """Revoke a key (one revoked already keeps its first revocation time)."""
        k = s.api_keys.c
        with self.atomic() as conn:
            row = conn.execute(_WITH_SCOPES.where(k.id == key_id)).first()
            if row is None:
                raise NotFound(f"no API key {key_id!r}; see `kioku keys list`")
            revoked = row.revoked_at or at
            conn.execute(update(s.api_keys).where(k.id == key_id).values(revoked_at=revoked))
        return replace(_key(row), revoked_at=revoked)
