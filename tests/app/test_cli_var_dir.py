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


def test_up_on_a_port_in_use_says_so_and_starts_nothing(tmp_path, monkeypatch):
    import socket

    from app import stack
    from app.cli import cli

    monkeypatch.setattr(stack, "start", lambda *args: (_ for _ in ()).throw(AssertionError("started")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["up", "--port", str(port), "--var-dir", str(tmp_path / "v")])
    assert result.exit_code == 1
    assert f"port {port} on 127.0.0.1 is already in use" in " ".join(result.output.split())
    assert not (tmp_path / "v" / "trainhub.db").exists()


def test_submit_timeout_needs_wait_and_a_positive_number():
    from app.cli import cli

    alone = CliRunner().invoke(cli, ["submit", "--timeout", "3"])
    assert alone.exit_code == 1 and "--timeout is for --wait" in " ".join(alone.output.split())
    assert CliRunner().invoke(cli, ["submit", "--wait", "--timeout", "0"]).exit_code == 2
