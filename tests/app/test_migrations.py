"""Migrations from nothing to head keep what earlier ones made: on SQLite a table rebuilt by a
batch migration loses its triggers, which keep /metrics' tallies and the webhook outbox."""

from __future__ import annotations

from sqlalchemy import create_engine, text

TRIGGERS = {
    "trainhub_tally_job_insert",
    "trainhub_tally_job_delete",
    "trainhub_tally_job_status",
    "trainhub_tally_epoch",
    "trainhub_webhook_insert",
    "trainhub_webhook_status",
}


def test_a_fresh_sqlite_database_has_every_trigger_after_the_last_migration(tmp_path):
    from app.db import migrate

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    migrate(url)
    with create_engine(url).connect() as connection:
        names = set(connection.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars())
    assert TRIGGERS <= names, f"missing: {TRIGGERS - names}"


def test_a_postgresql_database_migrated_to_head_has_every_trigger(services_env):
    from app.db import get_engine

    with get_engine().connect() as connection:
        names = set(connection.execute(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars())
    notify = TRIGGERS | {"trainhub_notify_job_written", "trainhub_notify_job_moved", "trainhub_notify_epoch_written",
              "trainhub_notify_sweep_moved", "trainhub_notify_key_revoked", "trainhub_notify_key_deleted"}
    assert notify <= names, f"missing: {notify - names}"
