"""The database schema and its named, ordered migrations.

Tables are SQLAlchemy Core so the same store runs on SQLite (embedded default) and PostgreSQL.
A migration is a named function; `migrate()` runs the ones a database has not recorded yet, in
order, each in its own transaction. Add new ones at the end; never edit one that has shipped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    insert,
    inspect,
    select,
    text,
    update,
)

metadata = MetaData()

migrations_table = Table(
    "kioku_migrations",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("applied_at", String(40), nullable=False),
)

conversations = Table(
    "conversations",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("tenant", String(200), nullable=False, default="default"),
    Column("character", String(200), nullable=False, default=""),
    Column("system_prompt", Text, nullable=False, default=""),
    Column("profile", String(100), nullable=False, default="local-64k"),
    Column("next_seq", BigInteger, nullable=False, default=0),
    # first seq of the raw window; every seq below it is covered by active memory exactly once
    Column("raw_start", BigInteger, nullable=False, default=0),
    # bumps at every fold: the memory exchange changed, the prompt cache breaks once
    Column("memory_version", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    # the id the tenant named it by (issue 11): ids are per tenant, `id` is the row's key
    Column("public_id", String(200), nullable=True),
    # bumps at every edit or delete of a stored message (issue 43): a process that cached the
    # log (a raw window, a recall index) reads it again
    Column("revision", Integer, nullable=False, default=0),
    Index("ix_conversations_tenant", "tenant"),
    Index("ux_conversations_tenant_public", "tenant", "public_id", unique=True),
)

messages = Table(
    "messages",
    metadata,
    Column("conversation_id", String(200), ForeignKey("conversations.id"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("role", String(20), nullable=False),
    Column("author", String(200), nullable=False, default=""),
    Column("at", String(40), nullable=True),
    Column("parts", Text, nullable=False),
    Column("text", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    # set when a stateless client edited or deleted this message after it was stored
    Column("superseded", Integer, nullable=False, default=0),
    Column("meta", JSON, nullable=True),
)

memory_items = Table(
    "memory_items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), ForeignKey("conversations.id"), nullable=False),
    Column("kind", String(20), nullable=False),  # chapter | synopsis
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("text", Text, nullable=False),
    Column("data", JSON, nullable=True),
    Column("tokens", Integer, nullable=False),
    Column("source", String(20), nullable=False),  # llm | extractive
    Column("model", String(200), nullable=False, default=""),
    Column("prompt_version", String(100), nullable=False, default=""),
    # ready: written, not yet in the prompt · active: in the prompt · retired: replaced by a
    # major GC, or discarded because a forced cut overtook it
    Column("status", String(20), nullable=False),
    Column("ready_at", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("replaces", JSON, nullable=True),  # ids a synopsis folds in
    Column("stale", Integer, nullable=False, default=0),
    Index("ix_memory_conv_status", "conversation_id", "status"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), ForeignKey("conversations.id"), nullable=False),
    Column("kind", String(20), nullable=False),  # chapter | synopsis
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("payload", JSON, nullable=True),
    Column("status", String(20), nullable=False),  # queued | running | done | failed | cancelled
    Column("attempts", Integer, nullable=False, default=0),
    Column("run_after", Float, nullable=False),
    Column("lease_until", Float, nullable=True),
    Column("leased_by", String(200), nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Index("ix_jobs_status_run_after", "status", "run_after"),
    Index("ix_jobs_conv", "conversation_id"),
)

compaction_log = Table(
    "compaction_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), nullable=False),
    # chapter | synopsis | cut | refusal | retry | forced_cut | fold | truncated_reply | ...
    Column("event", String(40), nullable=False),
    Column("outcome", String(40), nullable=False, default="ok"),
    Column("duration_s", Float, nullable=True),
    Column("input_tokens", Integer, nullable=True),
    Column("output_tokens", Integer, nullable=True),
    Column("first_seq", BigInteger, nullable=True),
    Column("last_seq", BigInteger, nullable=True),
    Column("detail", Text, nullable=True),
    Column("at", Float, nullable=False),
    Index("ix_compaction_log_conv", "conversation_id"),
)

counters = Table(
    "counters",
    metadata,
    Column("conversation_id", String(200), primary_key=True),
    Column("name", String(100), primary_key=True),
    Column("value", BigInteger, nullable=False, default=0),
    UniqueConstraint("conversation_id", "name"),
)


Migration = tuple[str, Callable[[Connection], None]]


def _create(*tables: Table) -> Callable[[Connection], None]:
    def run(conn: Connection) -> None:
        for t in tables:
            t.create(conn, checkfirst=True)

    return run


MIGRATIONS: list[Migration] = [
    ("0001_log_memory_jobs", _create(conversations, messages, memory_items, jobs)),
    ("0002_compaction_log_counters", _create(compaction_log, counters)),
]


# Any constant shared by every kioku process; PostgreSQL advisory locks are per database.
MIGRATION_LOCK = 0x6B696F6B75  # "kioku"


def _one_at_a_time(conn: Connection) -> None:
    """Serialize migrations across processes that start at once (each waits for the other's
    transaction, then sees what it did). SQLite's BEGIN IMMEDIATE already serializes writers."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})


# Set on a connection's info for a transaction that will write: SQLite then takes the write
# lock at BEGIN (IMMEDIATE) instead of failing to upgrade a read lock later.
WRITE_FLAG = "kioku_write"


# One SQLite file takes one writer at a time. Threads of one process queue here, woken the
# moment the writer before them commits, instead of in SQLite's busy handler, which sleeps
# 1, 2, 5, 10… ms between tries: under a steady load those sleeps were most of a turn's wait.
_SQLITE_WRITERS: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
_WRITERS_GUARD = threading.Lock()


def _writer_lock(engine: Engine) -> AbstractContextManager[object]:
    if engine.dialect.name != "sqlite":
        return nullcontext()
    with _WRITERS_GUARD:
        lock = _SQLITE_WRITERS.get(engine)
        if lock is None:
            lock = _SQLITE_WRITERS[engine] = threading.RLock()
    return lock


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    with _writer_lock(engine), engine.connect() as conn:
        conn.info[WRITE_FLAG] = True
        try:
            with conn.begin():
                yield conn
        finally:
            conn.info.pop(WRITE_FLAG, None)


def migrate(engine: Engine) -> list[str]:
    """Apply pending migrations in order; return the names applied."""
    with writing(engine) as conn:
        _one_at_a_time(conn)
        migrations_table.create(conn, checkfirst=True)
    applied: list[str] = []
    for name, run in MIGRATIONS:
        with writing(engine) as conn:
            _one_at_a_time(conn)
            done = conn.execute(
                select(migrations_table.c.name).where(migrations_table.c.name == name)
            ).first()
            if done:
                continue
            run(conn)
            conn.execute(
                insert(migrations_table).values(name=name, applied_at=datetime.now(UTC).isoformat())
            )
            applied.append(name)
    return applied


# notes and archive recall (issue 4) -----------------------------------------------------------

# The notes ledger is append-only: an edit or a retraction is a new row that names the row it
# replaces in `supersedes`; the replaced row is never updated, so the history stays readable.
notes_ledger = Table(
    "notes_ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), ForeignKey("conversations.id"), nullable=False),
    Column("subject", String(200), nullable=False),
    Column("kind", String(20), nullable=False),  # name | relation | habit | anniversary | ...
    Column("text", Text, nullable=False),
    Column("source_seq", BigInteger, nullable=True),  # the message it was taken from
    Column("author", String(20), nullable=False),  # extractor | operator
    Column("supersedes", Integer, nullable=True),  # id of the entry this one replaces
    Column("retracted", Integer, nullable=False, default=0),  # 1: a tombstone, no text shown
    Column("origin", String(200), nullable=False, default=""),  # model / prompt version
    Column("created_at", Float, nullable=False),
    Index("ix_notes_ledger_conv", "conversation_id"),
)

# The recall index persisted as immutable segments, each the postings of one seq range. The
# messages table stays the source of truth: segments are a cache that a tokenizer change drops.
recall_segments = Table(
    "recall_segments",
    metadata,
    Column("conversation_id", String(200), ForeignKey("conversations.id"), primary_key=True),
    Column("first_seq", BigInteger, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
    Column("tokenizer", String(100), nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

MIGRATIONS.extend(
    [
        ("0003_notes_ledger", _create(notes_ledger)),
        ("0004_recall_index", _create(recall_segments)),
    ]
)

# The notes the prompt shows, rendered at the last fold: notes extracted between folds wait
# for the next one, so the memory exchange (and the prompt cache) changes only at a fold.
notes_snapshots = Table(
    "notes_snapshots",
    metadata,
    Column("conversation_id", String(200), primary_key=True),
    Column("text", Text, nullable=False),
    Column("memory_version", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
)

MIGRATIONS.append(("0005_notes_snapshot", _create(notes_snapshots)))

# the service (issue 5) ---------------------------------------------------------------------

# A stateless client (SillyTavern) re-sends the whole transcript; when it edited, deleted or
# regenerated a stored message, the old content lands here and the `messages` row keeps its seq
# with the new content (a deleted one: no parts, `superseded` = 1). Append-only.
message_versions = Table(
    "message_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), ForeignKey("conversations.id"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("role", String(20), nullable=False),
    Column("author", String(200), nullable=False, default=""),
    Column("parts", Text, nullable=False),
    Column("text", Text, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("change", String(20), nullable=False),  # edit | delete | regenerate
    Column("replaced_at", Float, nullable=False),
    Index("ix_message_versions_conv_seq", "conversation_id", "seq"),
)

# API keys of the service: only a salted hash is stored; the key itself is shown once.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(40), primary_key=True),  # public, printed by `kioku keys list`
    Column("tenant", String(200), nullable=False),
    Column("salt", String(64), nullable=False),
    Column("hash", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
    Index("ix_api_keys_tenant", "tenant"),
)

MIGRATIONS.append(("0006_message_versions_api_keys", _create(message_versions, api_keys)))

# the chat-completions protocol (issue 13) -----------------------------------------------------

# Media content parts (images) of stored messages, whole as the client sent them, named by the
# sha256 of their canonical JSON: the message row holds only the name, so the rows read at every
# turn stay small and a picture sent twice is stored once.
blobs = Table(
    "blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("data", LargeBinary, nullable=False),
    Column("size", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

# The other choices of a reply asked for with n > 1: choice 0 is the stored reply, these are
# offered beside it (as swipes); choosing one is an edit of the stored reply.
reply_choices = Table(
    "reply_choices",
    metadata,
    Column("conversation_id", String(200), ForeignKey("conversations.id"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("choice", Integer, primary_key=True),
    Column("role", String(20), nullable=False),
    Column("author", String(200), nullable=False, default=""),
    Column("parts", Text, nullable=False),
    Column("text", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

MIGRATIONS.append(("0007_i13_blobs_reply_choices", _create(blobs, reply_choices)))

# the fact ledger (issue 14) ------------------------------------------------------------------

# What the notes ledger's entries record besides their text, for the entries kioku extracts:
# who said it (a note's subject is whom it is about), the date of what it records, and the slot
# it fills (a newer fact in the same slot supersedes the older one). Written once per entry.
note_facts = Table(
    "note_facts",
    metadata,
    Column("note_id", Integer, ForeignKey("notes_ledger.id"), primary_key=True),
    Column("conversation_id", String(200), nullable=False),
    Column("said_by", String(200), nullable=False, default=""),
    Column("on_date", String(10), nullable=True),  # ISO date
    Column("slot", String(200), nullable=False, default=""),
    Index("ix_note_facts_conv", "conversation_id"),
)

# Every message that stated a note in force again: how often a fact comes up across the whole
# conversation ranks it when the notes do not all fit. Append-only.
note_mentions = Table(
    "note_mentions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conversation_id", String(200), nullable=False),
    Column("note_id", Integer, nullable=False),
    Column("seq", BigInteger, nullable=True),
    Index("ix_note_mentions_conv", "conversation_id"),
)

MIGRATIONS.append(("0008_i14b_fact_ledger", _create(note_facts, note_mentions)))

# one turn at a time, and requests that change nothing twice (issue 11) ------------------------

# The turn lock of a conversation, by tenant and the id the client sent (a lock can be taken
# before the conversation exists). On SQLite the row is the lock: `owner` holds it until
# `lease_until` (renewed while the turn runs; a dead owner's lock is taken over). On PostgreSQL a
# session advisory lock is the lock and the row only records what the turns did. Either way the
# row says which request ran last (`done`, with the seq of its reply) so a duplicate that waited
# gets the same reply, and which request was running when its owner died (`running`).
turn_locks = Table(
    "turn_locks",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("conversation", String(200), primary_key=True),
    Column("owner", String(200), nullable=True),
    Column("lease_until", Float, nullable=True),
    Column("running", String(64), nullable=True),
    Column("done", String(64), nullable=True),
    Column("done_seq", BigInteger, nullable=True),
    Column("done_at", Float, nullable=True),
    Column("last_owner", String(200), nullable=True),
)

# `Idempotency-Key`s a client sent, per tenant (only a hash of the key is kept), with the reply
# they produced; a key sent again with the same request gets that reply, with another request 422.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("conversation", String(200), nullable=False),
    Column("reply_seq", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_idempotency_keys_created", "created_at"),
)

MIGRATIONS.append(("0009_i11_turn_locks_idempotency", _create(turn_locks, idempotency_keys)))


def _conversation_ids_per_tenant(conn: Connection) -> None:
    """Conversation ids become per tenant: the name a tenant gave a conversation moves to
    `public_id`, unique per tenant; `id` stays the row's key every other table refers to (so no
    other row changes). Ids were global until now, so every existing one keeps its key."""
    if "public_id" not in {c["name"] for c in inspect(conn).get_columns("conversations")}:
        conn.execute(text("ALTER TABLE conversations ADD COLUMN public_id VARCHAR(200)"))
    conn.execute(
        update(conversations)
        .where(conversations.c.public_id.is_(None))
        .values(public_id=conversations.c.id)
    )
    conn.execute(
        text(
            "CREATE UNIQUE INDEX IF NOT EXISTS ux_conversations_tenant_public "
            "ON conversations (tenant, public_id)"
        )
    )


MIGRATIONS.append(("0010_i11_conversation_ids_per_tenant", _conversation_ids_per_tenant))

# key scopes (issue 21) -----------------------------------------------------------------------

# What a key may do (`kioku.service.keys`), as a comma-separated list of scopes. A key without
# a row here was made before scopes existed, or without `--scope`: it may do everything, as it
# always could.
api_key_scopes = Table(
    "api_key_scopes",
    metadata,
    Column("key_id", String(40), primary_key=True),
    Column("scopes", String(200), nullable=False),
)

MIGRATIONS.append(("0011_i21_api_key_scopes", _create(api_key_scopes)))


def _conversation_revision(conn: Connection) -> None:
    """`conversations.revision`: what a process cached of a log is read again after an edit."""
    if "revision" not in {c["name"] for c in inspect(conn).get_columns("conversations")}:
        conn.execute(
            text("ALTER TABLE conversations ADD COLUMN revision INTEGER NOT NULL DEFAULT 0")
        )


MIGRATIONS.append(("0012_i43_conversation_revision", _conversation_revision))
