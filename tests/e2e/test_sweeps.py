"""Sweeps through the real stack (uvicorn, `trainhub worker` processes, PostgreSQL, Redis): trials
pruned by ASHA, the best trial, and no trial lost or run twice across an API restart and a
worker killed mid-trial (the Optuna study and the jobs agree afterwards)."""

from __future__ import annotations

import signal
import subprocess

import optuna
import pytest

from app.sweeps.study import storage_url
from tests.e2e.conftest import running_service, wait_for

FAST_RECOVERY = {"heartbeat_s": "0.5", "worker_timeout_s": "3"}
STATE_OF = {"succeeded": "COMPLETE", "pruned": "PRUNED", "failed": "FAIL", "cancelled": "FAIL"}


@pytest.fixture(scope="module")
def stack(database_url, redis_url, tmp_path_factory):
    """The API and two cpu workers, with quick worker-loss detection."""
    with running_service(database_url, redis_url, tmp_path_factory.mktemp("sweeps"), workers=2,
                         **FAST_RECOVERY) as svc:
        svc.admin_key = svc.new_key("ops", admin=True)
        yield svc


def study_of(database_url: str, sweep_id: str) -> optuna.Study:
    url, engine_kwargs = storage_url(database_url)
    return optuna.load_study(study_name=sweep_id, storage=optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs))


def assert_study_agrees_with_jobs(database_url: str, client, sweep: dict) -> list[dict]:
    """Every trial has exactly one job, each ended, and the study holds each job's outcome."""
    trials = client.trials(sweep["id"])
    numbers = [t["number"] for t in trials]
    assert numbers == list(range(len(trials)))  # none lost, none twice
    assert len({t["job_id"] for t in trials}) == len(trials)
    frozen = {t.number: t for t in study_of(database_url, sweep["id"]).get_trials()}
    assert sorted(frozen) == numbers
    for trial in trials:
        job = client.get(trial["job_id"])
        assert job["status"] in STATE_OF, job["status"]  # ended: none queued or running
        assert frozen[trial["number"]].state.name == STATE_OF[job["status"]]
        assert frozen[trial["number"]].params == trial["params"] == job["sweep"]["params"]
        if job["status"] == "succeeded":
            assert frozen[trial["number"]].value == trial["objective"] == job["metrics"][-1]["test_accuracy"]
    return trials


def test_an_asha_sweep_of_eight_trials_prunes_losers_and_ends_on_the_best(stack, database_url):
    base = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 4}
    spec = {
        "base": base,
        "space": {"optimizer.learning_rate": {"log_uniform": [1e-5, 0.3]}, "batch_size": {"choice": [32, 64, 128]}},
        "objective": {"metric": "test_accuracy", "direction": "max"},
        # One trial at a time: which trials ASHA stops then depends on the seeds alone, not on
        # which of two parallel trials reaches an epoch first.
        "method": "random", "max_trials": 8, "parallelism": 1, "seed": 1,
        "early_stopping": {"method": "asha", "min_epochs": 1, "reduction_factor": 2},
    }
    with stack.client() as client:
        sweep = client.sweep(spec)
        done = client.wait_sweep(sweep["id"], timeout_s=600)
        trials = assert_study_agrees_with_jobs(database_url, client, done)
        jobs = [client.get(t["job_id"]) for t in trials]
    assert done["status"] == "succeeded" and len(trials) == 8
    assert done["trials"]["pruned"] >= 1 and done["trials"]["queued"] == done["trials"]["running"] == 0
    finished = [t for t in trials if t["status"] == "succeeded"]
    assert done["best"]["objective"] == max(t["objective"] for t in finished)
    assert done["best"]["params"] == next(t for t in finished if t["job_id"] == done["best"]["job_id"])["params"]
    for job in jobs:
        if job["status"] == "pruned":
            assert job["error"] is None and 1 <= job["pruned"]["epoch"] < 4
            assert len(job["metrics"]) == job["pruned"]["epoch"] and "asha" in job["pruned"]["reason"]
        else:
            assert job["status"] in ("succeeded", "failed") and job["pruned"] is None
    assert done["budget"]["train_s"] == pytest.approx(sum(m["epoch_time_s"] for j in jobs for m in j["metrics"]),
                                                      abs=0.01)


def restart_api(service) -> None:
    """Stop the API process (SIGTERM, as a deploy does) and start it again on the same port."""
    api = service.stack.processes[0]
    api.send_signal(signal.SIGTERM)
    api.wait(30)
    service.stack.processes[0] = subprocess.Popen(api.args, env=service.env)
    service.stack.wait_ready()


def test_an_api_restart_and_a_worker_killed_mid_trial_lose_no_trial_and_start_none_twice(stack, database_url):
    base = {"framework": "jax", "dataset": {"name": "fashion-mnist", "train_limit": 6000, "test_limit": 1000},
            "batch_size": 32, "epochs": 12}
    spec = {"base": base, "space": {"optimizer.learning_rate": {"log_uniform": [1e-4, 1e-2]}},
            "method": "tpe", "max_trials": 5, "parallelism": 2}
    with stack.client() as client, stack.client(stack.admin_key) as ops:  # only an admin key sees pids
        sweep = client.sweep(spec)

        def running_trial() -> dict | None:
            for trial in client.trials(sweep["id"]):
                job = ops.get(trial["job_id"])
                if job["status"] == "running" and 1 <= job["progress"]["epoch"] < 10:
                    return job
            return None

        victim_job = wait_for(running_trial, 120, "a trial past its first epoch")
        victim = next(p for p in stack.stack.processes[1:] if p.pid == victim_job["worker"]["pid"])
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        stack.stack.processes.remove(victim)
        restart_api(stack)
        stack.start_worker("--hardware", "cpu", "--devices", victim.args[victim.args.index("--devices") + 1])
        done = client.wait_sweep(sweep["id"], timeout_s=600)
        trials = assert_study_agrees_with_jobs(database_url, client, done)
        resumed = client.get(victim_job["id"])
    assert done["status"] == "succeeded" and len(trials) == 5
    assert [t["status"] for t in trials] == ["succeeded"] * 5
    assert resumed["attempts"] == 2 and [m["epoch"] for m in resumed["metrics"]] == list(range(1, 13))


def test_a_sweep_in_both_frameworks_prunes_a_trial_in_both_and_the_study_holds_the_means(stack, database_url):
    spec = {
        "base": {"dataset": {"name": "digits"}, "epochs": 3},
        "frameworks": ["jax", "pytorch"],
        "space": {"optimizer.learning_rate": {"log_uniform": [1e-5, 0.3]}},
        "method": "random", "max_trials": 5, "parallelism": 1, "seed": 1,  # (see the test above)
        "early_stopping": {"method": "asha", "min_epochs": 1, "reduction_factor": 2},
    }
    with stack.client() as client:
        done = client.wait_sweep(client.sweep(spec)["id"], timeout_s=600)
        trials = client.trials(done["id"])
        frozen = {t.number: t for t in study_of(database_url, done["id"]).get_trials()}
        for trial in trials:
            jobs = {fw: client.get(job_id) for fw, job_id in trial["jobs"].items()}
            assert sorted(jobs) == ["jax", "pytorch"] and trial["comparison_id"]
            statuses = {job["status"] for job in jobs.values()}
            assert frozen[trial["number"]].state.name == STATE_OF[trial["status"]]
            if trial["status"] == "succeeded":
                assert statuses == {"succeeded"}
                mean = sum(job["metrics"][-1]["test_accuracy"] for job in jobs.values()) / 2
                assert frozen[trial["number"]].value == pytest.approx(mean) == trial["objective"]
            elif trial["status"] == "pruned":  # stopped by the pruner, or because its pair was
                assert "pruned" in statuses and statuses <= {"pruned", "succeeded"}
                assert any("pair was pruned" in job["pruned"]["reason"] or "asha" in job["pruned"]["reason"]
                           for job in jobs.values() if job["pruned"])
    assert done["status"] == "succeeded" and len(trials) == 5
    assert done["trials"]["pruned"] >= 1
