"""The store: the only code that talks to the database (SQLite or PostgreSQL).

The rule of this folder: SQL and SQLAlchemy live here and nowhere else (a test reads every
module's imports to keep it so). Callers hold a `Store` and import what they need from
`kioku.store`; the values it returns (`LogEntry`, `MemoryItem`, `Job`, `Note`…) are plain frozen
dataclasses of the value layer, never rows.

One module for what each table (or pair of tables) holds:
- `db`: the engine, transactions (`Database.atomic()`), upserts, advisory locks (a database URL is read by
  `kioku.dburl`, outside, so that a command's help never loads SQLAlchemy); `schema` declares
  every table.
- `conversations`: conversations, the log of messages, memory items, folds (`Store`).
- `jobs`: summary jobs, their leases and lanes (`JobQueue`).
- `turns`: the per-conversation turn lock and idempotent replies (`TurnLocks`).
- `edits`: edited and deleted messages with their versions (`MessageEdits`).
- `ledger`: the notes ledger (`NotesLedger`).
- `segments`: the recall archive's indexed segments (`RecallSegments`).
- `events`: the event log of compaction and service events, and the counters (`EventLog`).
- `blobs`: media a message carried, a reply's other choices (`Blobs`).
- `keys`: API keys (`ApiKeys`); `listing`: conversations a page at a time; `chats`: a client
  chat's rename and a branch's start.
- `protocols`: the narrow views callers take (a turn's reads and writes, the worker's jobs, the
  operator's edits), so a function says which part of the store it needs.
"""

from kioku.store.conversations import ConversationInfo, Store
from kioku.store.db import DEFAULT_URL, make_engine
from kioku.store.jobs import DEFAULT_LEASE_S, Job

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_URL",
    "ConversationInfo",
    "Job",
    "Store",
    "make_engine",
]
