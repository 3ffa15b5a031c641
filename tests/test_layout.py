"""The architecture's rules, checked on the source (issue 17): one home for the job's transitions
and its status values, and trainers that take their settings as arguments."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATUSES = {"queued", "running", "succeeded", "failed", "cancelled", "pruned"}
# Where the status values and the row transitions are defined.
STATUS_HOMES = {"app/status.py", "app/lifecycle.py", "app/schemas.py"}


def sources(*packages: str) -> list[Path]:
    return [p for package in packages for p in sorted((ROOT / package).rglob("*.py")) if "migrations" not in p.parts]


def test_only_the_lifecycle_module_updates_the_jobs_table():
    writers = [str(p.relative_to(ROOT)) for p in sources("app", "workers", "bench")
               if re.search(r"update\(Job\b|update\(Job\.__table__", p.read_text())]
    assert writers == ["app/lifecycle.py"]


def test_no_status_is_spelled_as_a_string_outside_its_home():
    found = []
    for path in sources("app", "workers"):
        name = str(path.relative_to(ROOT))
        if name in STATUS_HOMES:
            continue
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING and token.string.strip("\"'") in STATUSES:
                found.append(f"{name}:{token.start[0]}: {token.string}")
    assert found == []


def test_trainers_read_no_environment_variable():
    readers = [str(p.relative_to(ROOT)) for p in sources("trainers") if re.search(r"os\.environ|getenv", p.read_text())]
    assert readers == []
