"""The artifact stores: what a worker stores (workers/runner.py) is what the API serves
(app/api/artifacts.py) and what the comparison check reads, the same tests for the local
directory and for an S3 API server (moto's server mode on loopback)."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load, save_file

from tests.conftest import reset_caches

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}


@pytest.fixture(params=["local", "s3"])
def store(request, services_env, monkeypatch) -> str:
    """Which store this run of the test uses; its settings are applied to this process."""
    if request.param == "s3":
        for name, value in request.getfixturevalue("s3_env").items():
            monkeypatch.setenv(name, value)
    reset_caches()
    return request.param


@pytest.fixture
def stored(store, api, auth):
    """A queued job whose files a worker has stored: {name: bytes}, and the job id."""
    from app.config import get_settings
    from workers.runner import store_artifacts

    job_id = api.post("/jobs", json=DIGITS, headers=auth).json()["id"]
    workdir = get_settings().resolved_artifact_dir() / job_id
    workdir.mkdir(parents=True)
    save_file({"layers.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}, workdir / "weights.safetensors")
    (workdir / "spec.json").write_text('{"framework": "jax"}')
    (workdir / "big.bin").write_bytes(os.urandom(3 * (1 << 20) + 123))  # several streaming chunks
    (workdir / "empty.txt").write_bytes(b"")
    files = {p.name: p.read_bytes() for p in workdir.iterdir()}
    store_artifacts(job_id, workdir, sorted(files))
    store_artifacts(job_id, workdir, sorted(files))  # a retried store records nothing twice
    if store == "s3":
        shutil.rmtree(workdir)  # served from the bucket, not from the worker's scratch folder
    return job_id, files


def recorded_paths(job_id: str) -> dict[str, str]:
    from sqlalchemy import select

    from app.db import session_scope
    from app.models import Artifact

    with session_scope() as session:
        return dict(session.execute(select(Artifact.name, Artifact.path).where(Artifact.job_id == job_id)).all())


def test_recorded_where_the_store_put_them(store, stored, services_env):
    job_id, files = stored
    paths = recorded_paths(job_id)
    assert sorted(paths) == sorted(files)
    for name, path in paths.items():
        if store == "s3":
            assert path == f"s3://{os.environ['TRAINHUB_S3_BUCKET']}/artifacts/{job_id}/{name}"
        else:
            assert path == os.path.join(services_env["TRAINHUB_ARTIFACT_DIR"], job_id, name)


def test_listed_and_downloaded_whole(stored, api, auth):
    job_id, files = stored
    listed = {a["name"]: a for a in api.get(f"/jobs/{job_id}/artifacts", headers=auth).json()}
    assert sorted(listed) == sorted(files)
    for name, data in files.items():
        assert listed[name]["size_bytes"] == len(data)
        assert listed[name]["sha256"] == hashlib.sha256(data).hexdigest()
        response = api.get(f"/jobs/{job_id}/artifacts/{name}", headers=auth)
        assert response.status_code == 200, response.text
        assert response.content == data
        assert response.headers["content-length"] == str(len(data))
        assert response.headers["content-type"] == "application/octet-stream"
        assert f'filename="{name}"' in response.headers["content-disposition"]


@pytest.mark.parametrize("header,part", [
    ("bytes=0-9", slice(0, 10)),
    ("bytes=100-", slice(100, None)),
    ("bytes=-7", slice(-7, None)),
    ("bytes=5-999999999", slice(5, None)),           # an end past the file is clipped
    ("bytes=2097150-2097160", slice(2097150, 2097161)),  # across a chunk boundary
])
def test_range_requests(stored, api, auth, header, part):
    job_id, files = stored
    data = files["big.bin"]
    response = api.get(f"/jobs/{job_id}/artifacts/big.bin", headers={**auth, "Range": header})
    assert response.status_code == 206, response.text
    assert response.content == data[part]
    start, stop, _ = part.indices(len(data))
    assert response.headers["content-range"] == f"bytes {start}-{stop - 1}/{len(data)}"
    assert response.headers["content-length"] == str(stop - start)


@pytest.mark.parametrize("name", ["spec.json", "empty.txt"])
def test_unsatisfiable_range_is_416(stored, api, auth, name):
    job_id, files = stored
    size = len(files[name])
    response = api.get(f"/jobs/{job_id}/artifacts/{name}", headers={**auth, "Range": f"bytes={size}-"})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{size}"


def test_head_gives_the_size_without_the_body(stored, api, auth):
    job_id, files = stored
    response = api.head(f"/jobs/{job_id}/artifacts/big.bin", headers=auth)
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(files["big.bin"]))
    assert response.content == b""


def test_unknown_missing_or_foreign_artifacts_are_404(store, stored, api, auth, make_key):
    job_id, _ = stored
    assert api.get(f"/jobs/{job_id}/artifacts/nope.bin", headers=auth).status_code == 404
    assert api.get(f"/jobs/{job_id}/artifacts/..%2Fspec.json", headers=auth).status_code == 404
    other = {"Authorization": f"Bearer {make_key('other')}"}
    assert api.get(f"/jobs/{job_id}/artifacts/spec.json", headers=other).status_code == 404
    # the file went away behind the record (deleted from the bucket or the disk)
    from app import storage

    location = recorded_paths(job_id)["spec.json"]
    if store == "s3":
        target = storage.store_for(location)
        target.client.delete_object(Bucket=target.bucket, Key=storage.split_s3(location)[1])
    else:
        os.remove(location)
    response = api.get(f"/jobs/{job_id}/artifacts/spec.json", headers=auth)
    assert response.status_code == 404
    assert "spec.json" in response.json()["detail"]


def test_the_comparison_check_reads_weights_from_the_store(stored):
    from app import storage

    job_id, files = stored
    weights = load(storage.read_bytes(recorded_paths(job_id)["weights.safetensors"]))
    assert weights["layers.0.weight"].tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


# RFC 9110 section 14: invalid syntax or another unit is ignored (200, the whole file); a valid
# header none of whose ranges lies in the file is 416; several ranges may be answered whole.
SIZE = 3 * (1 << 20) + 123


@pytest.mark.parametrize("header,expected_status,expected_range", [
    ("bytes=abc", 200, None),
    ("bytes=5-4", 200, None),
    ("bytes=x-5", 200, None),
    ("bytes=-", 200, None),
    ("bytes=1-2-3", 200, None),
    ("items=0-1", 200, None),
    ("bytes 0-1", 200, None),
    ("BYTES=0-1", 206, (0, 1)),                   # the unit is case-insensitive
    ("bytes=0-1, 5-9", 200, None),                # several ranges: the whole file
    ("bytes=0-1, 99999999-", 206, (0, 1)),        # one of them satisfiable
    (f"bytes={SIZE}-", 416, None),
    (f"bytes={SIZE}-{SIZE + 5}, {SIZE + 10}-", 416, None),
    ("bytes=-0", 416, None),
    ("bytes=99999999999999999999999999999-", 416, None),
    ("bytes=-99999999999999999999999999999", 206, (0, SIZE - 1)),
])
def test_range_headers_are_read_as_rfc_9110_says_by_both_stores(stored, api, auth, header, expected_status,
                                                                 expected_range):
    job_id, files = stored
    data = files["big.bin"]
    assert len(data) == SIZE
    response = api.get(f"/jobs/{job_id}/artifacts/big.bin", headers={**auth, "Range": header})
    assert response.status_code == expected_status, response.text
    if expected_status == 416:
        assert response.headers["content-range"] == f"bytes */{SIZE}"
    elif expected_range is None:
        assert response.content == data and "content-range" not in response.headers
        assert response.headers["content-length"] == str(SIZE)
    else:
        start, end = expected_range
        assert response.content == data[start:end + 1]
        assert response.headers["content-range"] == f"bytes {start}-{end}/{SIZE}"
        assert response.headers["content-length"] == str(end - start + 1)
