"""Users' own model code through the whole service: a torch and a flax module uploaded and trained on
digits by our loops in a sandboxed child process, the two compared with parity passing, and hostile code (reading the environment, another job's
files, the database port, too much memory, a huge file, a sleep past max_runtime_s) contained
with a clear error type while the worker keeps serving."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import running_service

MODEL = textwrap.dedent('''
    import math
    import os

    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, features, classes, hidden):
            super().__init__()
            self.hidden = nn.Linear(features, hidden)
            self.out = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x.flatten(1))))


    def build(input_shape, num_classes, hidden=64):
        print("building with", sorted(os.environ))
        return Net(math.prod(input_shape), num_classes, hidden)


    def loss(logits, targets):
        return nn.functional.cross_entropy(logits, targets, label_smoothing=0.0)
''')

# The same MLP written both ways, with the same parameter names (hidden.weight, out.bias, ...).
PAIR = textwrap.dedent('''
    import math

    import flax.linen as fnn
    import jax
    import torch
    from torch import nn


    class FlaxMLP(fnn.Module):
        hidden: int
        classes: int

        @fnn.compact
        def __call__(self, x, train: bool = False):
            print("flax module called with", x.shape)
            return fnn.Dense(self.classes, name="out")(jax.nn.relu(fnn.Dense(self.hidden, name="hidden")(x)))


    class TorchMLP(nn.Module):
        def __init__(self, features, hidden, classes):
            super().__init__()
            self.hidden = nn.Linear(features, hidden)
            self.out = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x)))


    def flax_mlp(input_shape, num_classes, hidden=32):
        return FlaxMLP(hidden, num_classes)


    def torch_mlp(input_shape, num_classes, hidden=32):
        return TorchMLP(math.prod(input_shape), hidden, num_classes)
''')

HOSTILE = textwrap.dedent('''
    import os
    import socket
    import time

    import torch


    def environment(input_shape, num_classes):
        found = {k: v for k, v in os.environ.items() if "TRAINHUB" in k or "postgres" in v or "redis" in v}
        raise LookupError(f"found {found}")


    def other_job(input_shape, num_classes, path):
        with open(path, "rb") as f:
            f.read(10)


    def secrets(input_shape, num_classes):
        with open("/etc/shadow", "rb") as f:
            f.read(10)


    def database(input_shape, num_classes):
        socket.create_connection(("127.0.0.1", 5432), timeout=5)


    def memory(input_shape, num_classes):
        hog = bytearray(64 << 30)
        return hog


    def huge_file(input_shape, num_classes):
        with open("huge.bin", "wb") as f:
            for _ in range(1024):
                f.write(b"0" * (1 << 20))


    def sleeper(input_shape, num_classes):
        time.sleep(600)


    def full_disk(input_shape, num_classes):
        for i in range(3):  # each file under the file limit, together past the folder's
            with open(f"part{i}.bin", "wb") as f:
                for _ in range(60):
                    f.write(b"0" * (1 << 20))
        time.sleep(60)  # the worker adds up the folder every second
''')


@pytest.fixture(scope="module")
def code_service(database_url, redis_url, tmp_path_factory):
    redis.Redis.from_url(redis_url).flushdb()
    with running_service(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("usercode"),
        allow_user_code="1",
        user_code_file_bytes=str(64 * 1024**2),
        user_code_disk_bytes=str(96 * 1024**2),
    ) as svc:
        yield svc


def code_client(service):
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--name", "coder", "--allow-code"],
        env=service.env, capture_output=True, text=True, check=True,
    ).stdout
    return service.client(out.strip().splitlines()[-1])


def upload(client, tmp_path: Path, name: str, source: str) -> dict:
    path = tmp_path / f"{name}.py"
    path.write_text(source + f"\n# {uuid.uuid4().hex}\n")
    return client.upload_code(path)


def job(code: dict, entrypoint: str, **extra) -> dict:
    model = {"code": code["id"], "entrypoint": entrypoint, **({"kwargs": extra.pop("kwargs")} if "kwargs" in extra else {})}
    return {"framework": "pytorch", "dataset": {"name": "digits"}, "batch_size": 64, "epochs": 3, "model": model,
            "optimizer": {"name": "adam", "learning_rate": 0.01}, **extra}


def test_a_torch_module_trains_on_digits_and_hostile_code_is_contained(code_service, tmp_path):
    with code_client(code_service) as client:
        code = upload(client, tmp_path, "mlp", MODEL)
        assert code["entrypoints"]["mlp:build"] == "pytorch"
        trained = client.wait(client.submit(job(code, "mlp:build", kwargs={"hidden": 32}))["id"], timeout_s=400)
        assert trained["status"] == "succeeded", trained["error"]
        assert [m["epoch"] for m in trained["metrics"]] == [1, 2, 3]
        assert trained["result"]["test_accuracy"] > 0.8
        names = {a["name"] for a in trained["artifacts"]}
        assert {"weights.safetensors", "state_dict.pt", "metrics.json", "logs.txt"} <= names
        logs = client.download(trained["id"], "logs.txt", tmp_path / "logs").read_text()
        assert "building with" in logs
        assert "TRAINHUB" not in logs and "DATABASE" not in logs

        hostile = upload(client, tmp_path, "hostile", HOSTILE)
        weights = code_service.artifact_dir / trained["id"] / "weights.safetensors"
        assert weights.exists()
        cases = {
            "environment": ({}, "LookupError: found {}"),
            "other_job": ({"kwargs": {"path": str(weights)}}, "PermissionError"),
            "database": ({}, "PermissionError"),
            "secrets": ({}, "PermissionError"),
            "memory": ({}, "MemoryError"),
            "huge_file": ({}, "File too large"),
        }
        for entrypoint, (extra, words) in cases.items():
            ended = client.wait(client.submit(job(hostile, f"hostile:{entrypoint}", **extra))["id"], timeout_s=300)
            assert ended["status"] == "failed", (entrypoint, ended)
            assert ended["error"]["type"] == "user_code_error", (entrypoint, ended["error"])
            message = ended["error"]["message"]
            assert words in message, (entrypoint, message)
            assert f'File "hostile.py"' in message and "trainers/" not in message, message
            assert "logs.txt" in {a["name"] for a in ended["artifacts"]}

        slept = client.wait(client.submit(job(hostile, "hostile:sleeper", max_runtime_s=3))["id"], timeout_s=300)
        assert (slept["status"], slept["error"]["type"]) == ("failed", "timeout"), slept
        full = client.wait(client.submit(job(hostile, "hostile:full_disk"))["id"], timeout_s=300)
        assert (full["status"], full["error"]["type"]) == ("failed", "user_code_error"), full
        assert "TRAINHUB_USER_CODE_DISK_BYTES" in full["error"]["message"]

        # What a job's child wrote beside its artifacts (files, its temp folder, the code and data
        # copies) is gone once it ended, whether it succeeded or failed.
        kept = {"weights.safetensors", "state_dict.pt", "metrics.json", "spec.json", "preprocessing.json",
                "logs.txt", "checkpoint.pt"}
        for ended in (trained, full):
            assert {p.name for p in (code_service.artifact_dir / ended["id"]).iterdir()} <= kept, ended["id"]

        # Nothing outside the jobs' own folders changed, and the worker still serves.
        assert weights.exists()
        again = client.wait(client.submit(job(code, "mlp:build", epochs=1))["id"], timeout_s=300)
        assert again["status"] == "succeeded", again["error"]


def test_cancel_stops_a_user_code_job_in_its_child(code_service, tmp_path):
    with code_client(code_service) as client:
        hostile = upload(client, tmp_path, "hostile", HOSTILE)
        submitted = client.submit(job(hostile, "hostile:sleeper"))
        for _ in range(600):
            if client.get(submitted["id"])["status"] == "running":
                break
            __import__("time").sleep(0.2)
        client.cancel(submitted["id"])
        ended = client.wait(submitted["id"], timeout_s=60)
        assert ended["status"] == "cancelled"


def test_a_flax_module_trains_and_a_pair_compares_with_parity(code_service, tmp_path):
    with code_client(code_service) as client:
        code = upload(client, tmp_path, "pair", PAIR)
        flax_job = {**job(code, "pair:flax_mlp", kwargs={"hidden": 32}), "framework": "jax"}
        trained = client.wait(client.submit(flax_job)["id"], timeout_s=400)
        assert trained["status"] == "succeeded", trained["error"]
        assert [m["epoch"] for m in trained["metrics"]] == [1, 2, 3]
        assert trained["result"]["test_accuracy"] > 0.8
        assert trained["timings"]["compile_s"] > 0
        assert type(trained["timings"]["compilations"]) is int  # a count, as the built-in trainers' (not 1.0)
        assert {"weights.safetensors", "params.msgpack", "logs.txt"} <= {a["name"] for a in trained["artifacts"]}
        assert "flax module called with" in client.download(trained["id"], "logs.txt", tmp_path / "flax").read_text()

        model = {"code": code["id"], "entrypoints": {"jax": "pair:flax_mlp", "pytorch": "pair:torch_mlp"}}
        spec = {"dataset": {"name": "digits"}, "batch_size": 64, "epochs": 2, "model": model}
        comparison = client.compare(spec)
        ended = client.wait_comparison(comparison["id"], timeout_s=600)
        assert ended["status"] == "succeeded", (ended["error"], ended["parity"])
        parity = ended["parity"]
        assert parity["passed"] and {c["name"] for c in parity["checks"]} == {
            "first step loss", "epoch train loss", "test accuracy agrees"
        }
        assert parity["export"]["compatible"] is True


CHATTY = textwrap.dedent('''
    import math
    import time

    from torch import nn


    class Slow(nn.Module):
        def __init__(self, features, classes):
            super().__init__()
            self.steps, self.out = 0, nn.Linear(features, classes)

        def forward(self, x):
            if self.training:
                self.steps += 1
                print("step", self.steps, flush=False)
                time.sleep(0.1)  # an epoch of 22 steps takes over 2 s: lines are stored as it runs
            return self.out(x)


    def build(input_shape, num_classes):
        return Slow(math.prod(input_shape), num_classes)
''')


def test_what_user_code_prints_is_streamed_as_log_events_while_it_runs(code_service, tmp_path):
    with code_client(code_service) as client:
        code = upload(client, tmp_path, "chatty", CHATTY)
        submitted = client.submit(job(code, "chatty:build"))
        events = list(client.events(submitted["id"]))
        assert events[-1].data["status"] == "succeeded", events[-1].data
        # The stored story keeps its numbers: queued 0, running 1, epochs 2..4, the end 5.
        assert [int(e.id) for e in events if e.id is not None] == [0, 1, 2, 3, 4, 5]
        logs = [e for e in events if e.event == "log"]
        assert logs and all(e.id is None for e in logs)
        lines = "".join(e.data["text"] for e in logs).splitlines()
        assert [line for line in lines if line.startswith("step")] == [f"step {i}" for i in range(1, 3 * 22 + 1)]
        # Some arrived while it ran: before the metrics of its last epoch.
        last_epoch = next(i for i, e in enumerate(events) if e.event == "metrics" and e.data["epoch"] == 3)
        assert events.index(logs[0]) < last_epoch

        # A reconnection (Last-Event-ID) is not sent them again; a fresh connection is.
        again = list(client.events(submitted["id"], last_event_id="4"))
        assert [e.event for e in again] == ["status"]
        replayed = [e for e in client.events(submitted["id"]) if e.event == "log"]
        assert "".join(e.data["text"] for e in replayed).splitlines() == lines
