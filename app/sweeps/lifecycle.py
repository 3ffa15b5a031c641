"""A sweep's row transitions, each one compare-and-set UPDATE (as app/lifecycle.py does for jobs).

| transition | from              | to                   | by                    |
|------------|-------------------|----------------------|-----------------------|
| take_turn  | any               | (advanced_at = now)  | API, worker, reconciler: the row lock of advance |
| finish     | running           | succeeded / failed   | advance, once every trial ended and no more will start |
| cancel     | running           | cancelled            | API (the trials' jobs are cancelled with it) |

Nothing else writes a sweep's status.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from app.models import Sweep, utcnow
from app.status import SweepStatus


def take_turn(session: Session, sweep_id: str) -> SweepStatus | None:
    """Lock the sweep's row for the rest of the transaction (one process advances it at a time:
    PostgreSQL's row lock; SQLite's database write lock) and return its status; None when there
    is no such sweep. Does not commit."""
    status = session.execute(
        update(Sweep).where(Sweep.id == sweep_id).values(advanced_at=utcnow()).returning(Sweep.status)
    ).scalar()
    return SweepStatus(status) if status else None


def finish(session: Session, sweep_id: str, status: SweepStatus) -> bool:
    """running -> succeeded or failed. Does not commit (advance commits its turn)."""
    assert status in (SweepStatus.SUCCEEDED, SweepStatus.FAILED), status
    result = cast(
        CursorResult,
        session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.status == SweepStatus.RUNNING)
            .values(status=status, finished_at=utcnow())
        ),
    )
    return result.rowcount == 1


def cancel(session: Session, sweep_id: str) -> bool:
    """running -> cancelled; False when it had already ended. Commits."""
    result = cast(
        CursorResult,
        session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.status == SweepStatus.RUNNING)
            .values(status=SweepStatus.CANCELLED, finished_at=utcnow())
        ),
    )
    session.commit()
    return result.rowcount == 1
