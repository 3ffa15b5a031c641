"""A worker runs only jobs of the queues it checked it can serve, and a job never falls back to
the CPU: a misrouted message is sent back unclaimed, and a trainer that does not get the
backend the job asks for fails the job."""

from __future__ import annotations

import redis

GPU_JOB = {"framework": "jax", "hardware": "gpu", "dataset": {"name": "digits"}, "epochs": 1}


def test_a_message_for_hardware_the_worker_lacks_is_never_run(api, auth, redis_url):
    from workers import identity, tasks
    from workers.hardware import Capabilities

    broker = redis.Redis.from_url(redis_url)
    job = api.post("/jobs", json=GPU_JOB, headers=auth).json()
    assert broker.llen("gpu.jax") == 1
    # A cpu worker gets the id anyway (sent to its queue by hand, or by a misconfigured API).
    identity.register(Capabilities(hardware="cpu", queues=["cpu.jax", "cpu.pytorch"], devices=["cpu:0"]))
    assert tasks.run_job(job["id"]) == "misrouted"
    after = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert after["status"] == "queued" and after["attempts"] == 0
    assert after["started_at"] is None and after["worker"] is None
    assert broker.llen("gpu.jax") == 2  # sent back to its own queue for a gpu worker
    assert broker.llen("cpu.jax") == 0


def test_a_trainer_without_the_backend_fails_the_job_instead_of_using_the_cpu(api, auth):
    from workers import runner

    job = api.post("/jobs", json=GPU_JOB, headers=auth).json()
    # A worker that believes it serves gpu.jax (its check passed, then the device went away).
    worker = {"name": "test:1", "hostname": "test", "hardware": "gpu", "devices": ["gpu:0"], "versions": {}}
    assert runner.run(job["id"], worker, serves=["gpu.jax"]) == "failed"
    after = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert after["status"] == "failed" and after["error"]["type"] == "hardware_mismatch"
    assert "'gpu'" in after["error"]["message"] and "cpu" in after["error"]["message"]
    assert after["metrics"] == [] and after["artifacts"] == []
