"""The scale row (bench/scale.py) at toy sizes: it stores what it says, keeps /metrics' tallies
right, measures every endpoint and the streams, and cleans up after itself. No timing is
asserted: at these sizes the numbers mean nothing."""

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

from app import tallies
from app.models import ApiKey, EpochMetric, Job
from bench import report, scale
from tests.e2e.conftest import forget_unfinished_jobs
from trainers.spec import JobSpec

pytestmark = pytest.mark.timeout(600)


def _counts(database_url: str, owners: list[str]) -> dict:
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            jobs = dict(session.execute(select(Job.status, func.count()).where(Job.owner_id.in_(owners))
                                        .group_by(Job.status)).all())
            epochs = session.scalar(select(func.count()).select_from(EpochMetric).join(Job)
                                    .where(Job.owner_id.in_(owners)))
            tallied = {status: sum(tallies.jobs_by_status(session, owner).get(status, 0) for owner in owners)
                       for status in jobs}
            # a histogram row: (label, count, sum, cumulative count of each bound)
            epoch_hist = sum(row[1] for owner in owners
                             for row in tallies.histogram_rows(session, "epoch", ["framework"], owner))
            job_hist = sum(row[1] for owner in owners
                           for row in tallies.histogram_rows(session, "job", ["status"], owner))
            specs = list(session.scalars(select(Job.spec).where(Job.owner_id.in_(owners)).limit(20)))
            per_job = set(session.scalars(select(func.count()).select_from(EpochMetric).join(Job)
                                          .where(Job.owner_id.in_(owners)).group_by(EpochMetric.job_id)))
    finally:
        engine.dispose()
    return {"jobs": jobs, "epochs": epochs, "tallied": tallied, "epoch_hist": epoch_hist, "job_hist": job_hist,
            "specs": specs, "per_job": per_job}


def test_grown_rows_are_stored_and_counted_in_the_tallies(database_url):
    keys = scale.reset(database_url)
    owners = [owner for owner, _ in keys["owners"]]
    scale.grow(database_url, owners, 0, 60)
    scale.grow(database_url, owners, 60, 150)
    counts = _counts(database_url, owners)

    assert sum(counts["jobs"].values()) == 150
    assert set(counts["jobs"]) <= {"succeeded", "failed", "cancelled"} and counts["jobs"]["succeeded"] > 75
    assert counts["epochs"] == 150 * scale.EPOCHS_PER_JOB and counts["per_job"] == {scale.EPOCHS_PER_JOB}
    # /metrics reads the tallies: they say what the rows say.
    assert counts["tallied"] == counts["jobs"]
    assert counts["epoch_hist"] == 150 * scale.EPOCHS_PER_JOB
    assert counts["job_hist"] == 150
    for spec in counts["specs"]:
        JobSpec.model_validate(spec)  # the stored specs are real ones

    # The next run starts from nothing: its keys are new, the old ones and their jobs are gone.
    again = scale.reset(database_url)
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            assert session.scalar(select(func.count()).select_from(Job).where(Job.owner_id.in_(owners))) == 0
            assert session.scalar(select(func.count()).select_from(ApiKey).where(ApiKey.id.in_(owners))) == 0
            assert sum(tallies.jobs_by_status(session, owners[0]).values()) == 0
    finally:
        engine.dispose()
    assert {owner for owner, _ in again["owners"]}.isdisjoint(owners)


@pytest.mark.e2e
def test_scale_row_measures_every_endpoint_and_the_streams(database_url, redis_url, repo_root, tmp_path):
    forget_unfinished_jobs(database_url)
    since = datetime.now(timezone.utc)  # earlier tests' finished jobs of one epoch are not the row's
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "scale", "--quick", "--scale-sizes", "100,300",
         "--scale-streams", "20", "--scale-database-url", database_url, "--redis-url", redis_url, "--out", str(out)],
        cwd=repo_root, capture_output=True, text=True, timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    row = results["scale"]
    assert "skipped" not in row and "streams_error" not in row, row

    assert [size["jobs"] for size in row["sizes"]] == [100, 300]
    for size in row["sizes"]:
        assert size["stored"]["epoch_rows"] >= size["jobs"] * scale.EPOCHS_PER_JOB
        for part in ("endpoints", "reference"):  # the grown database, and the reference timed alongside
            assert set(size[part]) == set(scale.ENDPOINTS)
            for name, timing in size[part].items():
                assert timing["statuses"] == {"201" if name.startswith("POST") else "200": timing["requests"]}, name
                assert timing["p99_ms"] >= timing["p99_best_round_ms"] > 0
            assert size[part]["POST /jobs"]["created_and_deleted"] > size[part]["POST /jobs"]["requests"]
    assert row["reference_growth"]["inserted"] == 100
    streams = row["streams"]
    assert streams["opened"]["open"] == 20 and streams["opened"]["failed"] == 0
    assert streams["client"]["still_open_at_stop"] == 20 and streams["client"]["watched_ended"]
    delay = streams["epoch_to_event"]
    assert delay["received"] == delay["stored"] == results["config"]["scale_stream_epochs"]
    assert streams["open_idle"]["window_s"] > 0 and streams["none_open"]["transactions"] >= 0

    # Every verdict of the row is judged and printed.
    verdicts = [c for c in results["criteria"] if c["name"].startswith("scale: ")]
    assert len(verdicts) == len(scale.TARGETED) + 2
    assert all(c["passed"] in (True, False) for c in verdicts), verdicts
    for c in verdicts:
        assert f"] {c['name']}: " in done.stdout
    assert "GET /jobs/{id}/metrics" in done.stdout and "streams: 20 of 20 open" in done.stdout

    # What it made to measure is gone: the POSTed jobs (and their messages), the streams' jobs.
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            left = connection.execute(text(
                "SELECT count(*) FROM jobs WHERE (status IN ('queued', 'running') OR epochs = 1) AND created_at >= :since"
            ), {"since": since}).scalar_one()
    finally:
        engine.dispose()
    assert left == 0
    import redis

    assert redis.Redis.from_url(redis_url).llen(scale.POST_QUEUE) == 0


def _timing(p99: float) -> dict:
    return {"requests": 30, "p50_ms": p99 / 2, "p99_ms": p99, "p99_best_round_ms": p99 * 0.9,
            "p99_by_round_ms": [p99 * 0.9, p99, p99], "max_ms": p99 * 2, "statuses": {"200": 30}}


def _scale_results(last_p99: float, open_per_s: float, delay_p99: float, received: int = 50) -> dict:
    def size(jobs: int, p99: float) -> dict:
        return {"jobs": jobs, "growth": {"total_s": 1.0}, "stored": {"database_bytes": 10**7},
                "endpoints": {name: _timing(p99) for name in scale.ENDPOINTS}}

    streams = {"streams": 1000, "opened": {"open": 1000, "failed": 0, "open_s": 3.0},
               "none_open": {"per_s": 0.4, "window_s": 10.0}, "open_idle": {"per_s": open_per_s, "window_s": 10.0},
               "epoch_to_event": {"stored": 50, "received": received, "p50_ms": delay_p99 / 2, "p99_ms": delay_p99,
                                  "max_ms": delay_p99}}
    # The last size is judged against the reference timed alongside it, not the first size
    # (timed earlier, under whatever else the machine was doing then).
    largest = {**size(10**6, last_p99), "reference": size(1000, 10.0)["endpoints"]}
    return {"scale": {"config": {"sizes": [1000, 10**6]}, "sizes": [size(1000, 4.0), largest], "streams": streams}}


def test_scale_verdicts():
    flat = {c.name: c.passed for c in report.scale_criteria(_scale_results(14.0, 1.0, 40.0))}
    grown = {c.name: c.passed for c in report.scale_criteria(_scale_results(16.0, 2000.0, 400.0))}

    assert list(flat.values()) == [True] * (len(scale.TARGETED) + 2)   # 1.4 x; 1.0/s vs 0.4/s; 40 ms
    assert list(grown.values()) == [False] * (len(scale.TARGETED) + 2)  # 1.6 x; 2000/s; 400 ms
    # An epoch whose event never came fails the delay, however fast the others were.
    lost = report.scale_criteria(_scale_results(14.0, 1.0, 40.0, received=49))
    assert lost[-1].passed is False
    assert any("1,000,000 jobs vs 1,000" in c.name for c in report.scale_criteria(_scale_results(14.0, 1.0, 40.0)))
    # Not run: every scale verdict is "not measured", with the reason.
    skipped = report.scale_criteria({"scale": {"skipped": "--skip-scale"}})
    assert [c.passed for c in skipped] == [None] * (len(scale.TARGETED) + 2)
    assert all(c.note == "--skip-scale" for c in skipped)
    lines = report.scale_table(_scale_results(14.0, 1.0, 40.0))
    assert any(line.startswith("GET /jobs/{id}/metrics") and "2.0 / 4.0" in line and "7.0 / 14.0" in line
               for line in lines)
    assert any("the 1,000-job reference database" in line for line in lines)
    assert report.scale_table({}) == []
