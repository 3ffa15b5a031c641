"""`trainhub code upload|list|delete`, run as a user runs them against a real uvicorn on PostgreSQL
and Redis (no worker: a submitted job stays queued, so its code is in use)."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.app.cli_shell import trainhub, user_shell

MODEL = """
from torch import nn


def build(input_shape, num_classes):
    return nn.Linear(input_shape[0], num_classes)
"""


def said(result) -> str:
    return " ".join((result.stdout + result.stderr).split())


@pytest.fixture(scope="module")
def cli_env(database_url, redis_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-code")
    with user_shell(
        database_url, redis_url, root, "cli-code", key_options=("--allow-code",), TRAINHUB_ALLOW_USER_CODE="1"
    ) as env:
        yield env


def test_upload_list_and_delete_once_no_job_uses_it(cli_env, tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MODEL + f"# {uuid.uuid4().hex}\n")
    uploaded = trainhub(cli_env, "code", "upload", str(path), "--name", "linear", "--entrypoint", "net:build")
    assert uploaded.returncode == 0, said(uploaded)
    code_id = uploaded.stdout.strip()
    assert code_id.startswith("code_") and "net:build pytorch" in said(uploaded)
    again = trainhub(cli_env, "code", "upload", str(path))
    assert again.stdout.strip() == code_id and "already uploaded" in again.stderr

    missing = trainhub(cli_env, "code", "upload", str(path), "--entrypoint", "net:nothing")
    assert missing.returncode == 1 and "net:nothing" in said(missing)

    listed = trainhub(cli_env, "code", "list", "--json")
    assert listed.returncode == 0, said(listed)
    mine = [c for c in json.loads(listed.stdout) if c["id"] == code_id]
    assert [(c["name"], c["entrypoints"]) for c in mine] == [("linear", {"net:build": "pytorch"})]
    table = trainhub({**cli_env, "COLUMNS": "250"}, "code", "list")
    assert table.returncode == 0 and code_id in table.stdout and "linear" in table.stdout

    spec = tmp_path / "job.json"
    model = {"code": code_id, "entrypoint": "net:build"}
    spec.write_text(json.dumps({"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 1, "model": model}))
    submitted = trainhub(cli_env, "submit", "--spec", str(spec), "--json")
    assert submitted.returncode == 0, said(submitted)
    in_use = trainhub(cli_env, "code", "delete", code_id[:13])
    assert in_use.returncode == 1 and json.loads(submitted.stdout)["id"] in said(in_use)
    trainhub(cli_env, "cancel", json.loads(submitted.stdout)["id"])

    deleted = trainhub(cli_env, "code", "delete", code_id[:13])
    assert deleted.returncode == 0 and f"deleted code {code_id}" in deleted.stdout
    gone = trainhub(cli_env, "code", "delete", code_id)
    assert gone.returncode == 1 and "not found" in said(gone)
