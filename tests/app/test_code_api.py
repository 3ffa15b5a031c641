"""The code API against real PostgreSQL (no worker): who may use user code (403s), upload checks
(names, sizes, zip bombs, parsing, entrypoints) leaving nothing stored on a refusal, dedupe,
ownership, jobs that name code, and delete while in use."""

from __future__ import annotations

import io
import stat
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.conftest import reset_caches

TORCH_MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, features, classes, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.body(x)


def build(input_shape, num_classes, hidden=32):
    return Net(int(torch.tensor(input_shape).prod()), num_classes, hidden)


def helper():
    return 1
'''

FLAX_MODEL = '''
import flax.linen as nn


def build(input_shape, num_classes):
    return nn.Dense(num_classes)
'''


@pytest.fixture
def code_env(services_env, monkeypatch):
    monkeypatch.setenv("TRAINHUB_ALLOW_USER_CODE", "1")
    reset_caches()
    return services_env


@pytest.fixture
def code_key(code_env):
    from app.db import session_scope
    from app.keys import create_key

    def make(name: str = "coder", allow_code: bool = True) -> dict[str, str]:
        with session_scope() as session:
            secret = create_key(session, name, allow_code=allow_code)[1]
        return {"Authorization": f"Bearer {secret}"}

    return make


def unique(source: str = TORCH_MODEL) -> str:
    """`source` made unique (the database is shared by the session's tests)."""
    return source + f"\n# {uuid.uuid4().hex}\n"


def post_code(api, auth, body: bytes, filename: str = "model.py", **params):
    return api.post(
        "/code",
        content=body,
        params={"filename": filename, **params},
        headers={**auth, "Content-Type": "application/octet-stream"},
    )


def zipped(members: dict[str, bytes], symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def stored(services_env) -> list[Path]:
    roots = [Path(services_env["TRAINHUB_VAR_DIR"]) / "uploads", Path(services_env["TRAINHUB_ARTIFACT_DIR"]) / "code"]
    return [path for root in roots if root.exists() for path in root.rglob("*") if path.is_file()]


def test_user_code_is_off_unless_the_deployment_and_the_key_allow_it(api, services_env, code_key, monkeypatch):
    allowed = code_key("allowed")  # made while the deployment still allows user code
    monkeypatch.delenv("TRAINHUB_ALLOW_USER_CODE")
    reset_caches()
    refused = post_code(api, allowed, unique().encode())
    assert refused.status_code == 403
    assert "TRAINHUB_ALLOW_USER_CODE" in refused.json()["detail"]

    monkeypatch.setenv("TRAINHUB_ALLOW_USER_CODE", "1")
    reset_caches()
    plain = code_key("plain", allow_code=False)
    refused = post_code(api, plain, unique().encode())
    assert refused.status_code == 403
    assert "trainhub keys code KEY --allow" in refused.json()["detail"]
    assert stored(services_env) == []
    job = {"framework": "pytorch", "dataset": {"name": "digits"}, "model": {"code": f"code_{'0' * 32}", "entrypoint": "model:build"}}
    refused = api.post("/jobs", json=job, headers=plain)
    assert refused.status_code == 403
    assert post_code(api, allowed, unique().encode()).status_code == 201


def test_the_code_list_comes_in_pages_newest_first(api, code_key):
    owner = code_key("pages")
    made = [post_code(api, owner, unique().encode()).json()["id"] for _ in range(3)]

    pages, cursor = [], None
    while True:
        page = api.get("/code", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=owner).json()
        pages.append([row["id"] for row in page["items"]])
        if not (cursor := page["next_cursor"]):
            break
    assert pages == [made[:0:-1], made[:1]]
    assert api.get("/code", params={"cursor": "x|y"}, headers=owner).status_code == 422


def test_upload_lists_entrypoints_with_their_framework_and_dedupes(api, code_key):
    owner, other = code_key("owner"), code_key("other")
    source = unique().encode()
    created = post_code(api, owner, source, entrypoint=["model:build"])
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["id"].startswith("code_") and created.headers["location"] == f"/code/{body['id']}"
    assert body["entrypoints"] == {"model:build": "pytorch", "model:helper": None}
    assert body["files"] == [{"name": "model.py", "size_bytes": len(source)}]

    again = post_code(api, owner, source)
    assert (again.status_code, again.json()["id"]) == (200, body["id"])
    assert [row["id"] for row in api.get("/code", headers=owner).json()["items"]] == [body["id"]]
    assert api.get(f"/code/{body['id']}", headers=owner).json()["sha256"] == body["sha256"]
    assert api.get(f"/code/{body['id']}", headers=other).status_code == 404
    assert api.delete(f"/code/{body['id']}", headers=other).status_code == 404
    assert api.get("/code", headers=other).json()["items"] == []

    flax = post_code(api, owner, unique(FLAX_MODEL).encode(), filename="flaxmodel.py").json()
    assert flax["entrypoints"] == {"flaxmodel:build": "jax"}


def test_a_zip_package_names_its_modules_by_their_paths(api, code_key):
    owner = code_key()
    body = zipped({"nets/__init__.py": b"", "nets/mlp.py": unique().encode(), "README.md": b"# notes\n"})
    created = post_code(api, owner, body, filename="nets.zip")
    assert created.status_code == 201, created.text
    assert "nets.mlp:build" in created.json()["entrypoints"]
    assert {f["name"] for f in created.json()["files"]} == {"nets/__init__.py", "nets/mlp.py", "README.md"}


@pytest.mark.parametrize(
    ("members", "symlink", "status", "words"),
    [
        ({"../evil.py": b"x = 1"}, None, 422, "'..'"),
        ({"/etc/evil.py": b"x = 1"}, None, 422, "absolute path"),
        ({"ok.py": b"x = 1"}, "link.py", 422, "symlink"),
        ({"ok.py": b"x = 1", "lib.so": b"\x7fELF"}, None, 422, "not a .py file"),
        ({"broken.py": b"def build(:\n    pass\n"}, None, 422, "does not parse: line 1"),
        ({f"m{i}.py": b"x = 1" for i in range(70)}, None, 413, "max_code_files"),
        ({"bomb.py": b"#" + b"0" * (200 * 1024)}, None, 413, "zip bomb"),
        ({"big.py": b"#" + b"0" * (300 * 1024)}, None, 413, "max_code_file_bytes"),
    ],
)
def test_bad_packages_are_refused_naming_the_problem_and_nothing_is_stored(
    api, code_env, code_key, members, symlink, status, words
):
    owner = code_key()
    refused = post_code(api, owner, zipped(members, symlink), filename="pkg.zip")
    assert refused.status_code == status, refused.text
    detail = refused.json()["detail"]
    assert words in (detail if isinstance(detail, str) else detail[0]["msg"])
    assert stored(code_env) == []
    assert api.get("/code", headers=owner).json()["items"] == []


def test_an_upload_past_the_byte_limit_and_a_missing_entrypoint_are_refused(api, code_env, code_key):
    owner = code_key()
    too_big = post_code(api, owner, b"#" * (1024**2 + 1))
    assert too_big.status_code == 413 and "TRAINHUB_MAX_CODE_BYTES" in too_big.json()["detail"]
    missing = post_code(api, owner, unique().encode(), entrypoint=["model:make"])
    assert missing.status_code == 422
    assert "model:make" in missing.json()["detail"][0]["msg"] and "model:build" in missing.json()["detail"][0]["msg"]
    not_python = post_code(api, owner, b"\x00\x01", filename="model.bin")
    assert not_python.status_code == 422
    assert stored(code_env) == []


def test_jobs_name_the_keys_code_and_an_entrypoint_of_the_right_framework(api, code_key):
    owner, other = code_key("owner"), code_key("other")
    code = post_code(api, owner, unique().encode()).json()
    model = {"code": code["id"], "entrypoint": "model:build", "kwargs": {"hidden": 16}}
    job = {"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 1, "model": model}
    created = api.post("/jobs", json=job, headers=owner)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["model"] == model

    def refusal(body: dict, auth: dict = owner) -> tuple[list, str]:
        response = api.post("/jobs", json=body, headers=auth)
        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        return error["loc"], error["msg"]

    flax = post_code(api, owner, unique(FLAX_MODEL).encode(), filename="flaxmodel.py").json()
    loc, msg = refusal({**job, "model": {"code": flax["id"], "entrypoint": "flaxmodel:build"}})
    assert loc == ["body", "model", "entrypoint"] and "builds a jax model" in msg
    loc, msg = refusal({**job, "framework": "jax"})
    assert loc == ["body", "model", "entrypoint"] and "builds a pytorch model" in msg
    flax_job = api.post("/jobs", json={**job, "framework": "jax", "model": {"code": flax["id"], "entrypoint": "flaxmodel:build"}}, headers=owner)
    assert flax_job.status_code == 201, flax_job.text
    api.post(f"/jobs/{flax_job.json()['id']}/cancel", headers=owner)  # the database is shared: leave no queue
    loc, msg = refusal({**job, "model": {**model, "entrypoints": {"jax": "model:build", "pytorch": "model:build"}}})
    assert "entrypoint" in msg
    loc, msg = refusal({**job, "model": {**model, "entrypoint": "model:nothing"}})
    assert loc == ["body", "model", "entrypoint"] and "model:build" in msg
    loc, msg = refusal(job, other)
    assert loc == ["body", "model", "code"] and "not found" in msg
    loc, msg = refusal({**job, "model": {**model, "kwargs": {"x": "y" * 5000}}})
    assert "4,096" in msg
    loc, msg = refusal({**job, "model": {**model, "name": "mlp"}})
    assert "not two of them" in msg
    loc, msg = refusal({**job, "model": {"code": code["id"]}})
    assert "entrypoint" in msg

    in_use = api.delete(f"/code/{code['id']}", headers=owner)
    assert in_use.status_code == 409 and created.json()["id"] in in_use.json()["detail"]
    api.post(f"/jobs/{created.json()['id']}/cancel", headers=owner)
    assert api.delete(f"/code/{code['id']}", headers=owner).status_code == 204
    assert api.get(f"/code/{code['id']}", headers=owner).status_code == 404


def test_an_admin_grants_and_revokes_the_permission_with_the_cli(api, code_env, code_key):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app.cli", "keys", *args], env={**__import__("os").environ, **code_env},
            capture_output=True, text=True,
        )

    made = cli("create", "--name", "cli-coder", "--allow-code")
    assert made.returncode == 0, made.stderr
    auth = {"Authorization": f"Bearer {made.stdout.strip().splitlines()[-1]}"}
    prefix = auth["Authorization"].split()[1][:10]
    assert post_code(api, auth, unique().encode()).status_code == 201
    revoked = cli("code", prefix, "--revoke")
    assert revoked.returncode == 0 and "may no longer" in revoked.stderr
    assert post_code(api, auth, unique().encode()).status_code == 403
    assert cli("code", prefix, "--allow").returncode == 0
    assert post_code(api, auth, unique().encode()).status_code == 201


def test_a_comparison_names_a_jax_and_a_pytorch_entrypoint_of_one_upload(api, code_key):
    owner = code_key("comparer")
    files = io.BytesIO()
    with zipfile.ZipFile(files, "w") as archive:
        archive.writestr("nets/torchnet.py", unique(TORCH_MODEL))
        archive.writestr("nets/flaxnet.py", FLAX_MODEL)
        archive.writestr("nets/__init__.py", "")
    code = post_code(api, owner, files.getvalue(), filename="nets.zip").json()
    assert code["entrypoints"]["nets.torchnet:build"] == "pytorch" and code["entrypoints"]["nets.flaxnet:build"] == "jax"
    model = {"code": code["id"], "entrypoints": {"jax": "nets.flaxnet:build", "pytorch": "nets.torchnet:build"}}
    body = {"dataset": {"name": "digits"}, "epochs": 1, "model": model}
    created = api.post("/comparisons", json=body, headers=owner)
    assert created.status_code == 201, created.text
    jobs = created.json()["jobs"]
    assert jobs["jax"]["spec"]["model"] == {"code": code["id"], "entrypoint": "nets.flaxnet:build", "init": "shared"}
    assert jobs["pytorch"]["spec"]["model"]["entrypoint"] == "nets.torchnet:build"
    own = api.post("/comparisons", json={**body, "model": {**model, "init": "module"}}, headers=owner).json()
    assert own["jobs"]["jax"]["spec"]["model"]["init"] == "module"
    for made in (created.json(), own):
        api.post(f"/comparisons/{made['id']}/cancel", headers=owner)

    def refusal(model: dict) -> tuple[list, str]:
        response = api.post("/comparisons", json={**body, "model": model}, headers=owner)
        assert response.status_code == 422, response.text
        return response.json()["detail"][0]["loc"], response.json()["detail"][0]["msg"]

    loc, msg = refusal({**model, "entrypoints": {"jax": "nets.torchnet:build", "pytorch": "nets.torchnet:build"}})
    assert loc == ["body", "model", "entrypoints", "jax"] and "builds a pytorch model" in msg
    loc, msg = refusal({"code": code["id"], "entrypoint": "nets.torchnet:build"})
    assert "a function for each framework" in msg
    loc, msg = refusal({**model, "entrypoints": {"pytorch": "nets.torchnet:build"}})
    assert "a function for each framework" in msg


def test_a_sweep_searches_the_keys_code_and_holds_it_while_it_runs(api, code_key):
    owner, other = code_key("sweeper"), code_key("other")
    code = post_code(api, owner, unique().encode()).json()
    base = {
        "framework": "pytorch",
        "dataset": {"name": "digits"},
        "epochs": 1,
        "model": {"code": code["id"], "entrypoint": "model:build"},
    }
    body = {"base": base, "space": {"model.kwargs.hidden": {"choice": [8, 16]}}, "max_trials": 2, "parallelism": 1}
    created = api.post("/sweeps", json=body, headers=owner)
    assert created.status_code == 201, created.text
    sweep = created.json()
    [trial] = api.get(f"/sweeps/{sweep['id']}/trials", headers=owner).json()["items"]
    trial = api.get(f"/jobs/{trial['job_id']}", headers=owner).json()
    assert trial["spec"]["model"]["code"] == code["id"] and trial["spec"]["model"]["kwargs"]["hidden"] in (8, 16)

    refused = api.post("/sweeps", json=body, headers=other)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "base", "model", "code"]
    wrong = {**body, "base": {**base, "framework": "jax"}}
    refused = api.post("/sweeps", json=wrong, headers=owner)
    assert refused.status_code == 422 and "builds a pytorch model" in refused.json()["detail"][0]["msg"]
    no_right = api.post("/sweeps", json=body, headers=code_key("plain", allow_code=False))
    assert no_right.status_code == 403 and "may not upload or run model code" in no_right.json()["detail"]

    # Its later trials train the code: deleting it waits for the sweep, not only for its jobs.
    in_use = api.delete(f"/code/{code['id']}", headers=owner)
    assert in_use.status_code == 409, in_use.text
    assert trial["id"] in in_use.json()["detail"] and sweep["id"] in in_use.json()["detail"]
    assert api.post(f"/sweeps/{sweep['id']}/cancel", headers=owner).status_code == 202
    assert api.delete(f"/code/{code['id']}", headers=owner).status_code == 204
