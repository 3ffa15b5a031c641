"""The scale row: the API's cost against the number of jobs stored, and event streams held open.

One run, on a database of its own (`--scale-database-url`, default `bench_scale`; its scale
rows are emptied first, so every run starts from nothing):

1. grow the database to each size in turn (10^3, 10^5, 10^6 jobs by default), bulk-inserting
   the rows a year of use would leave: jobs of four keys, mostly finished (succeeded, failed,
   cancelled), with real specs, results, timings and worker JSON, ten epoch_metrics rows each;
   then `app.tallies.fill` (the rows are inserted with the tally triggers off, so /metrics is
   counted once from them, as `trainhub rebuild-metrics` does) and VACUUM ANALYZE;
2. at each size, p50/p99 of sequential requests of one key (a quarter of the jobs are its), and
   the same on a reference database of the first size (`<name>_ref`, its own API), the two
   taking turns request by request, so both are timed under the same load of a shared machine:
   `GET /metrics` (the service-wide scrape of an admin key, and the key's own),
   `GET /jobs?limit=50`, `GET /jobs?status=failed&limit=20` (20: the reference's keys have
   21-29 failed jobs each, so both pages are full), `GET /jobs/{id}` and
   `GET /jobs/{id}/metrics` (ids sampled across the whole table), and `POST /jobs` to a queue
   the stored jobs ran on, from a second key (another quarter), so the first key's pages hold
   its stored jobs, not the POSTed ones; each job cancelled once timed (then deleted, with their
   broker messages, so the size stays what it says);
3. at the last size, `streams` event streams on queued jobs (1,000), opened from a second
   process (bench/streams.py): the database's transactions per second (pg_stat_database's
   xact_commit + xact_rollback; every query of the API runs in one) over a window with none open,
   then with them all open and idle; then epochs stored on a running job as a worker stores them
   (its EpochMetric row and app.lifecycle.record_epoch, one transaction) while they stay open,
   and the delay from each commit to its `metrics` event reaching the client.

The API runs without a worker (nothing trains; the reconciler, which lives in workers, does not
touch the rows), over the bench's Redis db. The targets: each endpoint's p99 at the last size
within 1.5 x the reference's, timed alongside it; transactions per second with the streams open no more than
with none; the epoch-to-event delay's p99 under 100 ms (bench/report.py).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench.load import percentile
from bench.procs import die_with_parent

DEFAULT_SIZES = (1_000, 100_000, 1_000_000)
EPOCHS_PER_JOB = 10
OWNERS = 4                     # keys the jobs belong to; the first is the one measured
KEY_NAME = "bench-scale"       # the keys' names start with it: what a reset deletes
JOB_SPACING_S = 30.0           # job i was created i x 30 s ago: 10^6 jobs are ~a year of use
BATCH = 20_000                 # jobs per COPY batch (and per epoch INSERT)
# Statuses of the stored jobs, cumulative shares: what a service that ran for a year holds.
STATUS_SHARES = (("succeeded", 0.86), ("failed", 0.95), ("cancelled", 1.0))
# POST /jobs goes to a queue the stored jobs ran on (the key's history there is what its queue
# position reads), and each job is cancelled once timed, so every POST is the key's only queued
# job (the common case: one submission at a time). No worker consumes the queue; it is emptied after.
POST_SPEC = {"framework": "jax", "hardware": "cpu", "dataset": {"name": "digits"}, "epochs": 1,
             "labels": {"bench": "scale"}}
POST_QUEUE = "cpu.jax"
STREAM_EPOCHS = 50             # epochs stored on the running job while the streams are open

log: Callable[[str], None] = lambda message: print(f"[bench.scale] {message}", file=sys.stderr, flush=True)  # noqa: E731


@dataclass
class ScaleConfig:
    """What the scale row does; the tests run it tiny (sizes 100 and 1000, 20 streams)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    requests: int = 600        # timed requests per endpoint, size and database (after `warmup`)
    warmup: int = 20
    streams: int = 1000
    window_s: float = 30.0     # each transactions-per-second window (bench/__main__.py says why 30)
    # After opening the streams (a burst of reads), before their idle window: PostgreSQL 15 flushes
    # an idle backend's counts up to 10 s late (PGSTAT_IDLE_INTERVAL).
    settle_s: float = 11.0
    stream_epochs: int = STREAM_EPOCHS
    epoch_interval_s: float = 0.3
    api_workers: int = 2


# --- the rows -----------------------------------------------------------------------------------


def _spec_variants(rng: random.Random, count: int = 256) -> list[tuple[str, str, str, dict]]:
    """(framework, hardware, spec JSON, the spec) of `count` real job specs (JobSpec-validated)."""
    from trainers.spec import JobSpec

    variants = []
    for i in range(count):
        framework = ("jax", "pytorch")[i % 2]
        hardware = ("cpu", "cpu", "gpu")[i % 3]
        model = rng.choice([{"name": "mlp", "hidden_sizes": [256, 128]}, {"name": "mlp", "hidden_sizes": [512]},
                            {"name": "cnn"}, {"name": "mlp", "hidden_sizes": [128, 64], "dropout": 0.2}])
        spec = JobSpec.model_validate({
            "framework": framework, "hardware": hardware, "epochs": EPOCHS_PER_JOB, "model": model,
            "dataset": {"name": rng.choice(["fashion-mnist", "mnist", "digits"])},
            "optimizer": {"learning_rate": rng.choice([1e-3, 3e-4, 1e-2])},
            "batch_size": rng.choice([64, 128, 256]), "seed": rng.randrange(1000),
            "name": f"run {i}", "labels": {"team": rng.choice(["vision", "research", "infra"]), "bench": "scale"},
        }).model_dump(mode="json")
        variants.append((framework, hardware, json.dumps(spec), spec))
    return variants


def _job_row(i: int, now: datetime, owners: list[str], variants: list, rng: random.Random) -> tuple:
    """The COPY row of job number `i` (0 the newest), finished, with its JSON as a worker writes it."""
    framework, hardware, spec_json, _ = variants[i % len(variants)]
    draw = rng.random()
    status = next(name for name, share in STATUS_SHARES if draw < share)
    epoch_s = rng.uniform(0.2, 3.0) if hardware == "cpu" else rng.uniform(0.03, 0.4)
    created = now - timedelta(seconds=JOB_SPACING_S * i)
    wait = rng.uniform(0.01, 20.0)
    train = epoch_s * EPOCHS_PER_JOB
    total = train + rng.uniform(0.5, 3.0)
    started = created + timedelta(seconds=wait)
    finished = started + timedelta(seconds=total)
    timings = {"queue_wait_s": wait, "setup_s": rng.uniform(0.05, 1.0), "compile_s": rng.uniform(0.0, 2.0),
               "first_epoch_s": epoch_s * 1.2, "steady_epoch_s": epoch_s, "train_s": train,
               "eval_s": rng.uniform(0.02, 0.5), "checkpoint_s": rng.uniform(0.05, 0.3), "total_s": total}
    result = {"test_loss": rng.uniform(0.25, 0.6), "test_accuracy": rng.uniform(0.82, 0.99),
              "first_step_loss": rng.uniform(2.2, 2.5)}
    error = None
    if status == "failed":
        result = None
        error = {"type": rng.choice(["nan_loss", "out_of_memory", "worker_lost", "internal"]),
                 "message": "the loss became NaN at epoch 4; lower the learning rate"}
    worker = {"name": f"host-{i % 7}:{100 + i % 13}:ab{i % 97:02d}", "hostname": f"host-{i % 7}",
              "hardware": hardware, "devices": [0], "backend": hardware,
              "versions": {"python": "3.11.2", framework: "0.4.30" if framework == "jax" else "2.4.0"}}
    return (str(uuid.uuid4()), owners[i % len(owners)], status, framework, hardware, 1, spec_json, EPOCHS_PER_JOB,
            EPOCHS_PER_JOB, created, started, finished, 1, status == "cancelled", json.dumps(timings),
            None if result is None else json.dumps(result), None if error is None else json.dumps(error),
            json.dumps(worker), created, 1, 0)


JOB_COLUMNS = ("id", "owner_id", "status", "framework", "hardware", "devices", "spec", "epochs", "epoch", "created_at",
               "started_at", "finished_at", "attempts", "cancel_requested", "timings", "result", "error", "worker",
               "enqueued_at", "priority", "preempted")

# Ten epochs of each job of the batch, made by the server: losses falling, accuracies rising,
# epoch times around the job's steady_epoch_s.
EPOCHS_SQL = f"""
INSERT INTO epoch_metrics (job_id, epoch, train_loss, train_accuracy, test_loss, test_accuracy, epoch_time_s,
                           eval_time_s, samples_per_s, learning_rate)
SELECT j.id, e, 2.3 * exp(-0.35 * e) + 0.05 * random(), 1 - 0.9 * exp(-0.45 * e) - 0.02 * random(),
       2.2 * exp(-0.3 * e) + 0.1 + 0.05 * random(), 1 - 0.9 * exp(-0.4 * e) - 0.03 * random(), t.s,
       0.05 + 0.05 * random(), 60000 / t.s, 0.001
FROM jobs AS j CROSS JOIN generate_series(1, {EPOCHS_PER_JOB}) AS e
CROSS JOIN LATERAL (SELECT (j.timings ->> 'steady_epoch_s')::float * (0.9 + 0.2 * random()) AS s) AS t
WHERE j.id = ANY(%(ids)s)
ORDER BY j.id, e
"""


def _psycopg_url(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def reset(database_url: str) -> dict:
    """Migrate the database, delete what an earlier scale run stored (its keys' jobs, then the
    keys), and make this run's keys: {"owners": [(id, secret)], "admin": (id, secret)}."""
    from sqlalchemy import delete, select, text
    from sqlalchemy.orm import Session

    from app import tallies
    from app.db import make_engine, migrate
    from app.keys import create_key
    from app.models import ApiKey, Job

    migrate(database_url)
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            old = list(session.scalars(select(ApiKey.id).where(ApiKey.name.startswith(KEY_NAME))))
            others = session.scalar(select(Job.id).where(Job.owner_id.not_in(old)).limit(1)) if old else "?"
            if old and others is None:
                # Only scale rows are stored (bench_scale): TRUNCATE, in a moment, then count the tallies again.
                session.execute(text("TRUNCATE jobs CASCADE"))
                tallies.fill(session.connection())
            elif old:
                session.execute(delete(Job).where(Job.owner_id.in_(old)))  # the triggers take them off the tallies
            session.execute(delete(ApiKey).where(ApiKey.id.in_(old)))
            session.commit()
            owners = [create_key(session, f"{KEY_NAME}-{n}") for n in range(OWNERS)]
            admin = create_key(session, f"{KEY_NAME}-admin", admin=True)
            return {"owners": [(key.id, secret) for key, secret in owners], "admin": (admin[0].id, admin[1])}
    finally:
        engine.dispose()


def grow(database_url: str, owners: list[str], have: int, size: int, seed: int = 0) -> dict:
    """Insert jobs number `have`..`size`-1 (with their epochs), count the tallies again, VACUUM
    ANALYZE; what it took. The rows go in with the tally triggers (and foreign-key checks) off when
    the role may (session_replication_role, a superuser's), so the tallies are counted once after;
    otherwise with them on, which keeps the tallies as they go."""
    import psycopg
    from sqlalchemy import create_engine

    from app import tallies

    rng = random.Random(seed * 1_000_003 + have)
    variants = _spec_variants(random.Random(seed))
    now = datetime.now(UTC)
    started = time.perf_counter()
    triggers_off = False
    with psycopg.connect(_psycopg_url(database_url)) as connection:
        connection.execute("SET synchronous_commit = off")
        try:
            connection.execute("SET session_replication_role = replica")
            triggers_off = True
        except psycopg.errors.InsufficientPrivilege:
            connection.rollback()
        connection.commit()
        for first in range(have, size, BATCH):
            rows = [_job_row(i, now, owners, variants, rng) for i in range(first, min(first + BATCH, size))]
            with connection.cursor() as cursor:
                with cursor.copy(f"COPY jobs ({', '.join(JOB_COLUMNS)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                cursor.execute(EPOCHS_SQL, {"ids": [row[0] for row in rows]})
            connection.commit()
            if (first - have) % (10 * BATCH) == 0 and first > have:
                log(f"  {first:,} jobs stored ({time.perf_counter() - started:.0f} s)")
    inserted_s = time.perf_counter() - started
    engine = create_engine(database_url)
    try:
        if triggers_off:
            with engine.begin() as connection:
                tallies.fill(connection)
        filled_s = time.perf_counter() - started - inserted_s
    finally:
        engine.dispose()
    vacuum(database_url)
    return {"inserted": size - have, "insert_s": inserted_s, "tallies_s": filled_s if triggers_off else None,
            "triggers_off": triggers_off, "total_s": time.perf_counter() - started}


def vacuum(database_url: str) -> None:
    """VACUUM ANALYZE the job tables: fresh statistics for the planner, no dead rows left for
    autovacuum to visit during a measurement."""
    from sqlalchemy import create_engine

    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for table in ("jobs", "epoch_metrics", "job_counts", "duration_buckets"):
                connection.exec_driver_sql(f"VACUUM ANALYZE {table}")
    finally:
        engine.dispose()


def stored(database_url: str) -> dict:
    """What the database holds: jobs, epoch rows, its size on disk (bytes)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            jobs = connection.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            epochs = connection.execute(text("SELECT count(*) FROM epoch_metrics")).scalar_one()
            size = connection.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    finally:
        engine.dispose()
    return {"jobs": jobs, "epoch_rows": epochs, "database_bytes": size}


# --- the timings --------------------------------------------------------------------------------


def sample_ids(database_url: str, owner_id: str, n: int) -> list[str]:
    """`n` of the key's succeeded jobs, drawn from the whole table."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(
                "SELECT id FROM jobs WHERE owner_id = :o AND status = 'succeeded' ORDER BY random() LIMIT :n"),
                {"o": owner_id, "n": n}).scalars())
    finally:
        engine.dispose()


def timed(client: httpx.Client, method: str, paths: list[str], n: int, body: dict | None = None,
          headers: dict | None = None) -> tuple[list[float], dict[str, int], list[str]]:
    """`n` sequential requests cycling over `paths`: their latencies (ms), statuses, and (POST) the
    created ids, each job cancelled once its POST is timed."""
    latencies, statuses, ids = [], {}, []
    for i in range(n):
        sent = time.perf_counter()
        response = client.request(method, paths[i % len(paths)], json=body, headers=headers)
        latencies.append((time.perf_counter() - sent) * 1000)
        statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
        if method == "POST" and response.status_code == 201:
            ids.append(response.json()["id"])
            client.post(f"/jobs/{ids[-1]}/cancel", headers=headers).raise_for_status()
    return latencies, statuses, ids


ENDPOINTS = ("GET /metrics (admin)", "GET /metrics (own key)", "GET /jobs?limit=50", "GET /jobs?status=failed&limit=20",
             "GET /jobs/{id}", "GET /jobs/{id}/metrics", "POST /jobs")
# The ones the issue names (the target holds for each); the others are measured alongside.
TARGETED = ("GET /metrics (admin)", "GET /jobs?limit=50", "GET /jobs/{id}", "GET /jobs/{id}/metrics", "POST /jobs")
ROUNDS = 3


@dataclass
class Target:
    """A service timed by measure_endpoints: its URL, its database and the keys made there."""

    url: str
    database_url: str
    keys: dict


def _plan(target: Target) -> dict:
    """{endpoint: (method, paths, body, headers)} for `target`'s first key (ids sampled there);
    POST /jobs from its second: the first key's pages then hold only stored, finished jobs (not
    the timed POSTs' cancelled ones, never started, which render with no epochs)."""
    ids = sample_ids(target.database_url, target.keys["owners"][0][0], 200)
    admin = {"Authorization": f"Bearer {target.keys['admin'][1]}"}
    second = {"Authorization": f"Bearer {target.keys['owners'][1][1]}"}
    return {
        "GET /metrics (admin)": ("GET", ["/metrics"], None, admin),
        "GET /metrics (own key)": ("GET", ["/metrics"], None, None),
        "GET /jobs?limit=50": ("GET", ["/jobs?limit=50"], None, None),
        "GET /jobs?status=failed&limit=20": ("GET", ["/jobs?status=failed&limit=20"], None, None),
        "GET /jobs/{id}": ("GET", [f"/jobs/{i}" for i in ids], None, None),
        "GET /jobs/{id}/metrics": ("GET", [f"/jobs/{i}/metrics" for i in ids], None, None),
        "POST /jobs": ("POST", ["/jobs"], POST_SPEC, second),
    }


def measure_endpoints(targets: list[Target], redis_url: str, config: ScaleConfig) -> list[dict]:
    """Each endpoint's timings on each target (see ENDPOINTS): `config.warmup` requests of each,
    then ROUNDS rounds of `config.requests` / ROUNDS each, the endpoints in turn, and the targets
    taking turns request by request (which goes first alternating), so whatever else the machine
    does falls on all of them alike. p50 and p99 over every timed request (p99: what the target is
    judged on), and each round's p99. The POSTed jobs are deleted after, with their broker messages."""
    import redis
    from sqlalchemy import create_engine, text

    plans = [_plan(target) for target in targets]
    per_round = max(1, config.requests // ROUNDS)
    rounds: list[dict[str, list[list[float]]]] = [{name: [] for name in ENDPOINTS} for _ in targets]
    statuses: list[dict[str, dict[str, int]]] = [{name: {} for name in ENDPOINTS} for _ in targets]
    created: list[list[str]] = [[] for _ in targets]
    clients = [httpx.Client(base_url=target.url, timeout=60,
                            headers={"Authorization": f"Bearer {target.keys['owners'][0][1]}"}) for target in targets]
    order = list(range(len(targets)))
    try:
        for index, plan in enumerate(plans):
            for method, paths, body, headers in plan.values():
                created[index] += timed(clients[index], method, paths, config.warmup, body, headers)[2]
        for _ in range(ROUNDS):
            for name in ENDPOINTS:
                for index in order:
                    rounds[index][name].append([])
                for i in range(per_round):
                    for index in order if i % 2 == 0 else order[::-1]:
                        method, paths, body, headers = plans[index][name]
                        latencies, codes, new = timed(clients[index], method, [paths[i % len(paths)]], 1, body,
                                                      headers)
                        rounds[index][name][-1] += latencies
                        created[index] += new
                        for code, count in codes.items():
                            statuses[index][name][code] = statuses[index][name].get(code, 0) + count
    finally:
        for client in clients:
            client.close()
    for target, ids in zip(targets, created):
        engine = create_engine(target.database_url)
        try:
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": ids})
        finally:
            engine.dispose()
    redis.Redis.from_url(redis_url).delete(POST_QUEUE)
    results = []
    for index in order:
        out = {}
        for name, by_round in rounds[index].items():
            every = [latency for latencies in by_round for latency in latencies]
            round_p99 = [percentile(latencies, 0.99) for latencies in by_round]
            out[name] = {"requests": len(every), "p50_ms": percentile(every, 0.5), "p99_ms": percentile(every, 0.99),
                         "p99_best_round_ms": min(round_p99), "p99_by_round_ms": round_p99, "max_ms": max(every),
                         "statuses": statuses[index][name]}
        out["POST /jobs"]["created_and_deleted"] = len(created[index])
        results.append(out)
    return results


def reference_url(database_url: str) -> str:
    """The reference database beside the grown one: its name with `_ref`."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    return url.set(database=f"{url.database}_ref").render_as_string(hide_password=False)


# --- the streams --------------------------------------------------------------------------------


def transactions(database_url: str) -> int:
    """xact_commit + xact_rollback of the database (read from another database of the server, so
    the reading is not counted)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    with psycopg.connect(_psycopg_url(url.set(database="postgres").render_as_string(hide_password=False)),
                         autocommit=True) as connection:
        return connection.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                                  (url.database,)).fetchone()[0]


def per_second(database_url: str, window_s: float) -> dict:
    """The database's transactions per second over `window_s` (backends report their counts
    within a second of going idle, so the window starts and ends after a settling second)."""
    time.sleep(1.2)
    first, start = transactions(database_url), time.monotonic()
    time.sleep(window_s)
    time.sleep(1.2)
    last = transactions(database_url)
    elapsed = time.monotonic() - start - 1.2
    return {"window_s": elapsed, "transactions": last - first, "per_s": (last - first) / elapsed}


def _insert_jobs(database_url: str, owner_id: str, n: int, status: str) -> list[str]:
    """`n` jobs of the key in `status` (queued, or running as attempt 1 of STREAM_EPOCHS epochs),
    with the tally triggers on."""
    from sqlalchemy import insert
    from sqlalchemy.orm import Session

    from app.db import make_engine
    from app.models import Job, utcnow

    now = utcnow()
    ids = [str(uuid.uuid4()) for _ in range(n)]
    running = status == "running"
    spec = {**POST_SPEC, "hardware": "cpu", "epochs": STREAM_EPOCHS if running else 1}
    rows = [{"id": i, "owner_id": owner_id, "status": status, "framework": "jax", "hardware": "cpu", "devices": 1,
             "spec": spec, "epochs": spec["epochs"], "epoch": 0, "created_at": now, "attempts": 1 if running else 0,
             "started_at": now if running else None, "enqueued_at": now, "priority": 1, "preempted": 0,
             "cancel_requested": False, "worker": {"name": "bench-scale:0:0", "hardware": "cpu"} if running else None}
            for i in ids]
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            session.execute(insert(Job), rows)
            session.commit()
    finally:
        engine.dispose()
    return ids


def store_epochs(database_url: str, job_id: str, epochs: int, interval_s: float) -> dict[int, float]:
    """Store epochs 1..`epochs` of the running job as a worker does (its EpochMetric row and
    lifecycle.record_epoch, which commits both), `interval_s` apart (+-50%, so the stores fall at
    every phase of whatever the streams do); {epoch: time.time() when its commit returned}."""
    from sqlalchemy.orm import Session

    from app import lifecycle
    from app.db import make_engine
    from app.models import EpochMetric

    rng = random.Random(1)
    stored_at = {}
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            for epoch in range(1, epochs + 1):
                time.sleep(interval_s * rng.uniform(0.5, 1.5))
                session.add(EpochMetric(job_id=job_id, epoch=epoch, train_loss=1.0 / epoch, train_accuracy=0.9,
                                        test_loss=1.0 / epoch, test_accuracy=0.9, epoch_time_s=0.3, eval_time_s=0.05,
                                        samples_per_s=2e5, learning_rate=1e-3))
                assert lifecycle.record_epoch(session, job_id, 1, epoch)
                stored_at[epoch] = time.time()
            lifecycle.finish(session, job_id, 1, lifecycle.JobStatus.SUCCEEDED, result={"test_accuracy": 0.9})
    finally:
        engine.dispose()
    return stored_at


def measure_streams(url: str, keys: dict, database_url: str, config: ScaleConfig) -> dict:
    """Transactions per second with no stream open, then with `config.streams` open and idle on
    queued jobs; then the epoch-to-event delay on a running job while they stay open."""
    from sqlalchemy import create_engine, text

    from bench.loops import RESULT_PREFIX

    owner_id, secret = keys["owners"][0]
    queued = _insert_jobs(database_url, owner_id, config.streams, "queued")
    (running,) = _insert_jobs(database_url, owner_id, 1, "running")
    vacuum(database_url)  # what the POSTs left: autovacuum would come in the middle of a window
    log(f"streams: transactions/s with none open ({config.window_s:g} s)")
    none_open = per_second(database_url, config.window_s)
    out: dict = {"streams": config.streams, "none_open": none_open}
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write("\n".join(queued))
        ids_file = f.name
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.streams", "--url", url, "--key", secret, "--ids-file", ids_file,
         "--watch", running], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = json.loads(child.stdout.readline().removeprefix("READY "))  # every stream has its first event
        out["opened"] = ready
        log(f"streams: {ready['open']} open ({ready['open_s']:.1f} s to open them all); transactions/s idle "
            f"({config.window_s:g} s)")
        time.sleep(config.settle_s)  # the opening burst's counts land first
        out["open_idle"] = per_second(database_url, config.window_s)
        log(f"streams: {config.stream_epochs} epochs stored on a running job, ~{config.epoch_interval_s:g} s apart")
        stored_at = store_epochs(database_url, running, config.stream_epochs, config.epoch_interval_s)
        child.stdin.write("stop\n")
        child.stdin.flush()
        result = None
        for line in child.stdout:
            if line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX):])
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        Path(ids_file).unlink(missing_ok=True)
        engine = create_engine(database_url)
        try:
            with engine.begin() as connection:  # the triggers take them off the tallies
                connection.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": [*queued, running]})
        finally:
            engine.dispose()
    if result is None:
        raise RuntimeError("bench.streams gave no result")
    arrived = {int(epoch): at for epoch, at in result.pop("metrics_arrived").items()}
    delays = [(arrived[epoch] - at) * 1000 for epoch, at in stored_at.items() if epoch in arrived]
    out["client"] = result
    out["epoch_to_event"] = {"stored": len(stored_at), "received": len(delays),
                             "p50_ms": percentile(delays, 0.5), "p99_ms": percentile(delays, 0.99),
                             "max_ms": max(delays) if delays else None}
    return out


# --- the run ------------------------------------------------------------------------------------


def measure(database_url: str, redis_url: str, root: Path, config: ScaleConfig) -> dict:
    """The whole scale row (the module docstring); a dict for results.json."""
    from bench.service import Service, ensure_database

    if not database_url.startswith("postgresql"):
        return {"skipped": f"the scale row bulk-loads PostgreSQL; {database_url.split(':')[0]} is not"}
    ref_url = reference_url(database_url)
    for url in (database_url, ref_url):
        if ensure_database(url):
            log(f"created the database {url}")
    keys, ref_keys = reset(database_url), reset(ref_url)
    owners = [owner_id for owner_id, _ in keys["owners"]]
    service = Service(database_url, redis_url, root / "grown", api_workers=config.api_workers, with_worker=False)
    reference = Service(ref_url, redis_url, root / "reference", api_workers=config.api_workers, with_worker=False)
    out: dict = {"config": {**config.__dict__, "sizes": list(config.sizes)}, "reference_database_url": ref_url,
                 "sizes": []}
    have = 0
    try:
        log(f"scale: the reference database, {config.sizes[0]:,} jobs ({EPOCHS_PER_JOB} epochs each)")
        out["reference_growth"] = grow(ref_url, [owner_id for owner_id, _ in ref_keys["owners"]], 0, config.sizes[0])
        reference.start()
        for index, size in enumerate(config.sizes):
            log(f"scale: growing to {size:,} jobs ({EPOCHS_PER_JOB} epochs each)")
            growth = grow(database_url, owners, have, size)
            have = size
            if index == 0:
                service.start()
            log(f"scale: {size:,} jobs stored in {growth['total_s']:.0f} s; timing the endpoints, and the "
                f"{config.sizes[0]:,}-job reference alongside")
            grown, alongside = measure_endpoints(
                [Target(service.url, database_url, keys), Target(reference.url, ref_url, ref_keys)], redis_url, config)
            row = {"jobs": size, "growth": growth, "stored": stored(database_url), "endpoints": grown,
                   "reference": alongside}
            out["sizes"].append(row)
            for name, timing in row["endpoints"].items():
                log(f"  {name}: p50 {timing['p50_ms']:.1f} ms, p99 {timing['p99_ms']:.1f} ms (the reference's: "
                    f"{alongside[name]['p50_ms']:.1f}, {alongside[name]['p99_ms']:.1f} ms)")
        reference.stop()
        if config.streams:
            try:
                out["streams"] = measure_streams(service.url, keys, database_url, config)
            except Exception as exc:  # the endpoint timings measured before it still stand
                out["streams_error"] = f"{type(exc).__name__}: {exc}"
                log(f"streams failed: {out['streams_error']}")
    finally:
        reference.stop()
        service.stop()
    return out
