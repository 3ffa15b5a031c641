"""Every collected test runs under pytest-xdist (`make test`), or the run fails.

xdist schedules tests by node id: two items with one id run as one, silently (Schemathesis gave
each API operation's fuzz test the test function's id, so 35 of 36 never ran). Such items get
their own names as ids here. And a run in which a collected test never reported (a worker that
stopped taking work early) ends as a failure naming the tests that never ran, not green."""

from __future__ import annotations

from collections import Counter

import pytest

_collected: Counter[str] = Counter()
_reported: set[str] = set()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.parent is not None:
            _set_node_id(item, f"{item.parent.nodeid}::{item.name}")


def _set_node_id(item: pytest.Item, nodeid: str) -> None:
    # pytest has no public setter; Schemathesis sets `_nodeid` itself (pytest 8). pytest 9 keeps
    # a parsed NodeId in `_id`.
    if hasattr(item, "_nodeid"):
        item._nodeid = nodeid
    else:
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    if not _collected:
        _collected.update(ids)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _reported.add(report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    twice = sorted(nodeid for nodeid, count in _collected.items() if count > 1)
    missing = sorted(set(_collected) - _reported)
    if not (twice or missing) or exitstatus != pytest.ExitCode.OK:
        return
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return
    terminal.ensure_newline()
    for what, nodeids in (("share a node id (xdist runs one of each)", twice), ("never ran", missing)):
        if nodeids:
            terminal.write_line(f"{len(nodeids)} collected tests {what}, e.g.:", red=True)
            for nodeid in nodeids[:20]:
                terminal.write_line(f"  {nodeid}")
