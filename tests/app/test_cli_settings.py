"""A bad TRAINHUB_* variable makes the CLI (and a worker) name it and exit 2, without a
traceback, and a problem of several settings together shows none of their values."""

from __future__ import annotations

import os

from tests.app.cli_shell import trainhub


def test_a_bad_setting_is_named_with_its_value_and_no_traceback():
    result = trainhub({**os.environ, "TRAINHUB_RETENTION_DAYS": "abc"}, "gc", "--dry-run")
    assert result.returncode == 2
    assert "TRAINHUB_RETENTION_DAYS='abc'" in result.stderr and "valid integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_worker_with_a_bad_retry_policy_names_it_and_exits_2():
    result = trainhub({**os.environ, "TRAINHUB_RETRY_POLICY": "bogus=1"}, "worker", "--hardware", "cpu")
    assert result.returncode == 2
    assert "TRAINHUB_RETRY_POLICY='bogus=1'" in result.stderr and "not a failure type" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_wrong_together_show_none_of_their_values():
    env = {**os.environ, "TRAINHUB_MAX_ATTEMPTS": "3", "TRAINHUB_RETRY_POLICY": "worker_lost=1",
           "TRAINHUB_DATABASE_URL": "postgresql+psycopg://app:s3cret@db/trainhub"}
    result = trainhub(env, "gc", "--dry-run")
    assert result.returncode == 2
    assert "drop TRAINHUB_MAX_ATTEMPTS" in result.stderr
    assert "s3cret" not in result.stderr and "Traceback" not in result.stderr
