"""Database engine, sessions and migrations (SQLAlchemy 2.0, Alembic)."""

from __future__ import annotations

import ast
import json
import logging
import re
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker

from app.config import get_settings

T = TypeVar("T")
log = logging.getLogger(__name__)
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def strict_json(value: object) -> str:
    """JSON for a JSON column: NaN and infinity raise ValueError instead of being written as the
    non-JSON tokens `NaN`/`Infinity`, which PostgreSQL refuses (and other readers choke on)."""
    return json.dumps(value, allow_nan=False)


def make_engine(url: str) -> Engine:
    """An engine for `url`; JSON columns are written as strict JSON (strict_json). SQLite gets WAL
    and a busy timeout: the API and a worker write to it from separate processes."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=strict_json
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    settings = get_settings()
    engine = create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_s,
        json_serializer=strict_json,
        # The quotas count under the key's lock and need each statement to see what committed
        # before it: pinned, whatever default_transaction_isolation the server sets.
        isolation_level="READ COMMITTED",
    )
    ping_when_idle(engine)
    return engine


# A pooled connection idle longer than this is pinged before use (seconds).
PING_AFTER_IDLE_S = 1.0


def ping_when_idle(engine: Engine, idle_s: float = PING_AFTER_IDLE_S) -> None:
    """Pessimistic disconnect handling without a round trip per request: a connection that sat
    in the pool longer than `idle_s` (or since it was opened) is pinged on checkout, and a dead
    one (the database restarted) is replaced before any statement uses it. A connection handed
    back moments ago is not: under load that ping would be one in every few round trips.
    (SQLAlchemy's `pool_pre_ping` pings on every checkout; this is its documented checkout-event
    recipe with an idle threshold.) A connection that dies while busy fails its statement, and
    SQLAlchemy then invalidates the pool's other connections as well."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", float("-inf")) <= idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            raise exc.DisconnectionError(f"pooled connection is dead: {error}") from error  # the pool reconnects


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().resolved_database_url())


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


@lru_cache
def get_reader_sessionmaker() -> sessionmaker[Session]:
    # Autocommit: each statement runs alone (as it would in a READ COMMITTED transaction, which
    # takes a new snapshot per statement anyway), with no BEGIN and ROLLBACK round trips, and the
    # connection keeps its prepared statements (psycopg drops them all on a ROLLBACK).
    return sessionmaker(get_engine().execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False)


def session_scope() -> Session:
    """A new session; use as `with session_scope() as session:`."""
    return get_sessionmaker()()


def migrate(url: str | None = None) -> None:
    """Apply every Alembic migration up to head (idempotent; run on start by API and workers)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", (url or get_settings().resolved_database_url()).replace("%", "%%"))
    engine = make_engine(url) if url else get_engine()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # The API and workers may start together; one migrates, the others wait for it.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(727274)")
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


_REVISION = re.compile(r"""^(down_revision|revision)\s*(?::[^=]*)?=\s*(.+)$""", re.MULTILINE)


def head_revisions(directory: Path = MIGRATIONS_DIR / "versions") -> set[str]:
    """The Alembic heads of the migration scripts, read from their `revision`/`down_revision`
    lines without importing Alembic (a worker asks at every start). Raises ValueError when a
    script has no revision line."""
    revisions: set[str] = set()
    downs: set[str | None] = set()
    for script in directory.glob("*.py"):
        found = dict(_REVISION.findall(script.read_text()))
        if "revision" not in found:
            raise ValueError(f"migration {script.name} has no revision line")
        revisions.add(ast.literal_eval(found["revision"]))
        down = ast.literal_eval(found.get("down_revision", "None"))
        downs.update(down if isinstance(down, (tuple, list)) else [down])
    return revisions - downs


def schema_current(engine: Engine | None = None) -> bool:
    """Whether the database is migrated to head already (its alembic_version rows are the heads),
    so a starting worker need not load Alembic and take the migration lock. False when it cannot
    tell (no alembic_version table yet, or a script it cannot read): then migrate() decides."""
    from sqlalchemy import text

    try:
        with (engine or get_engine()).connect() as connection:
            stored = {row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))}
        return bool(stored) and stored == head_revisions()
    except (exc.DBAPIError, ValueError, SyntaxError):
        return False


# Errors that a retry can outlast: the server restarting or unreachable, a connection it
# dropped, no free pooled connection. Anything else (a constraint, bad SQL) fails at once.
_TRANSIENT = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, exc.DisconnectionError)


def is_transient(error: BaseException) -> bool:
    """Whether `error` is one a retry of the same statement can outlast (an outage, a restart)."""
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, _TRANSIENT)


def retrying(
    operation: Callable[[], T], deadline_s: float | None = None, first_wait_s: float = 0.2, max_wait_s: float = 5.0
) -> T:
    """`operation()`, called again while it fails with a transient database error, for up to
    `deadline_s` seconds (Settings.db_retry_s: a restart or short outage), waiting twice as long
    each time; its last error is raised after that. Each call must open its own session, so a
    retry starts a fresh transaction on a fresh connection."""
    deadline = time.monotonic() + (get_settings().db_retry_s if deadline_s is None else deadline_s)
    wait = first_wait_s
    while True:
        try:
            return operation()
        except Exception as error:
            if not is_transient(error) or time.monotonic() + wait > deadline:
                raise
            log.warning("database unavailable (%s); retrying in %.1f s", type(error).__name__, wait)
        time.sleep(wait)
        wait = min(max_wait_s, wait * 2)
