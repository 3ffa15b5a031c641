"""User code data parallel: a flax module trained over two host devices by a cpu worker counted
as two (the child inherits the worker's XLA_FLAGS), run here through workers/runner.py on real
PostgreSQL and Redis; PyTorch's DDP stays refused for user code, naming why."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import reset_caches

FLAX = textwrap.dedent('''
    import flax.linen as nn
    import jax


    class MLP(nn.Module):
        classes: int

        @nn.compact
        def __call__(self, x):
            print("devices", jax.device_count())
            return nn.Dense(self.classes)(nn.relu(nn.Dense(32)(x)))


    def build(input_shape, num_classes):
        return MLP(num_classes)
''')


@pytest.fixture
def code_auth(services_env, monkeypatch):
    from app.db import session_scope
    from app.keys import create_key

    monkeypatch.setenv("TRAINHUB_ALLOW_USER_CODE", "1")
    reset_caches()
    with session_scope() as session:
        secret = create_key(session, "parallel coder", admin=True, allow_code=True)[1]
    return {"Authorization": f"Bearer {secret}"}


def test_a_flax_module_trains_data_parallel_on_two_host_devices(api, code_auth, monkeypatch):
    from workers import runner

    # As `trainhub worker --hardware cpu --cpu-devices 2` sets it up (workers/hardware.pin).
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    code = api.post("/code", content=FLAX.encode(), params={"filename": "mlp.py"},
                    headers={**code_auth, "Content-Type": "application/octet-stream"}).json()
    spec = {"framework": "jax", "devices": 2, "dataset": {"name": "digits"}, "batch_size": 64, "epochs": 2,
            "model": {"code": code["id"], "entrypoint": "mlp:build"}}
    created = api.post("/jobs", json=spec, headers=code_auth)
    assert created.status_code == 201, created.text

    worker = {"name": "test:x2", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0", "cpu:1"], "versions": {}}
    assert runner.run(created.json()["id"], worker, serves=["cpu.jax.x2"]) == "succeeded"
    job = api.get(f"/jobs/{created.json()['id']}", headers=code_auth).json()
    assert job["worker"]["devices"] == ["cpu:0", "cpu:1"]  # the mesh the child trained on
    assert [m["epoch"] for m in job["metrics"]] == [1, 2] and job["result"]["test_accuracy"] > 0.5
    logs = api.get(f"/jobs/{job['id']}/artifacts/logs.txt", headers=code_auth).text
    assert "devices 2" in logs

    refused = api.post("/jobs", json={**spec, "framework": "pytorch"}, headers=code_auth)
    assert refused.status_code == 422
    assert "available for jax only" in refused.text and "devices" in refused.text
