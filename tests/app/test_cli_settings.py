"""A bad TRAINHUB_* variable makes the CLI name it and exit 2, without a traceback."""

from __future__ import annotations

import os

from tests.app.cli_shell import trainhub


def test_a_bad_setting_is_named_with_its_value_and_no_traceback():
    result = trainhub({**os.environ, "TRAINHUB_RETENTION_DAYS": "abc"}, "gc", "--dry-run")
    assert result.returncode == 2
    assert "TRAINHUB_RETENTION_DAYS='abc'" in result.stderr and "valid integer" in result.stderr
    assert "Traceback" not in result.stderr
