"""The datasets API against real PostgreSQL (no worker): upload, dedupe, ownership, jobs that name
a dataset, delete, and every refusal leaving nothing stored."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes

from tests.conftest import reset_caches


def breast_cancer_csv() -> bytes:
    data = load_breast_cancer()
    header = ",".join(f"f{i}" for i in range(data.data.shape[1])) + ",label"
    lines = [header] + [",".join(repr(float(v)) for v in row) + f",{label}" for row, label in zip(data.data, data.target)]
    return ("\n".join(lines) + "\n").encode()


def diabetes_csv() -> bytes:
    data = load_diabetes()
    header = ",".join(data.feature_names) + ",target"
    lines = [header] + [",".join(repr(float(v)) for v in row) + f",{target}" for row, target in zip(data.data, data.target)]
    return ("\n".join(lines) + "\n").encode()


def unique_csv(rows: int = 60) -> bytes:
    """A small classification table no other test uploads (the database is shared); the last one
    made is `unique_csv.last`."""
    rng = np.random.default_rng()
    lines = ["a,b,label"] + [f"{rng.random()!r},{rng.random()!r},{i % 2}" for i in range(rows)]
    unique_csv.last = ("\n".join(lines) + "\n").encode()
    return unique_csv.last


def upload(api, auth, body: bytes, content_type: str = "text/csv", **params):
    return api.post("/datasets", content=body, headers={**auth, "Content-Type": content_type}, params=params)


def stored_files(services_env) -> list[Path]:
    """Every file the upload left anywhere: the spool folder and the artifact store's datasets."""
    roots = [Path(services_env["TRAINHUB_VAR_DIR"]) / "uploads", Path(services_env["TRAINHUB_ARTIFACT_DIR"]) / "datasets"]
    return [path for root in roots if root.exists() for path in root.rglob("*") if path.is_file()]


def dataset_rows() -> int:
    """Dataset rows of every key (the database is shared by the session's tests: compare counts)."""
    from sqlalchemy import func, select

    from app.db import session_scope
    from app.models import Dataset

    with session_scope() as session:
        return session.scalar(select(func.count()).select_from(Dataset))


def test_upload_records_the_dataset_and_dedupes(api, auth, services_env):
    before = dataset_rows()
    created = upload(api, auth, breast_cancer_csv(), name="breast cancer")
    assert created.status_code == 201, created.text
    dataset = created.json()
    assert created.headers["Location"] == f"/datasets/{dataset['id']}"
    assert dataset["id"].startswith("ds_") and dataset["built_in"] is False
    assert (dataset["name"], dataset["format"], dataset["task"]) == ("breast cancer", "csv", "classification")
    assert dataset["input_shape"] == [30] and dataset["num_classes"] == 2 and dataset["class_names"] == ["0", "1"]
    assert (dataset["train_size"], dataset["test_size"]) == (569, 0)
    assert len(dataset["sha256"]) == 64 and dataset["bytes"] > 569 * 30 * 4
    # The same content again: the same dataset, 200.
    again = upload(api, auth, breast_cancer_csv(), name="another name")
    assert again.status_code == 200 and again.json()["id"] == dataset["id"]
    assert dataset_rows() == before + 1
    assert [p.name for p in stored_files(services_env)] == [f"{dataset['sha256']}.safetensors"]
    listed = api.get("/datasets", headers=auth).json()["items"]
    assert [d["id"] for d in listed if not d["built_in"]] == [dataset["id"]]
    assert {d["name"] for d in listed if d["built_in"]} >= {"digits", "synthetic"}
    assert api.get(f"/datasets/{dataset['id']}", headers=auth).json() == dataset
    # As lists show it: ds_ and its first 8 hex digits.
    assert api.get(f"/datasets/{dataset['id'][:11]}", headers=auth).json()["id"] == dataset["id"]
    assert api.get(f"/datasets/{dataset['id'][:10]}", headers=auth).status_code == 404


def test_multipart_upload_with_form_fields(api, auth):
    response = api.post(
        "/datasets",
        files={"file": ("diabetes.csv", diabetes_csv(), "text/csv")},
        data={"label_column": "target", "task": "regression"},
        headers=auth,
    )
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert (dataset["name"], dataset["task"], dataset["num_classes"], dataset["input_shape"]) == (
        "diabetes", "regression", 0, [10])


def test_unknown_options_are_refused(api, auth):
    typo = upload(api, auth, breast_cancer_csv(), label_colum="label")
    assert typo.status_code == 422 and "label_colum" in typo.text
    form = api.post("/datasets", files={"file": ("t.csv", b"a,label\n1,0\n2,1\n", "text/csv")}, data={"tsk": "x"},
                    headers=auth)
    assert form.status_code == 422 and "tsk" in form.text
    bad_size = upload(api, auth, breast_cancer_csv(), image_size="big")
    assert bad_size.status_code == 422 and "image_size" in bad_size.text


def test_the_list_comes_in_pages_the_built_in_ones_first(api, make_key):
    auth = {"Authorization": f"Bearer {make_key('pages')}"}
    made = [upload(api, auth, unique_csv(), name=f"part {i}").json()["id"] for i in range(5)]

    first = api.get("/datasets", params={"limit": 2}, headers=auth).json()
    built_in = [d["name"] for d in first["items"] if d["built_in"]]
    assert {"digits", "synthetic"} <= set(built_in)
    ids = [d["id"] for d in first["items"] if not d["built_in"]]
    while first["next_cursor"]:
        first = api.get("/datasets", params={"limit": 2, "cursor": first["next_cursor"]}, headers=auth).json()
        assert not any(d["built_in"] for d in first["items"])  # on the first page only
        ids += [d["id"] for d in first["items"]]
    assert ids == made[::-1]  # newest first, each once
    assert [d["id"] for d in api.get("/datasets", headers=auth).json()["items"] if not d["built_in"]] == made[::-1]

    bad = api.get("/datasets", params={"cursor": "not-a-cursor"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "cursor"]
    assert "next_cursor" in bad.text
    assert api.get("/datasets", params={"limit": 0}, headers=auth).status_code == 422


def test_another_keys_dataset_is_not_found_anywhere(api, auth, make_key):
    dataset = upload(api, auth, breast_cancer_csv()).json()
    other = {"Authorization": f"Bearer {make_key('other')}"}
    missing = api.get("/datasets/ds_" + "0" * 32, headers=other)
    foreign = api.get(f"/datasets/{dataset['id']}", headers=other)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["detail"].replace(dataset["id"], "X") == missing.json()["detail"].replace("ds_" + "0" * 32, "X")
    assert api.delete(f"/datasets/{dataset['id']}", headers=other).status_code == 404
    assert all(d["built_in"] for d in api.get("/datasets", headers=other).json()["items"])
    job = api.post("/jobs", json={"framework": "jax", "dataset": {"id": dataset["id"], "validation_split": 0.2}},
                   headers=other)
    assert job.status_code == 422 and "not found" in job.text
    admin = {"Authorization": f"Bearer {make_key('admin', admin=True)}"}
    assert api.get(f"/datasets/{dataset['id']}", headers=admin).status_code == 200


def test_a_job_naming_a_dataset_gets_its_record(api, auth):
    dataset = upload(api, auth, breast_cancer_csv()).json()
    spec = {"framework": "pytorch", "dataset": {"id": dataset["id"]}, "batch_size": 32, "epochs": 2}
    no_test = api.post("/jobs", json=spec, headers=auth)
    assert no_test.status_code == 422 and "validation_split" in no_test.text
    spec["dataset"]["validation_split"] = 0.2
    job = api.post("/jobs", json=spec, headers=auth)
    assert job.status_code == 201, job.text
    stored = job.json()["spec"]["dataset"]
    assert stored["info"] == {"sha256": dataset["sha256"], "task": "classification", "input_shape": [30],
                              "num_classes": 2, "train_size": 569, "test_size": 0}
    assert stored["standardize"] is True and "name" not in stored or stored["name"] is None
    # The server fills info in: a request may not.
    forged = {**spec, "dataset": {**spec["dataset"], "info": stored["info"]}}
    assert api.post("/jobs", json=forged, headers=auth).status_code == 422
    # A cnn needs images; a batch larger than the training split is refused with its size.
    cnn = api.post("/jobs", json={**spec, "model": {"name": "cnn"}}, headers=auth)
    assert cnn.status_code == 422 and "model mlp" in cnn.text
    big = api.post("/jobs", json={**spec, "batch_size": 1000}, headers=auth)
    assert big.status_code == 422 and "456 examples" in big.text  # 569 less the 113 held out


def test_delete_waits_for_active_jobs_and_removes_the_data(api, auth, services_env, rows):
    before = dataset_rows()
    dataset = upload(api, auth, unique_csv()).json()
    spec = {"framework": "jax", "dataset": {"id": dataset["id"], "validation_split": 0.2}, "batch_size": 32}
    job = api.post("/jobs", json=spec, headers=auth).json()
    assert job["spec"]["dataset"]["id"] == dataset["id"]
    busy = api.delete(f"/datasets/{dataset['id']}", headers=auth)
    assert busy.status_code == 409 and job["id"] in busy.json()["detail"]
    rows.start(job["id"])
    assert api.delete(f"/datasets/{dataset['id']}", headers=auth).status_code == 409
    rows.finish(job["id"])
    assert api.delete(f"/datasets/{dataset['id']}", headers=auth).status_code == 204
    assert api.get(f"/datasets/{dataset['id']}", headers=auth).status_code == 404
    assert stored_files(services_env) == [] and dataset_rows() == before
    # The finished job keeps the sha256 it trained on.
    assert api.get(f"/jobs/{job['id']}", headers=auth).json()["spec"]["dataset"]["info"]["sha256"] == dataset["sha256"]


def test_a_running_sweep_on_a_dataset_keeps_it_from_deletion(api, auth):
    dataset = upload(api, auth, unique_csv()).json()
    base = {"framework": "jax", "dataset": {"id": dataset["id"]}, "batch_size": 32, "epochs": 1}
    body = {"base": base, "space": {"optimizer.learning_rate": {"choice": [0.01, 0.1]}}, "max_trials": 2}
    refused = api.post("/sweeps", json=body, headers=auth)  # the dataset's checks name the base's field
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "base", "dataset"]
    assert "validation_split" in refused.json()["detail"][0]["msg"]
    body["base"] = {**base, "dataset": {"id": dataset["id"], "validation_split": 0.2}}
    created = api.post("/sweeps", json=body, headers=auth)
    assert created.status_code == 201, created.text
    sweep = created.json()
    busy = api.delete(f"/datasets/{dataset['id']}", headers=auth)
    assert busy.status_code == 409 and f"running sweep(s) ({sweep['id']})" in busy.json()["detail"], busy.text
    assert "queued or running job(s)" in busy.json()["detail"]  # its first trial
    assert api.post(f"/sweeps/{sweep['id']}/cancel", headers=auth).status_code == 202
    assert api.delete(f"/datasets/{dataset['id']}", headers=auth).status_code == 204


def test_shared_content_stays_while_another_key_holds_it(api, auth, make_key, services_env):
    other = {"Authorization": f"Bearer {make_key('other')}"}
    body = unique_csv()
    mine, theirs = upload(api, auth, body).json(), upload(api, other, body).json()
    assert mine["id"] != theirs["id"] and mine["sha256"] == theirs["sha256"]
    assert api.delete(f"/datasets/{mine['id']}", headers=auth).status_code == 204
    assert len(stored_files(services_env)) == 1
    assert api.get(f"/datasets/{theirs['id']}", headers=other).status_code == 200
    assert api.delete(f"/datasets/{theirs['id']}", headers=other).status_code == 204
    assert stored_files(services_env) == []


def test_uploading_again_repairs_a_damaged_stored_copy(api, auth, services_env):
    import hashlib

    dataset = upload(api, auth, unique_csv()).json()
    [stored] = stored_files(services_env)
    stored.write_bytes(b"damaged")
    body = api.get(f"/datasets/{dataset['id']}", headers=auth).json()
    assert body["sha256"] == dataset["sha256"]
    again = upload(api, auth, unique_csv.last)  # the same content
    assert again.status_code == 200 and again.json()["id"] == dataset["id"]
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == dataset["sha256"]


def test_a_worker_finds_the_data_through_its_jobs_own_record(api, auth, make_key, services_env):
    """Another key's record of the same content may point at a copy that is gone (another store,
    an older deployment); the job's own record is asked first and others only after it."""
    from sqlalchemy import update

    from app.db import session_scope
    from app.models import Dataset
    from trainers.spec import JobSpec
    from workers.dataset_cache import fetch_for

    body = unique_csv()
    other = {"Authorization": f"Bearer {make_key('other')}"}
    theirs = upload(api, other, body).json()
    with session_scope() as session:  # their copy lies in a store this deployment no longer has
        session.execute(update(Dataset).where(Dataset.id == theirs["id"]).values(location="/gone/x.safetensors"))
        session.commit()
    mine = upload(api, auth, body).json()
    job = api.post("/jobs", json={"framework": "jax", "dataset": {"id": mine["id"], "validation_split": 0.2},
                                  "batch_size": 8}, headers=auth).json()
    path, timings = fetch_for(JobSpec.model_validate(job["spec"]))
    assert path.name == f"{mine['sha256']}.safetensors" and timings["data_cache_hit"] == 0.0


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def zip_bomb() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x_train.npy", b"\0" * (64 * 1024 * 1024))
    return buffer.getvalue()


x, y = np.random.default_rng(0).random((20, 3)), np.arange(20) % 2
REFUSALS = {
    "object array": (npz_bytes(x_train=np.array([[1], "a"], dtype=object), y_train=np.arange(2)), 422, "x_train"),
    "nan feature": (b"a,b,label\n1,2,0\n1,nan,1\n", 422, "NaN"),
    "text feature": (b"a,b,label\n1,x,0\n2,y,1\n", 422, "'b'"),
    "fractional class": (b"a,label\n1,0\n2,1.5\n", 422, "1.5", {"task": "classification"}),
    "one class": (b"a,label\n1,0\n2,0\n", 422, "class"),
    "ragged": (npz_bytes(x_train=x, y_train=y[:5]), 422, "y_train"),
    "shape mismatch": (npz_bytes(x_train=x, y_train=y, x_test=x[:, :2], y_test=y), 422, "x_test"),
    "unknown format": (b"%PDF-1.4 not a dataset", 422, "format"),
    "zip bomb": (zip_bomb(), 413, "limit"),
    "truncated": (npz_bytes(x_train=x, y_train=y)[:-40], 422, ""),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_name_the_problem_and_store_nothing(api, auth, services_env, monkeypatch, case):
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_UNPACKED_BYTES", str(16 * 1024 * 1024))
    reset_caches()
    before = dataset_rows()
    body, status, named, *params = REFUSALS[case]
    response = upload(api, auth, body, content_type="application/octet-stream", **(params[0] if params else {}))
    assert response.status_code == status, response.text
    assert named in response.text
    assert dataset_rows() == before and stored_files(services_env) == []


def test_size_limits_are_413_with_the_numbers(api, auth, services_env, monkeypatch):
    before = dataset_rows()
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_BYTES", "4096")
    reset_caches()
    too_big = upload(api, auth, b"a,label\n" + b"1,0\n2,1\n" * 4000)
    assert too_big.status_code == 413 and "TRAINHUB_MAX_DATASET_BYTES" in too_big.text
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_BYTES", str(10 * 1024 * 1024))
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_BYTES_PER_KEY", "80000")
    reset_caches()
    first = upload(api, auth, breast_cancer_csv())
    assert first.status_code == 201, first.text
    over = upload(api, auth, diabetes_csv(), label_column="target", task="regression")
    assert over.status_code == 413 and "TRAINHUB_MAX_DATASET_BYTES_PER_KEY" in over.text
    assert f"{first.json()['bytes']:,}" in over.text
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_EXAMPLES", "100")
    monkeypatch.setenv("TRAINHUB_MAX_DATASET_BYTES_PER_KEY", str(10 * 1024 * 1024))
    reset_caches()
    many = upload(api, auth, diabetes_csv(), label_column="target", task="regression")
    assert many.status_code == 413 and "100" in many.text
    assert dataset_rows() == before + 1 and len(stored_files(services_env)) == 1


def test_built_in_datasets_no_worker_has_are_refused(api, auth):
    from sqlalchemy import delete

    from app.db import session_scope
    from app.models import Worker, utcnow

    with session_scope() as session:
        session.add(Worker(name="w:1:datasets", hostname="w", hardware="cpu", queues=["cpu.jax"], devices=["cpu:0"],
                           versions={}, last_seen=utcnow(), datasets=["fashion-mnist", "digits", "synthetic"]))
        session.commit()
    try:
        refused = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "mnist"}}, headers=auth)
        assert refused.status_code == 422 and "'mnist' is not installed" in refused.text
        assert api.post("/jobs", json={"framework": "jax", "dataset": {"name": "fashion-mnist"}},
                        headers=auth).status_code == 201
        built_in = [d["name"] for d in api.get("/datasets", headers=auth).json()["items"] if d["built_in"]]
        assert built_in == ["fashion-mnist", "digits", "synthetic"]
    finally:
        with session_scope() as session:  # the database is shared: later tests expect no worker
            session.execute(delete(Worker).where(Worker.name == "w:1:datasets"))
            session.commit()


def test_on_sqlite_a_keys_second_upload_counts_its_quota_after_the_first_commits(tmp_path):
    """The embedded stack: two uploads of one key, each counting the key's stored bytes and then
    storing its own, would both find room (SQLite's reads take no lock); lock_key makes the second
    wait for the first's commit, so it counts the first's bytes."""
    import threading

    from sqlalchemy.orm import Session

    from app.db import make_engine, migrate
    from app.datasets.records import stored_bytes
    from app.keys import Caller
    from app.limits import lock_key
    from app.models import ApiKey, Dataset, new_id, utcnow

    url = f"sqlite:///{tmp_path / 'trainhub.db'}"
    migrate(url)
    engine = make_engine(url)
    with Session(engine) as session:
        key = ApiKey(id=new_id(), name="k", prefix="th_x", key_hash="h" * 64)
        session.add(key)
        session.commit()
        owner = Caller(id=key.id, is_admin=False)
    counted: list[int] = []
    second_started = threading.Event()

    def second_upload() -> None:
        with Session(engine) as session:
            second_started.set()
            lock_key(session, owner)
            counted.append(stored_bytes(session, owner))
            session.rollback()

    with Session(engine) as first:
        lock_key(first, owner)
        assert stored_bytes(first, owner) == 0
        thread = threading.Thread(target=second_upload)
        thread.start()
        second_started.wait()
        thread.join(timeout=0.5)
        assert counted == [], "the second upload counted while the first held the key's lock"
        first.add(Dataset(id=new_id(), owner_id=key.id, name="d", format="csv", task="classification",
                          input_shape=[2], num_classes=2, class_names=["0", "1"], train_size=1, test_size=0, bytes=1000,
                          upload_bytes=1000, sha256="0" * 64, location="x", created_at=utcnow()))
        first.commit()
    thread.join(timeout=30)
    assert counted == [1000]
    engine.dispose()
