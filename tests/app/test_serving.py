"""How an API process holds its memory while it serves."""

from __future__ import annotations

import gc


def test_the_startup_heap_is_frozen_while_the_app_serves_and_collectable_after(services_env):
    """A full collection skips what the imports built (app/main.py's lifespan): the request that
    triggers one waits for the objects made since, not for the whole process's."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    gc.unfreeze()  # what a job run in this test process before (workers.warm_up) froze
    with TestClient(create_app()) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 50_000
    assert gc.get_freeze_count() == 0
