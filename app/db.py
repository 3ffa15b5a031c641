"""Database engine, sessions and migrations (SQLAlchemy 2.0, Alembic)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from app.config import get_settings

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for `url`. SQLite gets WAL and a busy timeout: the API and a worker write to it
    from separate processes."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().resolved_database_url())


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


def session_scope() -> Session:
    """A new session; use as `with session_scope() as session:`."""
    return get_sessionmaker()()


def get_session() -> Iterator[Session]:
    """FastAPI dependency: one session per request."""
    with session_scope() as session:
        yield session


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
