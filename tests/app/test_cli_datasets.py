"""`trainhub datasets upload|list|show|delete` and `submit --dataset ds_... --validation-split`,
run as a user runs them (`python -m app.cli`) against a real uvicorn on PostgreSQL and Redis, with
no worker: a submitted job stays queued."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.cli import spec_from_options
from tests.app.cli_shell import trainhub, user_shell



def said(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr as one line (rich wraps long lines at the terminal's width)."""
    return " ".join((result.stdout + result.stderr).split())


@pytest.fixture(scope="module")
def cli_env(database_url, redis_url, tmp_path_factory) -> dict[str, str]:
    """The environment of a user's shell: uvicorn serving the API (no worker) and a new key."""
    with user_shell(database_url, redis_url, tmp_path_factory.mktemp("cli-datasets"), "cli-datasets") as env:
        yield env


def small_csv(path: Path, rows: int = 80) -> Path:
    """A classification table no other test uploads (the database is shared), without a test split."""
    rng = np.random.default_rng()
    lines = ["a,b,c,label"] + [f"{rng.random()!r},{rng.random()!r},{rng.random()!r},{i % 3}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_upload_list_show_submit_and_delete_once_no_job_uses_it(cli_env, tmp_path):
    uploaded = trainhub(cli_env, "datasets", "upload", str(small_csv(tmp_path / "three.csv")), "--name", "three")
    assert uploaded.returncode == 0, said(uploaded)
    dataset_id = uploaded.stdout.strip()
    assert dataset_id.startswith("ds_") and "already uploaded" not in uploaded.stderr

    shown = trainhub(cli_env, "datasets", "show", dataset_id, "--json")
    assert shown.returncode == 0, said(shown)
    dataset = json.loads(shown.stdout)
    assert (dataset["id"], dataset["name"], dataset["built_in"]) == (dataset_id, "three", False)
    assert (dataset["format"], dataset["task"], dataset["input_shape"]) == ("csv", "classification", [3])
    assert (dataset["num_classes"], dataset["train_size"], dataset["test_size"]) == (3, 80, 0)
    table = trainhub(cli_env, "datasets", "show", dataset_id)
    assert table.returncode == 0 and "--validation-split" in said(table)

    listed = trainhub(cli_env, "datasets", "list", "--json")
    assert listed.returncode == 0, said(listed)
    items = json.loads(listed.stdout)
    assert [d for d in items if d["id"] == dataset_id] == [dataset]
    assert {d["name"] for d in items if d["built_in"]} >= {"digits", "synthetic"}
    built_in_first = [d["built_in"] for d in items]
    assert built_in_first == sorted(built_in_first, reverse=True)
    table = trainhub(cli_env, "datasets", "list")
    assert table.returncode == 0 and dataset_id in table.stdout and "built-in" in table.stdout

    # The same content again is the same dataset, and says so (stdout stays the id alone).
    again = trainhub(cli_env, "datasets", "upload", str(tmp_path / "three.csv"), "--json")
    assert again.returncode == 0, said(again)
    assert json.loads(again.stdout)["id"] == dataset_id and "already uploaded" in again.stderr

    # On tpu: the broker and database are shared with other sessions' tests, whose cpu workers
    # would otherwise run (and end) this job; no tpu worker runs here, so it stays queued.
    options = ("--validation-split", "0.2", "--batch-size", "16", "--hardware", "tpu", "--json")
    submitted = trainhub(cli_env, "submit", "--dataset", dataset_id, *options)
    assert submitted.returncode == 0, said(submitted)
    job = json.loads(submitted.stdout)
    assert job["status"] == "queued"
    assert job["spec"]["dataset"]["id"] == dataset_id and job["spec"]["dataset"]["validation_split"] == 0.2
    assert job["spec"]["dataset"].get("name") is None
    status = trainhub(cli_env, "status", job["id"])
    assert status.returncode == 0 and dataset_id in status.stdout

    refused = trainhub(cli_env, "datasets", "delete", dataset_id)
    assert refused.returncode == 1 and "409" in said(refused) and job["id"] in said(refused)
    assert trainhub(cli_env, "datasets", "show", dataset_id).returncode == 0  # still there

    cancelled = trainhub(cli_env, "cancel", job["id"])
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "cancelled", said(cancelled)
    deleted = trainhub(cli_env, "datasets", "delete", dataset_id)
    assert deleted.returncode == 0, said(deleted)
    assert f"deleted dataset {dataset_id} named 'three'" in deleted.stdout
    gone = trainhub(cli_env, "datasets", "show", dataset_id)
    assert gone.returncode == 1 and "not found" in said(gone)
    assert dataset_id not in trainhub(cli_env, "datasets", "list", "--json").stdout


def test_an_upload_the_server_refuses_exits_1_with_its_reason(cli_env, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,4\n")  # no label column
    refused = trainhub(cli_env, "datasets", "upload", str(bad))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "label" in said(refused)


def test_an_unknown_format_or_task_is_a_usage_error(cli_env, tmp_path):
    path = small_csv(tmp_path / "t.csv", rows=10)
    assert trainhub(cli_env, "datasets", "upload", str(path), "--format", "xlsx").returncode == 2
    assert trainhub(cli_env, "datasets", "upload", str(path), "--task", "ranking").returncode == 2


def test_dataset_option_sets_the_id_for_an_uploaded_dataset_and_the_name_for_a_built_in_one(tmp_path):
    dataset_id = "ds_" + "0" * 32
    assert spec_from_options(None, dataset=dataset_id, validation_split=0.2) == {
        "dataset": {"id": dataset_id, "validation_split": 0.2}
    }
    assert spec_from_options(None, dataset="digits") == {"dataset": {"name": "digits"}}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"dataset": {"name": "mnist", "train_limit": 100}}))
    assert spec_from_options(spec_file, dataset=dataset_id) == {"dataset": {"id": dataset_id, "train_limit": 100}}
    spec_file.write_text(json.dumps({"dataset": {"id": dataset_id, "validation_split": 0.1}}))
    assert spec_from_options(spec_file, dataset="digits") == {"dataset": {"name": "digits", "validation_split": 0.1}}


def test_submit_compile_asks_for_a_compiled_pytorch_step_and_no_compile_overrides_a_spec_file(cli_env, tmp_path):
    submitted = trainhub(cli_env, "submit", "--framework", "pytorch", "--dataset", "digits", "--compile", "--json")
    assert submitted.returncode == 0, said(submitted)
    assert json.loads(submitted.stdout)["spec"]["compile"] is True
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"framework": "pytorch", "compile": True}))
    assert spec_from_options(spec_file, compile=False) == {"framework": "pytorch", "compile": False}
    refused = trainhub(cli_env, "submit", "--framework", "pytorch", "--hardware", "tpu", "--compile")
    assert refused.returncode != 0 and "compile" in said(refused)  # PyTorch on TPU cannot compile
