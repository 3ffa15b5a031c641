"""POST /sweeps refuses what cannot run (naming the field), creates the first trials as jobs,
and a sweep is another key's 404; trials run here through workers/runner.py on real PostgreSQL
and Redis (the full stack with real workers is tests/e2e/test_sweeps.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import create_engine, make_url, text

BASE = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}
SPACE = {"optimizer.learning_rate": {"log_uniform": [1e-3, 1e-1]}, "batch_size": {"choice": [32, 64]}}


@pytest.fixture(autouse=True)
def no_waiting_jobs(services_env):
    """Only this test's jobs wait (a worker here takes the next job of its queue)."""
    from app.db import session_scope

    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.execute(text("UPDATE sweeps SET status = 'cancelled' WHERE status = 'running'"))
        session.commit()


def sweep_body(**changes) -> dict:
    return {"base": BASE, "space": SPACE, "max_trials": 4, "parallelism": 2, **changes}


def where(response) -> list[tuple]:
    assert response.status_code == 422, response.text
    return [tuple(error["loc"]) for error in response.json()["detail"]]


@pytest.mark.parametrize(
    "changes,loc,says",
    [
        ({"space": {}}, ("body",), "space is empty"),
        ({"space": {"optimizer.lr": {"uniform": [0.1, 0.2]}}}, ("body", "space", "optimizer.lr"),
         "did you mean 'optimizer.learning_rate'"),
        ({"space": {"optimizer.learning_rate": {"uniform": [0.0, 0.1]}}},
         ("body", "space", "optimizer.learning_rate"), "value 0.0"),
        ({"space": {"batch_size": {"choice": [32, 100000]}}}, ("body", "space", "batch_size"), "100000"),
        ({"space": {"batch_size": {"uniform": [32, 64]}}}, ("body", "space", "batch_size"), "integer"),
        ({"space": {"epochs": {"int_uniform": [1, 5000]}}}, ("body", "space", "epochs"), "5000"),
        ({"space": {"framework": {"choice": ["jax", "pytorch"]}}}, ("body", "space", "framework"), "frameworks"),
        ({"space": {"batch_size": {"uniform": [1, 2], "choice": [1]}}}, ("body", "space", "batch_size"), "exactly one"),
        ({"space": {"optimizer.learning_rate": {"log_uniform": [0, 0.1]}}},
         ("body", "space", "optimizer.learning_rate"), "low > 0"),
        ({"method": "grid", "space": {"batch_size": {"grid": [16, 32, 64]}}, "max_trials": 2},
         ("body", "max_trials"), "3 points"),
        ({"method": "grid"}, ("body", "space", "optimizer.learning_rate"), "not a range"),
        ({"objective": {"metric": "test_rmse", "direction": "min"}}, ("body", "objective", "metric"),
         "not recorded for a classification"),
        ({"objective": {"metric": "epoch_time_s"}}, ("body", "objective", "metric"), ""),
        ({"early_stopping": {"method": "asha", "min_epochs": 2}}, ("body", "early_stopping", "min_epochs"),
         "not below"),
        ({"base": {**BASE, "epochs": 0}}, ("body", "base", "epochs"), ""),
    ],
)
def test_a_sweep_that_cannot_run_is_422_naming_the_field_and_creates_nothing(api, auth, changes, loc, says):
    response = api.post("/sweeps", json=sweep_body(**changes), headers=auth)
    assert loc in where(response)
    assert says in response.text
    assert api.get("/sweeps", headers=auth).json()["items"] == []
    assert api.get("/jobs", headers=auth).json()["items"] == []


def test_a_sweep_queues_its_first_trials_as_jobs_and_is_invisible_to_other_keys(api, auth, make_key):
    created = api.post("/sweeps", json=sweep_body(name="lr and batch"), headers=auth)
    assert created.status_code == 201, created.text
    sweep = created.json()
    assert created.headers["Location"] == f"/sweeps/{sweep['id']}"
    assert sweep["status"] == "running" and sweep["trials"]["queued"] == 2
    assert sweep["budget"] == {"trials": 2, "max_trials": 4, "train_s": 0.0, "max_total_s": None}
    trials = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"]
    assert [t["number"] for t in trials] == [0, 1]
    for t in trials:
        job = api.get(f"/jobs/{t['job_id']}", headers=auth).json()
        assert job["sweep"] == {"id": sweep["id"], "trial": t["number"], "params": t["params"]}
        assert job["spec"]["batch_size"] == t["params"]["batch_size"] in (32, 64)
        assert job["spec"]["optimizer"]["learning_rate"] == t["params"]["optimizer.learning_rate"]
        assert 1e-3 <= t["params"]["optimizer.learning_rate"] <= 1e-1
        assert job["spec"]["name"] == f"lr and batch trial {t['number']}"
    assert api.get(f"/sweeps/{sweep['id'][:8]}", headers=auth).json()["id"] == sweep["id"]  # short ids too

    other = {"Authorization": f"Bearer {make_key('other')}"}
    for path in (f"/sweeps/{sweep['id']}", f"/sweeps/{sweep['id']}/trials"):
        assert api.get(path, headers=other).status_code == 404
    assert api.post(f"/sweeps/{sweep['id']}/cancel", headers=other).status_code == 404
    assert api.get("/sweeps", headers=other).json()["items"] == []

    cancelled = api.post(f"/sweeps/{sweep['id']}/cancel", headers=auth)
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["trials"]["cancelled"] == 2
    from app.sweeps import study

    assert {t.state.name for t in study.trials(sweep["id"])} == {"FAIL"}  # the study agrees with the jobs


def test_the_sweeps_list_comes_in_pages_newest_first(api, auth):
    made = [api.post("/sweeps", json=sweep_body(name=f"s{i}", parallelism=1), headers=auth).json()["id"] for i in range(3)]

    first = api.get("/sweeps", params={"limit": 2}, headers=auth).json()
    second = api.get("/sweeps", params={"limit": 2, "cursor": first["next_cursor"]}, headers=auth).json()
    assert [s["id"] for s in first["items"] + second["items"]] == made[::-1]
    assert second["next_cursor"] is None
    assert api.get("/sweeps", params={"cursor": "bm9wZQ=="}, headers=auth).status_code == 422

    from fastapi.testclient import TestClient

    from app.client import TrainhubClient

    client = TrainhubClient("http://testserver", None)
    client.http = TestClient(api.app, headers=auth)  # the CLI's client, on this app
    assert [s["id"] for s in client._every("/sweeps", most=3, page_size=2)] == made[::-1]  # two pages
    assert [s["id"] for s in client._every("/sweeps", most=2, page_size=2)] == made[:0:-1]  # no more than asked
    assert [s["id"] for s in client.sweeps(limit=20)] == made[::-1]


def test_a_sweep_needs_room_in_the_keys_queue_for_its_first_trials(api, auth, monkeypatch):
    from app.config import get_settings

    monkeypatch.setenv("TRAINHUB_MAX_QUEUED_JOBS_PER_KEY", "1")
    get_settings.cache_clear()
    response = api.post("/sweeps", json=sweep_body(), headers=auth)
    assert response.status_code == 429 and "lower parallelism" in response.json()["detail"]
    assert api.get("/sweeps", headers=auth).json()["items"] == []


def test_sweeps_created_at_once_queue_no_more_trials_than_the_keys_limit(api, auth, monkeypatch):
    from app.config import get_settings
    from app.sweeps import study

    monkeypatch.setenv("TRAINHUB_MAX_QUEUED_JOBS_PER_KEY", "5")
    get_settings.cache_clear()
    study.get_storage()  # Optuna's tables exist (the test below races their creation)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: api.post("/sweeps", json=sweep_body(), headers=auth), range(8)))
    assert {a.status_code for a in answers} <= {201, 429}, [a.text for a in answers]
    queued = [j for j in api.get("/jobs?limit=100", headers=auth).json()["items"] if j["status"] == "queued"]
    assert 2 <= len(queued) <= 5
    created = [a.json()["id"] for a in answers if a.status_code == 201]
    assert sum(len(api.get(f"/sweeps/{s}/trials", headers=auth).json()["items"]) for s in created) == len(queued)


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_database(request, database_url, tmp_path, monkeypatch):
    """A migrated database with no Optuna tables yet (as on a new install), set as the service's."""
    from app.db import migrate
    from tests.conftest import reset_caches

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        url = make_url(database_url).set(database="trainhub_fresh_sweeps").render_as_string(hide_password=False)
        server = create_engine(database_url, isolation_level="AUTOCOMMIT")
        with server.connect() as connection:
            connection.execute(text("DROP DATABASE IF EXISTS trainhub_fresh_sweeps WITH (FORCE)"))
            connection.execute(text("CREATE DATABASE trainhub_fresh_sweeps"))
    migrate(url)
    monkeypatch.setenv("TRAINHUB_DATABASE_URL", url)
    reset_caches()
    yield url
    reset_caches()
    if request.param == "postgresql":
        with server.connect() as connection:
            connection.execute(text("DROP DATABASE trainhub_fresh_sweeps WITH (FORCE)"))
        server.dispose()


def test_processes_opening_a_new_databases_studies_at_once_all_succeed(fresh_database):
    """Each API process and worker opens the study storage on its first sweep; on a new install
    those first calls can come at once, and Optuna would create its tables twice."""
    from app.sweeps import study
    from app.sweeps.spec import SweepSpec

    with ThreadPoolExecutor(8) as pool:  # each call as a new process makes it (get_storage caches)
        storages = list(pool.map(lambda _: study.get_storage.__wrapped__(), range(8)))
    spec = SweepSpec.model_validate({**sweep_body(), "base": BASE})
    study.create("a-first-sweep", spec)
    assert all(s.get_study_id_from_name("a-first-sweep") for s in storages)
    for storage in storages:
        storage.engine.dispose()


def test_trials_run_to_a_best_trial_and_the_sweep_ends_with_none_running(api, auth):
    """A small grid run by one worker here (runner.run: claim, train, record, end): every trial
    ends, the best is the maximum of the completed ones, and the study agrees with the jobs."""
    from workers import runner

    worker = {"name": "test:sweep", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}
    body = sweep_body(method="grid", space={"optimizer.learning_rate": {"grid": [0.003, 0.03, 0.3]}},
                      max_trials=3, parallelism=1, base={**BASE, "epochs": 1})
    sweep = api.post("/sweeps", json=body, headers=auth).json()
    for _ in range(3):
        trial = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"][-1]
        assert runner.run(trial["job_id"], worker, serves=["cpu.jax"]) == "succeeded"
    done = api.get(f"/sweeps/{sweep['id']}", headers=auth).json()
    trials = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"]
    assert done["status"] == "succeeded" and done["trials"]["succeeded"] == 3 and done["finished_at"], (done, trials)
    assert sorted(t["params"]["optimizer.learning_rate"] for t in trials) == [0.003, 0.03, 0.3]
    assert done["best"]["objective"] == max(t["objective"] for t in trials)
    best_job = api.get(f"/jobs/{done['best']['job_id']}", headers=auth).json()
    assert done["best_spec"] == best_job["spec"]
    assert done["best_spec"]["optimizer"]["learning_rate"] == done["best"]["params"]["optimizer.learning_rate"]
    assert done["budget"]["train_s"] > 0
    from app.sweeps import study

    values = {t.number: t.value for t in study.trials(sweep["id"])}
    assert values == {t["number"]: t["objective"] for t in trials}

    # The finished sweep's story over HTTP: each trial's start, epoch and end, then the sweep.
    response = api.get(f"/sweeps/{sweep['id']}/events", headers=auth)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    story = parse_events(response.text)
    assert [(e, d.get("trial")) for e, d in story] == [
        *[(kind, n) for n in range(3) for kind in ("trial_start", "trial_epoch", "trial_end")], ("sweep", None)]
    ends = [d for e, d in story if e == "trial_end"]
    assert [d["objective"] for d in ends] == [t["objective"] for t in trials]
    assert story[-1][1]["status"] == "succeeded" and story[-1][1]["best"] == done["best"]
    assert api.get(f"/sweeps/{sweep['id']}/events", headers={"Authorization": "Bearer th_nobody"}).status_code == 401


def parse_events(text: str) -> list[tuple[str, dict]]:
    import json

    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


def test_live_changes_are_each_trials_start_new_epochs_and_end_once():
    from app.sweeps.events import TrialView, changes

    def view(status, objectives, number=0):
        return TrialView(number, status, {"batch_size": 32}, {"jax": "j"}, tuple(objectives), None, None)

    queued = {0: view("queued", [])}
    assert changes({}, [view("queued", [])]) == []
    running = [view("running", [0.5])]
    assert [e.event for e in changes(queued, running)] == ["trial_start", "trial_epoch"]
    later = [view("running", [0.5, 0.6, 0.7])]
    assert [(e.event, e.data["epoch"]) for e in changes({0: running[0]}, later)] == [("trial_epoch", 2),
                                                                                     ("trial_epoch", 3)]
    ended = [view("pruned", [0.5, 0.6, 0.7])]
    assert [e.event for e in changes({0: later[0]}, ended)] == ["trial_end"]
    assert changes({0: ended[0]}, ended) == []


def test_a_sweep_in_both_frameworks_runs_each_trial_as_a_comparison_judged_by_the_mean(api, auth):
    from workers import runner

    worker = {"name": "test:sweep2", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}
    body = sweep_body(method="grid", space={"optimizer.learning_rate": {"grid": [0.003, 0.03]}}, max_trials=2,
                      parallelism=1, frameworks=["jax", "pytorch"], base={**BASE, "epochs": 1})
    body["base"] = {k: v for k, v in body["base"].items() if k != "framework"}
    created = api.post("/sweeps", json=body, headers=auth)
    assert created.status_code == 201, created.text
    sweep = created.json()
    for _ in range(2):
        trial = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"][-1]
        assert sorted(trial["jobs"]) == ["jax", "pytorch"] and trial["comparison_id"]
        for framework, job_id in trial["jobs"].items():
            assert runner.run(job_id, worker, serves=[f"cpu.{framework}"]) == "succeeded"
    done = api.get(f"/sweeps/{sweep['id']}", headers=auth).json()
    trials = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"]
    assert done["status"] == "succeeded" and done["trials"] == {**done["trials"], "succeeded": 2}
    for trial in trials:
        jobs = {fw: api.get(f"/jobs/{job_id}", headers=auth).json() for fw, job_id in trial["jobs"].items()}
        accuracy = [job["metrics"][-1]["test_accuracy"] for job in jobs.values()]
        assert trial["objective"] == pytest.approx(sum(accuracy) / 2)
        assert {job["spec"]["optimizer"]["learning_rate"] for job in jobs.values()} == {
            trial["params"]["optimizer.learning_rate"]}
        comparison = api.get(f"/comparisons/{trial['comparison_id']}", headers=auth).json()
        assert comparison["jobs"]["jax"]["id"] == trial["jobs"]["jax"]
        assert comparison["status"] == "succeeded" and comparison["parity"]["passed"]
    assert done["best"]["objective"] == max(t["objective"] for t in trials)


def test_no_trial_starts_once_max_total_s_of_train_time_is_spent(api, auth):
    from workers import runner

    worker = {"name": "test:budget", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}
    body = sweep_body(max_trials=5, parallelism=1, max_total_s=0.001, base={**BASE, "epochs": 1})
    sweep = api.post("/sweeps", json=body, headers=auth).json()
    (trial,) = api.get(f"/sweeps/{sweep['id']}/trials", headers=auth).json()["items"]
    assert runner.run(trial["job_id"], worker, serves=["cpu.jax"]) == "succeeded"
    done = api.get(f"/sweeps/{sweep['id']}", headers=auth).json()
    assert done["status"] == "succeeded" and done["budget"]["trials"] == 1
    assert done["budget"]["train_s"] >= done["budget"]["max_total_s"]
