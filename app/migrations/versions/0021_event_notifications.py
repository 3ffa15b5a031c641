"""event notifications: NOTIFY when a job's events or a key's standing change (PostgreSQL only)

Each open `/jobs/{id}/events` stream polled the database twice a second, so 1,000 idle streams
were 2,000 queries a second. These triggers tell one listener per API process (app/notify.py)
what changed instead, at commit, so a stream reads the database only when its job, its queue or
its key changed:

- channel `trainhub_jobs`, payload "<job id> <queue> <sweep id or nothing>" (the queue only when
  the job's status changed: only that moves the places in its queue): a job row inserted or deleted, or its
  status, epoch or started_at changed (an epoch's metrics row is written in the transaction that
  moves `epoch`, and a job's queue position moves only when a job of its queue changes status);
  payload "<job id>": an epoch's metrics row inserted or updated (a replayed epoch).
- channel `trainhub_sweeps`, payload "<sweep id>": a sweep's status changed.
- channel `trainhub_keys`, payload "<key id>": a key revoked or deleted.

PostgreSQL sends one notification per distinct payload per transaction. The embedded stack
(SQLite) has no NOTIFY: its few streams keep polling.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

JOBS_CHANNEL = "trainhub_jobs"
KEYS_CHANNEL = "trainhub_keys"
SWEEPS_CHANNEL = "trainhub_sweeps"

FUNCTIONS = f"""
-- app.queue.queue_name
CREATE FUNCTION trainhub_queue_name(hardware text, framework text, devices integer) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
    SELECT hardware || '.' || framework || CASE WHEN devices > 1 THEN '.x' || devices ELSE '' END
$$;

CREATE FUNCTION trainhub_notify_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{JOBS_CHANNEL}', OLD.id || ' ' || trainhub_queue_name(OLD.hardware, OLD.framework, OLD.devices)
                                            || ' ' || COALESCE(OLD.sweep_id, ''));
        RETURN OLD;
    END IF;
    -- The queue is named only when the job entered or left a status: an epoch moves no one's place.
    PERFORM pg_notify('{JOBS_CHANNEL}', NEW.id || ' '
                      || CASE WHEN TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
                              THEN trainhub_queue_name(NEW.hardware, NEW.framework, NEW.devices) ELSE '' END
                      || ' ' || COALESCE(NEW.sweep_id, ''));
    RETURN NEW;
END $$;

CREATE FUNCTION trainhub_notify_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{JOBS_CHANNEL}', NEW.job_id);
    RETURN NEW;
END $$;

CREATE FUNCTION trainhub_notify_sweep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{SWEEPS_CHANNEL}', NEW.id);
    RETURN NEW;
END $$;

CREATE FUNCTION trainhub_notify_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{KEYS_CHANNEL}', OLD.id);
        RETURN OLD;
    END IF;
    PERFORM pg_notify('{KEYS_CHANNEL}', NEW.id);
    RETURN NEW;
END $$;
"""

TRIGGERS = """
CREATE TRIGGER trainhub_notify_job_written AFTER INSERT OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION trainhub_notify_job();
CREATE TRIGGER trainhub_notify_job_moved AFTER UPDATE ON jobs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.epoch IS DISTINCT FROM NEW.epoch
                       OR OLD.started_at IS DISTINCT FROM NEW.started_at)
    EXECUTE FUNCTION trainhub_notify_job();
CREATE TRIGGER trainhub_notify_epoch_written AFTER INSERT OR UPDATE ON epoch_metrics
    FOR EACH ROW EXECUTE FUNCTION trainhub_notify_epoch();
CREATE TRIGGER trainhub_notify_sweep_moved AFTER UPDATE ON sweeps
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION trainhub_notify_sweep();
CREATE TRIGGER trainhub_notify_key_revoked AFTER UPDATE ON api_keys
    FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at)
    EXECUTE FUNCTION trainhub_notify_key();
CREATE TRIGGER trainhub_notify_key_deleted AFTER DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION trainhub_notify_key();
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(FUNCTIONS)
    op.execute(TRIGGERS)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for trigger, table in (
        ("trainhub_notify_job_written", "jobs"),
        ("trainhub_notify_job_moved", "jobs"),
        ("trainhub_notify_epoch_written", "epoch_metrics"),
        ("trainhub_notify_sweep_moved", "sweeps"),
        ("trainhub_notify_key_revoked", "api_keys"),
        ("trainhub_notify_key_deleted", "api_keys"),
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    for function in ("trainhub_notify_job()", "trainhub_notify_epoch()", "trainhub_notify_sweep()", "trainhub_notify_key()"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.execute("DROP FUNCTION IF EXISTS trainhub_queue_name(text, text, integer)")
