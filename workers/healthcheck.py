"""`python -m workers.healthcheck`: exit 0 while a worker on this host has a fresh heartbeat.

A container's health check (docker-compose.yml): the heartbeat thread beats every
`heartbeat_s` while the worker lives, trains or not, so a row of this hostname younger than
`worker_timeout_s` means the worker is up, registered and reaching the database. Imports
neither jax nor torch, so it is cheap to run every few seconds.
"""

from __future__ import annotations

import socket
import sys

from sqlalchemy import select

from app.db import session_scope
from app.heartbeats import online_since
from app.models import Worker


def main() -> int:
    hostname = socket.gethostname()
    try:
        with session_scope() as session:
            fresh = session.scalars(
                select(Worker.name).where(Worker.hostname == hostname, Worker.last_seen >= online_since())
            ).first()
    except Exception as exc:  # the database is away: not healthy, and say why
        print(f"unhealthy: database: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if fresh is None:
        print(f"unhealthy: no fresh heartbeat from a worker on {hostname}", file=sys.stderr)
        return 1
    print(f"healthy: {fresh}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
