"""The API under load: POST /jobs as fast as it goes, then GET /jobs/{id} at a steady rate.

The load comes from a second process (`python -m bench.load`). The jobs it creates ask for
hardware "tpu" (queue `tpu.jax`), which no bench worker consumes, so afterwards every message
is still in Redis and can be counted: each accepted job must be stored once in PostgreSQL and
queued once in Redis. The bench then deletes those rows and messages, so later runs start
from the same state.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections import Counter

from bench.procs import die_with_parent

LOAD_SPEC = {"framework": "jax", "hardware": "tpu", "dataset": {"name": "digits"}, "epochs": 1,
             "labels": {"bench": "api-load"}}
LOAD_QUEUE = "tpu.jax"


def run_load(args: list[str], timeout_s: float) -> dict:
    """Run `python -m bench.load ARGS` and return its result."""
    from bench.loops import RESULT_PREFIX

    try:
        out = subprocess.run([sys.executable, "-m", "bench.load", *args], capture_output=True, text=True,
                             timeout=timeout_s, preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:  # its message would repeat the command line, every id in it
        raise RuntimeError(f"bench.load {args[0]} did not finish within {timeout_s:g} s") from None
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise RuntimeError(f"bench.load {args[0]} gave no result (exit {out.returncode}): {out.stderr[-2000:]}")


def queued_job_ids(redis_url: str, queue: str = LOAD_QUEUE) -> tuple[list[str], list[bytes]]:
    """The job ids of the Celery messages waiting in `queue`, in order, and the raw messages."""
    import redis

    raw = redis.Redis.from_url(redis_url).lrange(queue, 0, -1)
    ids = []
    for message in raw:
        envelope = json.loads(message)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]  # Celery protocol 2: [args, kwargs, embed]
        ids.append(args[0])
    return ids, raw


def owner_id(database_url: str, secret: str) -> str:
    from sqlalchemy import create_engine, text

    from app.keys import hash_key

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT id FROM api_keys WHERE key_hash = :h"),
                                      {"h": hash_key(secret)}).scalar_one()
    finally:
        engine.dispose()


def stored_job_ids(database_url: str, owner: str) -> list[str]:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(
                text("SELECT id FROM jobs WHERE owner_id = :o AND hardware = 'tpu'"), {"o": owner}).scalars())
    finally:
        engine.dispose()


def cleanup(database_url: str, redis_url: str, owner: str, raw_messages: list[bytes]) -> None:
    """Delete the load's jobs (rows of `owner` on tpu) and their messages."""
    import redis
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM jobs WHERE owner_id = :o AND hardware = 'tpu'"), {"o": owner})
    finally:
        engine.dispose()
    vacuum_jobs(database_url)
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline()
    for message in raw_messages:
        pipe.lrem(LOAD_QUEUE, 1, message)
    pipe.execute()


def vacuum_jobs(database_url: str) -> None:
    """VACUUM ANALYZE the jobs table: the index entries of deleted rows are gone and the planner's
    statistics are fresh, so each run starts from the same state whatever the ones before left."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")  # VACUUM runs outside a transaction
    try:
        with engine.connect() as connection:
            connection.execute(text("VACUUM ANALYZE jobs"))
    finally:
        engine.dispose()


def measure_get(url: str, key: str, ids: list[str], get_s: float, get_rate: float) -> dict:
    """The GET load's result, or {"error"} when there is nothing to GET or the load failed (an API
    that stops answering): the POST figures measured before it still stand."""
    if not ids:
        return {"error": "no job was accepted, so there is nothing to GET"}
    try:
        return run_load(["get", "--url", url, "--key", key, "--duration", str(get_s), "--rate", str(get_rate),
                         "--ids", ",".join(ids)], timeout_s=get_s + 120)
    except RuntimeError as exc:
        return {"error": str(exc)}


def measure(url: str, key: str, database_url: str, redis_url: str, post_s: float, get_s: float,
            get_rate: float, concurrency: int) -> dict:
    """Both loads, the exactly-once check, and the cleanup; a dict for results.json."""
    owner = owner_id(database_url, key)
    if stored_job_ids(database_url, owner) or queued_job_ids(redis_url)[0]:
        raise RuntimeError(f"{LOAD_QUEUE} or the bench key's tpu jobs are not empty before the load")
    vacuum_jobs(database_url)  # what earlier runs (or the trainer jobs before) left behind
    post = run_load(["post", "--url", url, "--key", key, "--duration", str(post_s),
                     "--concurrency", str(concurrency), "--spec", json.dumps(LOAD_SPEC)], timeout_s=post_s + 120)
    accepted = post.pop("ids")
    stored = stored_job_ids(database_url, owner)
    queued, raw = queued_job_ids(redis_url)
    accepted_set = set(accepted)
    queued_counts = Counter(queued)
    integrity = {
        "accepted": len(accepted),
        "accepted_unique": len(accepted_set),
        "stored": len(stored),
        "stored_unique": len(set(stored)),
        "queued_messages": len(queued),
        "missing_from_db": len(accepted_set - set(stored)),
        "stored_not_accepted": len(set(stored) - accepted_set),
        "missing_from_queue": len(accepted_set - set(queued)),
        "queued_more_than_once": sum(1 for count in queued_counts.values() if count > 1),
        "queued_not_accepted": len(set(queued) - accepted_set),
    }
    integrity["exactly_once"] = (
        len(accepted) == len(accepted_set) == len(stored) == len(set(stored)) == len(queued)
        and accepted_set == set(stored) == set(queued)
    )
    try:
        get = measure_get(url, key, accepted[:200], get_s, get_rate)
    finally:
        cleanup(database_url, redis_url, owner, raw)
    return {"post": post, "integrity": integrity, "get": get}
