"""the quota decided in the database, its COMMIT in the same round trip, its queued count from the tally

POST /jobs of one key queued on the key's lock, held from `trainhub_lock_key_and_count` (0024) to
the COMMIT. Between the two the API's thread had to read the counts and send the COMMIT, and
under load it waited for its process's GIL there, with the lock held: one key's submissions ran
at ~115/s with the database mostly idle (bench `--only api`, 2 cores: the lock held ~8 ms a
submission, of which ~1 ms the database's). And the count of the key's queued jobs read them row
by row: ~1.4 ms at 1,400 queued jobs of one key.

`trainhub_check_quota` takes the lock, counts, and raises `TH429` (with the counts as its detail)
when the new jobs would pass a limit; app.limits sends it and the COMMIT as one query, so the lock
is released by the database alone. The key's queued jobs come from its `job_counts` rows (0018),
which hold the jobs committed so far, the only ones a count under the lock ever sees of other
transactions; the tally triggers run at the commit (0024), so the caller's own new jobs are
added as `new_jobs`. The key's recent submissions are counted as before (bounded by the rate
limit). `trainhub_lock_key_and_count` stays, for API processes of the previous release during a
rolling upgrade (both lock the key with `trainhub_lock_key`, so the two exclude each other); a
later migration may drop it.

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

CHECK_QUOTA = """
CREATE FUNCTION trainhub_check_quota(owner text, since timestamptz, new_jobs bigint, max_queued bigint,
                                     max_recent bigint) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    queued bigint;
    recent bigint;
BEGIN
    PERFORM trainhub_lock_key(owner);
    SELECT greatest(coalesce(sum(c.n), 0), 0) INTO queued
      FROM job_counts AS c WHERE c.owner_id = owner AND c.status = 'queued';
    SELECT count(*) + (SELECT count(*) FROM rejected_submissions AS r WHERE r.owner_id = owner AND r.at > since)
      INTO recent FROM jobs AS j WHERE j.owner_id = owner AND j.created_at > since;
    IF queued + new_jobs > max_queued OR recent > max_recent THEN
        RAISE EXCEPTION 'over the key''s quota'
            USING ERRCODE = 'TH429', DETAIL = queued || ' ' || (recent - new_jobs);
    END IF;
END $$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(CHECK_QUOTA)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION trainhub_check_quota(text, timestamptz, bigint, bigint, bigint)")
