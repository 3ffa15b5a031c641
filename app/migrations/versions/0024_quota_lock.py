"""the quota lock: a key's submissions queue on one short section, not on their inserts (PostgreSQL only)

POST /jobs stored its job, then locked the key, counted the key's jobs and committed. Two things
stretched that section, so one key's submissions ran one at a time (~110/s on 2 cores, bench
`--only api`):

- the job_counts tally triggers (0018) ran at each INSERT, so a job's transaction held one of its
  key's four counter rows from its INSERT on, while it waited for the quota lock; the next
  INSERTs onto that row waited behind it. They are now constraint triggers deferred to the
  commit: the counter rows are held for the commit alone, with the same numbers at the end of
  every transaction.
- the lock and the count were two round trips, each waiting for the API process's GIL under
  load. `trainhub_lock_key_and_count` takes the key's advisory lock and then counts in one call
  (a PL/pgSQL statement runs on a snapshot taken after the lock, so the count sees every
  submission committed before it). Its count is app.limits' `_COUNT_QUEUED_AND_RECENT`.

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# The key's lock (app.limits.lock_key takes it too: datasets count under it), then the count.
LOCK_AND_COUNT = """
CREATE FUNCTION trainhub_lock_key(owner text) RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('api_key:' || owner, 0)) $$;

CREATE FUNCTION trainhub_lock_key_and_count(owner text, since timestamptz, OUT queued bigint, OUT recent bigint)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM trainhub_lock_key(owner);
    SELECT count(*) FILTER (WHERE j.status = 'queued'),
           count(*) FILTER (WHERE j.created_at > since)
           + (SELECT count(*) FROM rejected_submissions AS r WHERE r.owner_id = owner AND r.at > since)
      INTO queued, recent
      FROM jobs AS j
     WHERE j.owner_id = owner AND (j.status = 'queued' OR j.created_at > since);
END $$;
"""

TRIGGERS = """
CREATE {kind} TRIGGER trainhub_tally_job_insert AFTER INSERT ON jobs {deferred}
    FOR EACH ROW EXECUTE FUNCTION trainhub_tally_job();
CREATE {kind} TRIGGER trainhub_tally_job_delete AFTER DELETE ON jobs {deferred}
    FOR EACH ROW EXECUTE FUNCTION trainhub_tally_job();
CREATE {kind} TRIGGER trainhub_tally_job_status AFTER UPDATE OF status ON jobs {deferred}
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION trainhub_tally_job();
"""
NAMES = ("trainhub_tally_job_insert", "trainhub_tally_job_delete", "trainhub_tally_job_status")


def _replace_triggers(kind: str, deferred: str) -> None:
    for name in NAMES:
        op.execute(f"DROP TRIGGER {name} ON jobs")
    op.execute(TRIGGERS.format(kind=kind, deferred=deferred))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _replace_triggers("CONSTRAINT", "DEFERRABLE INITIALLY DEFERRED")
    op.execute(LOCK_AND_COUNT)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION trainhub_lock_key_and_count(text, timestamptz)")
    op.execute("DROP FUNCTION trainhub_lock_key(text)")
    _replace_triggers("", "")
