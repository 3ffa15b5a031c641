"""A job's server-sent events: ids that make resuming exact, and the stream over HTTP."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from app.events import Event, JobState, events_after, final_id, parse_last_event_id

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 3}


def state(status: str, epoch: int = 0, epochs: int = 3, started: bool = True) -> JobState:
    finished = status in ("succeeded", "failed", "cancelled")
    return JobState(status=status, framework="jax", hardware="cpu", epochs=epochs, epoch=epoch, attempts=1,
                    created_at=T0, started_at=T0 if started else None, finished_at=T0 if finished else None,
                    result={"test_accuracy": 0.9} if status == "succeeded" else None,
                    error={"type": "internal", "message": "it broke"} if status == "failed" else None,
                    timings=None, worker=None)


def metric(epoch: int) -> dict:
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "train_accuracy": 0.5, "test_loss": 1.0, "test_accuracy": 0.5,
            "epoch_time_s": 0.1, "eval_time_s": 0.01, "samples_per_s": 10.0}


def test_a_finished_job_replays_its_whole_story_in_order():
    events = events_after(state("succeeded", epoch=3), [metric(1), metric(2), metric(3)], last_id=-1)
    assert [(e.id, e.event) for e in events] == [
        (0, "status"), (1, "status"), (2, "metrics"), (3, "metrics"), (4, "metrics"), (5, "status")]
    assert [e.data["status"] for e in events if e.event == "status"] == ["queued", "running", "succeeded"]
    assert events[-1].id == final_id(3) and events[-1].data["result"] == {"test_accuracy": 0.9}
    assert [e.data["epoch"] for e in events if e.event == "metrics"] == [1, 2, 3]


def test_resuming_after_any_id_gives_exactly_the_rest():
    full = events_after(state("succeeded", epoch=3), [metric(1), metric(2), metric(3)], last_id=-1)
    for cut in range(-1, final_id(3) + 1):
        rest = events_after(state("succeeded", epoch=3), [metric(1), metric(2), metric(3)], last_id=cut)
        assert [e.id for e in rest] == [e.id for e in full if e.id > cut]


def test_a_job_cancelled_while_queued_never_ran():
    events = events_after(state("cancelled", started=False), [], last_id=-1)
    assert [(e.id, e.data["status"]) for e in events] == [(0, "queued"), (5, "cancelled")]


def test_a_queued_job_is_only_queued_and_a_failed_one_says_why():
    queued = events_after(state("queued", started=False), [], -1)
    assert [e.data for e in queued] == [{"status": "queued", "at": "2026-01-01T00:00:00Z", "progress": {"epoch": 0, "epochs": 3}}]
    failed = events_after(state("failed", epoch=1), [metric(1)], last_id=2)
    assert [(e.id, e.data["status"], e.data["error"]["type"]) for e in failed] == [(5, "failed", "internal")]


def test_a_job_a_lost_worker_left_keeps_the_epochs_it_ran():
    # back to queued with started_at kept (workers/reconciler.py): it ran, and its epochs stand
    requeued = events_after(state("queued", epoch=2), [metric(1), metric(2)], last_id=-1)
    assert [(e.id, e.event) for e in requeued] == [(0, "status"), (1, "status"), (2, "metrics"), (3, "metrics")]


def test_encoding_is_one_json_line_and_has_no_nan():
    text = Event(3, "metrics", {"epoch": 2, "train_loss": float("nan")}).encode()
    assert text == 'id: 3\nevent: metrics\ndata: {"epoch":2,"train_loss":null}\n\n'
    assert Event(None, "waiting", {"waiting_reason": "x"}).encode().startswith("event: waiting\n")


def test_last_event_id_that_is_not_ours_replays_everything():
    assert parse_last_event_id(None) == parse_last_event_id("garbage") == -1
    assert parse_last_event_id("7") == 7


def read_stream(api, job_id, headers) -> list[tuple[str | None, str, dict]]:
    events, current = [], {}
    with api.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if "data" in current:
                    events.append((current.get("id"), current["event"], json.loads(current["data"])))
                current = {}
            elif not line.startswith(":"):
                field, _, value = line.partition(": ")
                current[field] = value
    return events


def test_stream_of_a_finished_job_over_http_ends_and_resumes(api, auth, rows):
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    rows.start(job["id"])
    for epoch in (1, 2, 3):
        rows.epoch(job["id"], epoch, loss=1.0 / epoch)
    rows.finish(job["id"], result={"test_accuracy": 0.9, "test_loss": 0.3})
    events = read_stream(api, job["id"], auth)
    assert [e[0] for e in events] == ["0", "1", "2", "3", "4", "5"]
    assert events[-1][2]["status"] == "succeeded"
    assert [e[2]["train_loss"] for e in events if e[1] == "metrics"] == [1.0, 0.5, 1 / 3]
    resumed = read_stream(api, job["id"], {**auth, "Last-Event-ID": "2"})
    assert resumed == events[3:]
    assert read_stream(api, job["id"], {**auth, "Last-Event-ID": "5"}) == []
    assert read_stream(api, job["id"][:8], auth) == events  # the short id the CLI shows: `trainhub watch`


def test_a_last_event_id_of_any_size_is_clamped_before_any_query(api, auth, rows):
    """Issue 16, item 4: 2147483649 overflowed PostgreSQL's integer mid-stream (a traceback)."""
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    rows.start(job["id"])
    rows.epoch(job["id"], 1)
    rows.finish(job["id"], result={"test_accuracy": 0.9, "test_loss": 0.3})
    whole = read_stream(api, job["id"], auth)
    for header in ("2147483649", "9" * 40, "-2147483649", "1e9", " 3 "):
        events = read_stream(api, job["id"], {**auth, "Last-Event-ID": header})
        after_3 = [e for e in whole if int(e[0]) > 3]
        assert events in ([], whole, after_3), header  # past the end, replayed, or after 3
    assert parse_last_event_id("99999999999") == final_id(1000)  # MAX_EPOCHS
    assert parse_last_event_id("-5") == -1


def test_stream_of_a_cancelled_queued_job(api, auth):
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    api.post(f"/jobs/{job['id']}/cancel", headers=auth)
    events = read_stream(api, job["id"], auth)
    assert [(e[0], e[2]["status"]) for e in events] == [("0", "queued"), ("5", "cancelled")]


def test_stream_of_a_queued_job_says_why_it_waits(api, auth, monkeypatch):
    from app import events

    job = api.post("/jobs", json={**DIGITS, "hardware": "gpu"}, headers=auth).json()
    seen = []
    # stop the otherwise endless stream of a waiting job after its first poll
    monkeypatch.setattr(events, "POLL_S", 0.01)

    with api.stream("GET", f"/jobs/{job['id']}/events", headers=auth) as response:
        for line in response.iter_lines():
            seen.append(line)
            if line.startswith("data:") and "waiting_reason" in line:
                break
    assert "event: waiting" in seen
    assert json.loads(seen[-1][len("data: "):]) == {"waiting_reason": "no online worker serves gpu.jax"}


def test_stream_needs_the_owners_key(api, auth, make_key):
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    assert api.get(f"/jobs/{job['id']}/events").status_code == 401
    assert api.get(f"/jobs/{job['id']}/events", headers={"Authorization": "Bearer th_wrong"}).status_code == 401
    other = {"Authorization": f"Bearer {make_key('other')}"}
    response = api.get(f"/jobs/{job['id']}/events", headers=other)
    assert response.status_code == 404 and "not found" in response.json()["detail"]
