"""The README's "Failures and retries" is the closed list app/failures.py holds: every type once,
the ones a policy may not name marked "never", and its policy example a valid setting."""

from __future__ import annotations

import re
from pathlib import Path

from app.failures import CLASSES, FailureType, parse_policy

README = Path(__file__).resolve().parent.parent / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("### Failures and retries")
    return text[start : text.index("\n### ", start + 1)]


def test_the_readme_table_is_the_closed_list():
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|(.*)\|$", section(), re.M))
    assert sorted(rows) == sorted(t.value for t in FailureType)
    for kind, known in CLASSES.items():
        policy_column = rows[kind.value].rsplit("|", 1)[-1].strip()
        assert policy_column.startswith("never") == (not known.retryable), kind

def test_the_readme_policy_example_is_a_valid_setting():
    example = re.search(r"`TRAINHUB_RETRY_POLICY=([^`]+)`", section()).group(1)
    assert parse_policy(example) == {FailureType.WORKER_LOST: 2, FailureType.OUT_OF_MEMORY: 1}
