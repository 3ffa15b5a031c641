"""The tallies /metrics reads (app/tallies.py), kept by database triggers, agree with the rows
they count after every kind of change: submits, claims, epochs, ends, cancels, releases and
deletes, on PostgreSQL and on the embedded SQLite; and a rebuild counts the same again."""

from __future__ import annotations

from sqlalchemy import delete, func, select, text

DIGITS = {"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 2}
QUEUE = "hardware || '.' || framework || CASE WHEN devices > 1 THEN '.x' || devices ELSE '' END"


def counted_from_rows(session, owner_id: str | None = None) -> dict[tuple[str, str], int]:
    where = "WHERE owner_id = :owner" if owner_id else ""
    rows = session.execute(text(f"SELECT {QUEUE}, status, count(*) FROM jobs {where} GROUP BY 1, 2"),
                           {"owner": owner_id})
    return {(queue, status): n for queue, status, n in rows}


def tallied(session, owner_id: str | None = None) -> dict[tuple[str, str], int]:
    from app.models import JobCount

    query = select(JobCount.queue, JobCount.status, func.sum(JobCount.n)).group_by(JobCount.queue, JobCount.status)
    if owner_id:
        query = query.where(JobCount.owner_id == owner_id)
    return {(queue, status): int(n) for queue, status, n in session.execute(query) if n}


def histograms(session) -> tuple[list, list]:
    from app import tallies

    return (tallies.histogram_rows(session, "job", ["owner_id", "framework", "hardware", "status"]),
            tallies.histogram_rows(session, "epoch", ["owner_id", "framework", "hardware"]))


def test_tallies_follow_every_change_of_the_jobs_and_a_rebuild_agrees(api, auth, make_key, rows):
    from app import lifecycle, tallies
    from app.db import session_scope
    from app.models import Job, utcnow

    other = {"Authorization": f"Bearer {make_key('other')}"}
    mine = [api.post("/jobs", json={**DIGITS, "seed": i}, headers=auth).json()["id"] for i in range(4)]
    theirs = api.post("/jobs", json={**DIGITS, "hardware": "tpu", "devices": 2, "framework": "jax"},
                      headers=other).json()["id"]
    api.post("/comparisons", json={"dataset": {"name": "digits"}, "epochs": 1}, headers=auth)
    rows.start(mine[0])
    rows.epoch(mine[0], 1, epoch_time_s=0.3)
    rows.epoch(mine[0], 2, epoch_time_s=7.0)
    rows.finish(mine[0], seconds=42.0)
    rows.start(mine[1])
    rows.finish(mine[1], status="failed", seconds=2.0)
    api.post(f"/jobs/{mine[2]}/cancel", headers=auth)  # queued -> cancelled
    with session_scope() as session:
        attempt = lifecycle.claim(session, mine[3], {"name": "w"}, utcnow())
        lifecycle.release(session, mine[3], attempt)  # running -> queued
        lifecycle.cancel(session, theirs)
        session.execute(delete(Job).where(Job.id == mine[1]))  # as retention deletes
        session.commit()

    with session_scope() as session:
        assert tallied(session) == counted_from_rows(session)
        owner = session.get(Job, mine[0]).owner_id
        assert tallied(session, owner) == counted_from_rows(session, owner)
        assert tallies.jobs_by_status(session, owner)["queued"] == 3  # mine[3] and the comparison's two
        assert tallies.queue_depths(session, owner) == {"cpu.pytorch": 2, "cpu.jax": 1}
        job_rows, epoch_rows = histograms(session)
        mine_job = [r for r in job_rows if r[0] == owner]
        # succeeded after 42 s (bucket le 60) and failed after 2 s (le 5), though since deleted:
        # a histogram only ever counts up, as Prometheus expects of it
        assert {r[3]: (r[4], r[5]) for r in mine_job} == {"succeeded": (1, 42.0), "failed": (1, 2.0)}
        mine_epochs = [r for r in epoch_rows if r[0] == owner]
        assert [(r[3], round(r[4], 6)) for r in mine_epochs] == [(2, 7.3)]

    with session_scope() as session:
        before = tallied(session), counted_from_rows(session)
        tallies.rebuild(session)
    with session_scope() as session:
        assert tallied(session) == before[1] == before[0]


def test_the_embedded_database_keeps_the_same_tallies(tmp_path, monkeypatch):
    """SQLite (trainhub up): the migration's triggers in SQLite's dialect, and fill."""
    from sqlalchemy import create_engine, update
    from sqlalchemy.orm import Session

    from app import tallies
    from app.db import migrate
    from app.models import ApiKey, EpochMetric, Job, new_id, utcnow

    url = f"sqlite:///{tmp_path / 'trainhub.db'}"
    migrate(url)
    engine = create_engine(url)
    with Session(engine) as session:
        key = ApiKey(id=new_id(), name="k", prefix="th_x", key_hash="h" * 64)
        session.add(key)
        jobs = [Job(owner_id=key.id, framework="jax", hardware="cpu", devices=1, spec={}, epochs=2) for _ in range(3)]
        session.add_all(jobs)
        session.commit()
        started = utcnow()
        session.execute(update(Job).where(Job.id == jobs[0].id).values(status="running", started_at=started))
        session.add(EpochMetric(job_id=jobs[0].id, epoch=1, train_loss=1.0, test_loss=1.0, epoch_time_s=0.3,
                                eval_time_s=0.1, samples_per_s=1.0))
        session.execute(update(Job).where(Job.id == jobs[0].id).values(status="succeeded", finished_at=utcnow()))
        session.execute(update(Job).where(Job.id == jobs[1].id).values(status="cancelled"))
        session.execute(delete(Job).where(Job.id == jobs[2].id))
        session.commit()
        assert tallied(session) == counted_from_rows(session) == {("cpu.jax", "succeeded"): 1,
                                                                  ("cpu.jax", "cancelled"): 1}
        job_rows, epoch_rows = histograms(session)
        assert [(r[3], r[4]) for r in job_rows] == [("succeeded", 1)] and job_rows[0][6] == 1  # le 1 s
        assert [(r[3], round(r[4], 6)) for r in epoch_rows] == [(1, 0.3)]
        tallies.rebuild(session)
        assert tallied(session) == counted_from_rows(session)
        assert histograms(session)[1] == epoch_rows
    engine.dispose()


def test_rebuild_metrics_from_the_cli(api, auth, services_env):
    from typer.testing import CliRunner

    from app.cli import cli
    from app.db import session_scope

    api.post("/jobs", json=DIGITS, headers=auth)
    with session_scope() as session:
        session.execute(text("DELETE FROM job_counts"))  # lost, somehow
        session.commit()
    result = CliRunner().invoke(cli, ["rebuild-metrics"])
    assert result.exit_code == 0 and "rebuilt the tallies" in result.output and "queued" in result.output
    with session_scope() as session:
        assert tallied(session) == counted_from_rows(session)
