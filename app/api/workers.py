"""Route of the `workers` resource: who is online, what each serves, and the queue depths."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import select

from app import heartbeats, rendering
from app.api import json_response
from app.deps import CurrentUser, SessionDep
from app.errors import responses
from app.models import Job
from app.schemas import QueueDepth, Worker, WorkerList
from app.status import JobStatus

router = APIRouter(prefix="/workers", tags=["workers"], responses=responses(401, 503))


@router.get("", response_model=WorkerList)
def list_workers(session: SessionDep, user: CurrentUser) -> Response:
    """Workers seen in the last 24 hours, online first, each with its queues, devices, versions
    and current job; and for every queue `<hardware>.<framework>` the queued jobs (everyone's)
    and the online workers serving it. Another user's job is never named: its worker is only `busy`
    (an admin key sees every worker's current job)."""
    since = heartbeats.online_since()
    workers = heartbeats.recent_workers(session)
    # A heartbeat is up to heartbeat_s old: a job it names counts only while its row says running.
    current = {w.current_job_id for w in workers if w.current_job_id}
    running = (
        dict(
            session.execute(
                select(Job.id, Job.owner_id).where(Job.id.in_(current), Job.status == JobStatus.RUNNING)
            ).all()
        )
        if current
        else {}
    )
    online = [w for w in workers if heartbeats.is_online(w, since)]
    depths = heartbeats.queue_depths(session)
    serving = heartbeats.workers_per_queue(online)
    items = [
        Worker(
            name=w.name if user.is_admin else rendering.worker_alias(w.name),
            hostname=w.hostname if user.is_admin else None,
            hardware=w.hardware,
            online=w in online,
            broker_connected=w.broker_ok,
            queues=w.queues,
            devices=w.devices,
            versions=w.versions,
            busy=w in online and w.current_job_id in running,
            current_job_id=w.current_job_id
            if w.current_job_id in running and (user.is_admin or running[w.current_job_id] == user.id)
            else None,
            started_at=w.started_at,
            last_seen=w.last_seen,
        )
        for w in workers
    ]
    items.sort(key=lambda w: not w.online)  # stable: online first, each group most recent first
    return json_response(
        WorkerList(
            workers=items,
            queues=[
                QueueDepth(name=q, depth=depths.get(q, 0), workers_online=serving.get(q, 0))
                for q in sorted(set(depths) | set(serving))
            ],
        )
    )
