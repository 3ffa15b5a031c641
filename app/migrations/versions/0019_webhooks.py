"""webhooks: a key's default URL and signing secret, and an outbox of deliveries kept by a trigger

- api_keys.webhook_url, webhook_secret, webhook_secret_created_at: the key's default webhook and
  the secret its deliveries are signed with (POST /webhooks/secret shows it once).
- webhook_deliveries: one row per status change of a job that has a webhook (its spec's
  `webhook_url`, else its key's default), inserted by a trigger on `jobs` in the transaction that
  changes the status, so no change is missed however the row changed (app/lifecycle.py, the
  reconciler, retention, a test's UPDATE) and none is sent for a change that rolled back. The row
  holds the job as it was (`job`, its columns as JSON) so that the body sent, rendered at the
  first attempt, shows the job at that status. `seq` numbers a job's changes 1, 2, ...: the
  dispatcher sends them in that order (app/webhooks/outbox.py). Deleting a job deletes its rows.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# The job's columns the body is rendered from (app/webhooks/outbox.py); JSON ones are nested as JSON.
COLUMNS = (
    "id",
    "owner_id",
    "status",
    "framework",
    "hardware",
    "devices",
    "epochs",
    "epoch",
    "created_at",
    "started_at",
    "finished_at",
    "attempts",
    "priority",
    "preempted",
    "sweep_id",
    "trial_number",
)
JSON_COLUMNS = ("spec", "timings", "result", "error", "worker", "trial_params")

POSTGRES_SNAPSHOT = "json_build_object(" + ", ".join(f"'{c}', NEW.{c}" for c in COLUMNS + JSON_COLUMNS) + ")"
SQLITE_SNAPSHOT = (
    "json_object("
    + ", ".join([f"'{c}', new.{c}" for c in COLUMNS] + [f"'{c}', json(new.{c})" for c in JSON_COLUMNS])
    + ")"
)

POSTGRES = f"""
CREATE FUNCTION trainhub_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    target text := COALESCE(NEW.spec->>'webhook_url', (SELECT webhook_url FROM api_keys WHERE id = NEW.owner_id));
BEGIN
    IF target IS NOT NULL THEN
        INSERT INTO webhook_deliveries (id, job_id, seq, event, url, job, status, attempts, created_at, next_attempt_at)
        VALUES (gen_random_uuid()::text, NEW.id,
                (SELECT count(*) + 1 FROM webhook_deliveries WHERE job_id = NEW.id),
                'job.' || NEW.status, target, {POSTGRES_SNAPSHOT}, 'pending', 0, clock_timestamp(), clock_timestamp());
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER trainhub_webhook_insert AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION trainhub_webhook_outbox();
CREATE TRIGGER trainhub_webhook_status AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION trainhub_webhook_outbox();
"""

SQLITE_TARGET = "COALESCE(json_extract(new.spec, '$.webhook_url'), (SELECT webhook_url FROM api_keys WHERE id = new.owner_id))"
SQLITE_UUID = (
    "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-' || "
    "substr('89ab', 1 + abs(random()) % 4, 1) || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))"
)
# SQLAlchemy's SQLite DateTime form, microseconds included (strftime's %f gives milliseconds).
SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f000', 'now')"
SQLITE_INSERT = (
    "INSERT INTO webhook_deliveries (id, job_id, seq, event, url, job, status, attempts, created_at, next_attempt_at) "
    f"SELECT {SQLITE_UUID}, new.id, (SELECT count(*) + 1 FROM webhook_deliveries WHERE job_id = new.id), "
    f"'job.' || new.status, {SQLITE_TARGET}, {SQLITE_SNAPSHOT}, 'pending', 0, {SQLITE_NOW}, {SQLITE_NOW};"
)
SQLITE = [
    f"CREATE TRIGGER trainhub_webhook_insert AFTER INSERT ON jobs WHEN {SQLITE_TARGET} IS NOT NULL "
    f"BEGIN {SQLITE_INSERT} END",
    "CREATE TRIGGER trainhub_webhook_status AFTER UPDATE OF status ON jobs "
    f"WHEN old.status IS NOT new.status AND {SQLITE_TARGET} IS NOT NULL BEGIN {SQLITE_INSERT} END",
]


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("webhook_url", sa.String(2048)))
        batch.add_column(sa.Column("webhook_secret", sa.String(100)))
        batch.add_column(sa.Column("webhook_secret_created_at", sa.DateTime(timezone=True)))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("job", sa.JSON(), nullable=False),
        sa.Column("body", sa.Text()),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.Column("response_status", sa.Integer()),
        sa.Column("error", sa.String(500)),
        sa.UniqueConstraint("job_id", "seq", name="uq_webhook_deliveries_job_seq"),
    )
    # The dispatcher's look: the pending rows by when they are due (few: delivered ones leave it).
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRES)
    else:
        for statement in SQLITE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER trainhub_webhook_insert ON jobs")
        op.execute("DROP TRIGGER trainhub_webhook_status ON jobs")
        op.execute("DROP FUNCTION trainhub_webhook_outbox()")
    else:
        op.execute("DROP TRIGGER trainhub_webhook_insert")
        op.execute("DROP TRIGGER trainhub_webhook_status")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("webhook_secret_created_at")
        batch.drop_column("webhook_secret")
        batch.drop_column("webhook_url")
