"""What `trainhub watch` and `submit --wait` show as a job goes (issue 16, item 14)."""

from __future__ import annotations

from app.cli import progress_info
from app.client import Event


def event(kind: str, data: dict) -> Event:
    return Event(id=None, event=kind, data=data)


def test_an_epoch_shows_loss_accuracy_and_an_eta_and_a_final_status_replaces_the_eta():
    epoch_s: list[float] = []
    metrics = {"epoch": 1, "train_loss": 0.5, "test_accuracy": 0.8, "epoch_time_s": 2.0, "eval_time_s": 0.0}
    shown = progress_info(event("metrics", metrics), epoch_s, epochs=5)
    assert "loss 0.5000" in shown and "test acc 0.8000" in shown and "ETA 0:00:08" in shown
    assert progress_info(event("status", {"status": "cancelled"}), epoch_s, epochs=5) == "cancelled"


def test_a_waiting_job_says_why():
    shown = progress_info(event("waiting", {"waiting_reason": "no online worker serves gpu.jax"}), [], epochs=5)
    assert shown == "waiting: no online worker serves gpu.jax"
