"""What `trainhub watch` and `submit --wait` show as a job goes (issue 16, item 14)."""

from __future__ import annotations

from app.cli import ProgressText
from app.client import Event


def event(kind: str, data: dict) -> Event:
    return Event(id=None, event=kind, data=data)


METRICS = {"epoch": 1, "train_loss": 0.5, "test_accuracy": 0.8, "epoch_time_s": 2.0, "eval_time_s": 0.0}


def test_an_epoch_shows_loss_accuracy_and_an_eta_and_the_final_status_replaces_the_eta():
    text = ProgressText(epochs=5)
    shown = text.after(event("metrics", METRICS))
    assert shown == "loss 0.5000  test acc 0.8000  ETA 0:00:08"
    assert text.after(event("status", {"status": "cancelled"})) == "loss 0.5000  test acc 0.8000  cancelled"


def test_a_waiting_job_says_why_and_a_job_cancelled_while_queued_says_so():
    text = ProgressText(epochs=5)
    assert text.after(event("status", {"status": "queued"})) == "queued"
    shown = text.after(event("waiting", {"waiting_reason": "no online worker serves gpu.jax"}))
    assert shown == "waiting: no online worker serves gpu.jax"
    assert text.after(event("status", {"status": "cancelled"})) == "cancelled"
