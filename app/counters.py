"""Named totals kept in the database (the `counters` table, app/models.Counter).

/metrics reports them, so they must survive a restart and read the same from every API process:
a process's own memory does neither. Add to a counter in the transaction that does what it
counts (retention adds its deleted rows in the transaction that deletes them), so the two
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from app.models import Counter


def add(session: Session, amounts: Mapping[str, int]) -> None:
    """Add each amount to its counter in the session's transaction (not committed here); a
    counter that has no row yet starts at 0. Row locks are taken in name order, so concurrent
    transactions adding to the same counters wait for each other rather than deadlock."""
    for name, amount in sorted(amounts.items()):
        if not amount:
            continue
        result = cast(
            CursorResult,
            session.execute(update(Counter).where(Counter.name == name).values(value=Counter.value + amount)),
        )
        if result.rowcount == 0:
            session.add(Counter(name=name, value=amount))
            session.flush()


def read(session: Session, names: Iterable[str]) -> dict[str, int]:
    """The value of each of `names` (0 for a counter without a row)."""
    wanted = list(names)
    stored = {
        name: value
        for name, value in session.execute(select(Counter.name, Counter.value).where(Counter.name.in_(wanted)))
    }
    return {name: stored.get(name, 0) for name in wanted}
