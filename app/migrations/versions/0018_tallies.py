"""tallies: jobs by key, queue and status, and duration histograms, kept by triggers

/metrics read counts and histograms by aggregating every job and epoch row at each scrape, a
cost that grew without bound. These tables hold the same numbers, kept up to date by triggers
on `jobs` and `epoch_metrics`, in the transaction that changes the rows, so they cannot drift:
a scrape reads a few rows per key and label set, however many jobs are stored (app/tallies.py).

- job_counts(owner_id, queue, status, shard, n): a gauge; +1 for a job entering a status, -1 for
  one leaving it (deleted rows too). `shard` (0..3, random per change on PostgreSQL) spreads the
  updates of one key's busy counter over four rows, so concurrent submissions do not queue on one
  row lock; readers sum the shards.
- duration_buckets(kind, owner_id, framework, hardware, status, bucket, n, total): histograms,
  only ever added to; kind `job` (started -> finished, when a started job ends; status its end)
  and `epoch` (each epoch's epoch_time_s; status ''). `bucket` is the index of the first bound
  of JOB_BOUNDS / EPOCH_BOUNDS not below the value (len(bounds): above them all).

The tables are filled from the rows already stored; `trainhub rebuild-metrics` does the same
again if ever needed. The bounds are app/metrics.py's JOB_BUCKETS and EPOCH_BUCKETS: changing
those needs a new migration (new triggers) and a rebuild.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

JOB_BOUNDS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 7 * 24 * 3600)
EPOCH_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
FINISHED = "('succeeded', 'failed', 'cancelled', 'pruned')"


def _bounds(values: tuple) -> str:
    return "[" + ",".join(str(float(v)) for v in values) + "]"


POSTGRES = f"""
CREATE FUNCTION trainhub_queue(hardware text, framework text, devices integer) RETURNS text
    IMMUTABLE LANGUAGE sql AS $$
    SELECT hardware || '.' || framework || CASE WHEN devices > 1 THEN '.x' || devices ELSE '' END $$;

CREATE FUNCTION trainhub_count(owner text, queue text, status text, change integer) RETURNS void
    LANGUAGE sql AS $$
    INSERT INTO job_counts VALUES (owner, queue, status, floor(random() * 4)::smallint, change)
    ON CONFLICT (owner_id, queue, status, shard) DO UPDATE SET n = job_counts.n + EXCLUDED.n $$;

CREATE FUNCTION trainhub_observe(kind text, owner text, framework text, hardware text, status text,
                                 seconds double precision, bounds jsonb) RETURNS void
    LANGUAGE sql AS $$
    INSERT INTO duration_buckets VALUES (
        kind, owner, framework, hardware, status,
        (SELECT count(*) FROM jsonb_array_elements_text(bounds) AS b WHERE b::double precision < seconds),
        1, seconds)
    ON CONFLICT (kind, owner_id, framework, hardware, status, bucket)
    DO UPDATE SET n = duration_buckets.n + 1, total = duration_buckets.total + EXCLUDED.total $$;

CREATE FUNCTION trainhub_tally_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM trainhub_count(OLD.owner_id, trainhub_queue(OLD.hardware, OLD.framework, OLD.devices), OLD.status, -1);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        PERFORM trainhub_count(NEW.owner_id, trainhub_queue(NEW.hardware, NEW.framework, NEW.devices), NEW.status, 1);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.status IN {FINISHED} AND OLD.status NOT IN {FINISHED}
       AND NEW.started_at IS NOT NULL AND NEW.finished_at IS NOT NULL THEN
        PERFORM trainhub_observe('job', NEW.owner_id, NEW.framework, NEW.hardware, NEW.status,
                                 extract(epoch FROM NEW.finished_at - NEW.started_at), '{_bounds(JOB_BOUNDS)}'::jsonb);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION trainhub_tally_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM trainhub_observe('epoch', j.owner_id, j.framework, j.hardware, '', NEW.epoch_time_s,
                             '{_bounds(EPOCH_BOUNDS)}'::jsonb)
    FROM jobs AS j WHERE j.id = NEW.job_id;
    RETURN NULL;
END $$;

CREATE TRIGGER trainhub_tally_job_insert AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION trainhub_tally_job();
CREATE TRIGGER trainhub_tally_job_delete AFTER DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION trainhub_tally_job();
CREATE TRIGGER trainhub_tally_job_status AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION trainhub_tally_job();
CREATE TRIGGER trainhub_tally_epoch AFTER INSERT ON epoch_metrics FOR EACH ROW EXECUTE FUNCTION trainhub_tally_epoch();
"""

SQLITE_QUEUE = "{j}.hardware || '.' || {j}.framework || CASE WHEN {j}.devices > 1 THEN '.x' || {j}.devices ELSE '' END"


def _sqlite_count(row: str, change: int) -> str:
    return (
        f"INSERT INTO job_counts SELECT {row}.owner_id, {SQLITE_QUEUE.format(j=row)}, {row}.status, 0, {change} "
        "WHERE true ON CONFLICT (owner_id, queue, status, shard) DO UPDATE SET n = n + excluded.n;"
    )


def _sqlite_observe(
    kind: str,
    owner: str,
    framework: str,
    hardware: str,
    status: str,
    seconds: str,
    bounds: tuple,
    where: str = "true",
    source: str = "",
) -> str:
    return (
        f"INSERT INTO duration_buckets SELECT '{kind}', {owner}, {framework}, {hardware}, {status}, "
        f"(SELECT count(*) FROM json_each('{_bounds(bounds)}') WHERE value < {seconds}), 1, {seconds} "
        f"{source} WHERE {where} ON CONFLICT (kind, owner_id, framework, hardware, status, bucket) "
        "DO UPDATE SET n = n + 1, total = total + excluded.total;"
    )


SQLITE = [
    f"CREATE TRIGGER trainhub_tally_job_insert AFTER INSERT ON jobs BEGIN {_sqlite_count('new', 1)} END",
    f"CREATE TRIGGER trainhub_tally_job_delete AFTER DELETE ON jobs BEGIN {_sqlite_count('old', -1)} END",
    "CREATE TRIGGER trainhub_tally_job_status AFTER UPDATE OF status ON jobs WHEN old.status IS NOT new.status BEGIN "
    + _sqlite_count("old", -1)
    + _sqlite_count("new", 1)
    + _sqlite_observe(
        "job",
        "new.owner_id",
        "new.framework",
        "new.hardware",
        "new.status",
        "(julianday(new.finished_at) - julianday(new.started_at)) * 86400.0",
        JOB_BOUNDS,
        where=f"new.status IN {FINISHED} AND old.status NOT IN {FINISHED} "
        "AND new.started_at IS NOT NULL AND new.finished_at IS NOT NULL",
    )
    + " END",
    "CREATE TRIGGER trainhub_tally_epoch AFTER INSERT ON epoch_metrics BEGIN "
    + _sqlite_observe(
        "epoch",
        "j.owner_id",
        "j.framework",
        "j.hardware",
        "''",
        "new.epoch_time_s",
        EPOCH_BOUNDS,
        where="j.id = new.job_id",
        source="FROM jobs AS j",
    )
    + " END",
]


def upgrade() -> None:
    op.create_table(
        "job_counts",
        sa.Column("owner_id", sa.String(36), primary_key=True),
        sa.Column("queue", sa.String(40), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("shard", sa.SmallInteger(), primary_key=True),
        sa.Column("n", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_table(
        "duration_buckets",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("owner_id", sa.String(36), primary_key=True),
        sa.Column("framework", sa.String(16), primary_key=True),
        sa.Column("hardware", sa.String(16), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("bucket", sa.SmallInteger(), primary_key=True),
        sa.Column("n", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("total", sa.Float(), nullable=False, server_default="0"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute(POSTGRES)
    else:
        for statement in SQLITE:
            op.execute(statement)
    from app import tallies  # the rows stored so far, counted once (as `trainhub rebuild-metrics` does)

    tallies.fill(op.get_bind())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for trigger, table in (
            ("trainhub_tally_job_insert", "jobs"),
            ("trainhub_tally_job_delete", "jobs"),
            ("trainhub_tally_job_status", "jobs"),
            ("trainhub_tally_epoch", "epoch_metrics"),
        ):
            op.execute(f"DROP TRIGGER {trigger} ON {table}")
        for function in (
            "trainhub_tally_epoch()",
            "trainhub_tally_job()",
            "trainhub_observe(text, text, text, text, text, double precision, jsonb)",
            "trainhub_count(text, text, text, integer)",
            "trainhub_queue(text, text, integer)",
        ):
            op.execute(f"DROP FUNCTION {function}")
    else:
        for trigger in (
            "trainhub_tally_job_insert",
            "trainhub_tally_job_delete",
            "trainhub_tally_job_status",
            "trainhub_tally_epoch",
        ):
            op.execute(f"DROP TRIGGER {trigger}")
    op.drop_table("duration_buckets")
    op.drop_table("job_counts")
