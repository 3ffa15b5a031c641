"""`trainhub up` keeps the embedded stack under TRAINHUB_VAR_DIR when --var-dir is not given."""

from __future__ import annotations

from typer.testing import CliRunner


class Started(Exception):
    """Raised by the stand-in for stack.start: the test needs only where `up` put the stack."""


def test_up_uses_trainhub_var_dir(tmp_path, monkeypatch):
    from app import stack
    from app.cli import cli

    started = []

    def start(var_dir, *_args):
        started.append(var_dir)
        raise Started

    monkeypatch.setattr(stack, "start", start)
    monkeypatch.setenv("TRAINHUB_VAR_DIR", str(tmp_path / "stack"))
    result = CliRunner().invoke(cli, ["up", "--port", "0"])
    assert isinstance(result.exception, Started)
    assert started == [(tmp_path / "stack").resolve()]
    assert (tmp_path / "stack" / "trainhub.db").exists()  # migrated there, with the key `up` prints
