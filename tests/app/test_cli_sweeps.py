"""`trainhub sweep` and `trainhub sweeps list|show|cancel`, run as a user runs them
(`python -m app.cli`) against a real uvicorn on PostgreSQL and Redis. Most sweeps here train on
tpu, which no worker serves, so their trials stay queued; one test starts a cpu worker and
watches a small digits sweep to its end."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from app.cli_sweeps import ranked, trials_table
from tests.app.cli_shell import trainhub, user_shell

BASE = {"framework": "jax", "hardware": "tpu", "dataset": {"name": "digits"}, "epochs": 2}
SPACE = {"optimizer.learning_rate": {"log_uniform": [1e-4, 1e-1]}, "batch_size": {"choice": [32, 64]}}
BOX = re.compile("[│╭╮╰╯─┃━┏┓┗┛┡┩└┘┌┐├┤┬┴┼]")



def said(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr as one line, without the boxes typer draws errors in (rich wraps them)."""
    return " ".join(BOX.sub(" ", result.stdout + result.stderr).split())


def write(path: Path, value: object) -> str:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


@pytest.fixture(scope="module")
def cli_env(database_url, redis_url, tmp_path_factory) -> dict[str, str]:
    """The environment of a user's shell: uvicorn serving the API (no worker) and a new key."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    root = tmp_path_factory.mktemp("cli-sweeps")
    # COLUMNS: rich's width when not on a terminal, so table rows stay on one line each
    with user_shell(database_url, redis_url, root, "cli-sweeps", TRAINHUB_COMPILE_CACHE_DIR=str(root / "jax-cache"),
                    COLUMNS="200") as env:
        yield env


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    return {"base": write(tmp_path / "base.json", BASE), "space": write(tmp_path / "space.json", SPACE)}


def sweep_of(env: dict[str, str], sweep_id: str) -> dict:
    shown = trainhub(env, "sweeps", "show", sweep_id, "--json")
    assert shown.returncode == 0, said(shown)
    return json.loads(shown.stdout)


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the rich tables in `text` whose first cell is a trial number."""
    rows = [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in text.splitlines()]
    return [cells for cells in rows if cells and cells[0].isdigit()]


def test_a_sweep_prints_its_id_then_show_list_and_cancel_find_it_by_short_id(cli_env, files):
    options = ("--method", "random", "--max-trials", "4", "--parallelism", "2", "--seed", "3")
    options += ("--early-stopping", "asha", "--min-epochs", "1", "--name", "cli sweep")
    created = trainhub(cli_env, "sweep", "--spec", files["base"], "--space", files["space"], *options)
    assert created.returncode == 0, said(created)
    sweep_id = created.stdout.strip()
    short = sweep_id[:8]
    assert len(created.stdout.splitlines()) == 1 and len(sweep_id) > 8
    assert f"sweep {sweep_id}: up to 4 trials, 2 at a time" in said(created)
    assert f"trainhub sweeps cancel {short}" in said(created)

    shown = sweep_of(cli_env, short)
    sweep, trials = shown["sweep"], shown["trials"]
    assert sweep["id"] == sweep_id and sweep["name"] == "cli sweep" and sweep["status"] == "running"
    assert sweep["spec"]["method"] == "random" and sweep["spec"]["early_stopping"]["method"] == "asha"
    assert [t["status"] for t in trials] == ["queued", "queued"]

    table = trainhub(cli_env, "sweeps", "show", short)
    assert table.returncode == 0, said(table)
    assert f"sweep {short} 'cli sweep' running (random, test_accuracy max, asha from epoch 1)" in table.stdout
    assert "2 of 4 trials: 2 queued" in table.stdout
    for column in ("trial", "status", "optimizer.learning_rate", "batch_size", "epochs", "test_accuracy (max)"):
        assert column in table.stdout
    rows = table_rows(table.stdout)
    assert [row[0] for row in rows] == ["0", "1"]  # no objective yet: in trial order
    for row, trial in zip(rows, trials, strict=True):
        lr, batch = trial["params"]["optimizer.learning_rate"], trial["params"]["batch_size"]
        assert row[1:6] == ["queued", f"{lr:.4g}", str(batch), "0", "-"] and row[6] == trial["job_id"][:8]

    listed = trainhub(cli_env, "sweeps", "list")
    assert listed.returncode == 0, said(listed)
    line = next(line for line in listed.stdout.splitlines() if short in line)
    assert "running" in line and "cli sweep" in line and "0/4" in line
    as_json = trainhub(cli_env, "sweeps", "list", "--json", "--limit", "5")
    assert sweep_id in [s["id"] for s in json.loads(as_json.stdout)]

    cancelled = trainhub(cli_env, "sweeps", "cancel", short)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "cancelled", said(cancelled)
    after = sweep_of(cli_env, short)
    assert after["sweep"]["status"] == "cancelled" and {t["status"] for t in after["trials"]} == {"cancelled"}
    again = trainhub(cli_env, "sweeps", "cancel", sweep_id)
    assert again.returncode == 0 and again.stdout.strip() == "cancelled", said(again)

    missing = trainhub(cli_env, "sweeps", "show", "0" * 8)
    assert missing.returncode == 1 and "not found" in said(missing)


def test_sweep_spec_gives_the_whole_body_and_an_option_overrides_it_saying_so(cli_env, tmp_path):
    body = {"base": BASE, "space": SPACE, "max_trials": 3, "parallelism": 1, "objective": {"metric": "test_loss"}}
    path = write(tmp_path / "sweep.json", body)
    created = trainhub(cli_env, "sweep", "--sweep-spec", path, "--max-trials", "2", "--direction", "min", "--json")
    assert created.returncode == 0, said(created)
    assert "--max-trials 2 replaces the --sweep-spec file's max_trials" in said(created)
    shown = json.loads(created.stdout)
    spec = shown["sweep"]["spec"]
    assert spec["max_trials"] == 2 and spec["objective"] == {"metric": "test_loss", "direction": "min"}
    assert len(shown["trials"]) == 1 and shown["trials"][0]["status"] == "queued"
    assert trainhub(cli_env, "sweeps", "cancel", shown["sweep"]["id"]).returncode == 0


@pytest.mark.parametrize(
    "args,says",
    [
        (("--space", "{missing}"), "--space: cannot read JSON from"),
        (("--space", "{list}"), "--space: {list} holds a JSON list, not an object of dotted paths"),
        (("--space", "{twice}"), "--space: {twice} names the key 'batch_size' twice in one object"),
        (("--spec", "{not_json}"), "--spec: cannot read JSON from {not_json}"),
        (("--space", None), "--space: no search space: give --space space.json"),
        (("--spec", None), "--spec: no base job spec: give --spec base.json"),
        (("--min-epochs", "2"), "--min-epochs: --min-epochs needs --early-stopping median or asha"),
        (("--method", "bayes"), "--method"),
        (("--direction", "up"), "--direction"),
        (("--max-trials", "0"), "--max-trials"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_option(cli_env, files, tmp_path, args, says):
    paths = {
        "{missing}": str(tmp_path / "missing.json"),
        "{list}": write(tmp_path / "list.json", [1, 2]),
        "{twice}": write(tmp_path / "twice.json", '{"batch_size": {"choice": [32]}, "batch_size": {"grid": [64]}}'),
        "{not_json}": write(tmp_path / "not.json", "{base: 1"),
    }
    given = {"--spec": files["base"], "--space": files["space"]}
    option, value = args
    if value is None:
        del given[option]
    else:
        given[option] = paths.get(value, value)
    refused = trainhub(cli_env, "sweep", *[part for pair in given.items() for part in pair])
    assert refused.returncode == 2 and refused.stdout == "", said(refused)
    for placeholder, path in paths.items():
        says = says.replace(placeholder, path)
    assert says in said(refused)


@pytest.mark.parametrize(
    "space,args,says",
    [
        ({"optimizer.lr": {"uniform": [0.1, 0.2]}}, (), "space.optimizer.lr (--space): "),
        (
            {"batch_size": {"grid": [16, 32, 64]}},
            ("--method", "grid", "--max-trials", "2"),
            "max_trials (--max-trials): ",
        ),
        (SPACE, ("--objective", "epoch_time_s"), "objective.metric (--objective): "),
        (SPACE, ("--max-total-s", "0"), "max_total_s (--max-total-s): "),
        (SPACE, ("--early-stopping", "asha", "--min-epochs", "2"), "early_stopping.min_epochs (--min-epochs): "),
    ],
)
def test_a_sweep_the_server_refuses_exits_1_naming_the_field_and_its_option(
    cli_env, files, tmp_path, space, args, says
):
    space_file = write(tmp_path / "space.json", space)
    before = json.loads(trainhub(cli_env, "sweeps", "list", "--json").stdout)
    refused = trainhub(cli_env, "sweep", "--spec", files["base"], "--space", space_file, *args)
    assert refused.returncode == 1 and refused.stdout == "", said(refused)
    assert "error: the server refused the sweep (HTTP 422):" in said(refused) and says in said(refused)
    assert json.loads(trainhub(cli_env, "sweeps", "list", "--json").stdout) == before  # nothing created


def test_a_base_spec_the_server_refuses_names_the_spec_file(cli_env, files, tmp_path):
    base = write(tmp_path / "bad-base.json", {**BASE, "epochs": 0})
    refused = trainhub(cli_env, "sweep", "--spec", base, "--space", files["space"])
    assert refused.returncode == 1 and "base.epochs (--spec): " in said(refused), said(refused)


def test_timeout_without_wait_is_refused(cli_env, files):
    refused = trainhub(cli_env, "sweep", "--spec", files["base"], "--space", files["space"], "--timeout", "5")
    assert refused.returncode == 1 and "--timeout is for --wait" in said(refused)


def test_wait_past_timeout_exits_124_and_the_sweep_goes_on(cli_env, files):
    watched = trainhub(cli_env, "sweep", "--spec", files["base"], "--space", files["space"], "--wait", "--timeout", "1")
    assert watched.returncode == 124, said(watched)
    sweep_id = re.search(r"sweep ([\w-]+): up to", said(watched)).group(1)
    assert f"still running after 1 s; sweep {sweep_id[:8]} goes on" in said(watched)
    assert f"trainhub sweeps cancel {sweep_id[:8]}" in said(watched)
    assert table_rows(watched.stderr)  # the last frame of the table: its queued trials
    assert sweep_of(cli_env, sweep_id)["sweep"]["status"] == "running"
    assert trainhub(cli_env, "sweeps", "cancel", sweep_id).returncode == 0


def test_ctrl_c_stops_watching_not_the_sweep_and_says_how_to_cancel(cli_env, files):
    args = [sys.executable, "-m", "app.cli", "sweep", "--spec", files["base"], "--space", files["space"], "--wait"]
    # A run started in the background (CI's may be) ignores SIGINT, and Python then keeps ignoring
    # it: the child gets the default back, as a terminal's foreground process has it.
    watching = subprocess.Popen(args, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = watching.stderr.readline()  # the sweep's id, said before the table starts
    sweep_id = re.search(r"sweep ([\w-]+): up to", first).group(1)
    time.sleep(1.5)  # into the live table's polling
    watching.send_signal(signal.SIGINT)
    stdout, stderr = watching.communicate(timeout=30)
    assert watching.returncode == 130, first + stderr
    text = " ".join(stderr.split())
    assert f"stopped watching; sweep {sweep_id[:8]} goes on (`trainhub sweeps cancel {sweep_id[:8]}` ends it)" in text
    assert sweep_of(cli_env, sweep_id)["sweep"]["status"] == "running"
    assert trainhub(cli_env, "sweeps", "cancel", sweep_id).returncode == 0


def test_wait_shows_the_trials_best_first_and_ends_with_the_best_one(cli_env, tmp_path):
    """A cpu worker trains a grid of three learning rates on digits, one epoch each."""
    base = write(tmp_path / "base.json", {**BASE, "hardware": "cpu", "epochs": 1})
    space = write(tmp_path / "space.json", {"optimizer.learning_rate": {"grid": [1e-4, 1e-2, 1e-3]}})
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--hardware", "cpu", "--frameworks", "jax"],
        env=cli_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        args = ("--method", "grid", "--max-trials", "3", "--parallelism", "2", "--wait", "--timeout", "240", "--json")
        watched = trainhub(cli_env, "sweep", "--spec", base, "--space", space, *args, timeout=300)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
    assert watched.returncode == 0, said(watched)
    done = json.loads(watched.stdout)
    sweep, trials = done["sweep"], done["trials"]
    assert sweep["status"] == "succeeded" and [t["status"] for t in trials] == ["succeeded"] * 3

    rows = table_rows(watched.stderr)  # piped, the live table prints its last frame only
    best_first = sorted(trials, key=lambda t: (-t["objective"], t["number"]))
    assert [row[0] for row in rows] == [str(t["number"]) for t in best_first]
    for row, trial in zip(rows, best_first, strict=True):
        assert row[1:5] == [
            "succeeded",
            f"{trial['params']['optimizer.learning_rate']:.4g}",
            "1",
            f"{trial['objective']:.4f}",
        ]
    best = sweep["best"]
    assert best["number"] == best_first[0]["number"]
    lr = best["params"]["optimizer.learning_rate"]
    assert (
        f"sweep succeeded; best: trial {best['number']} (job {best['job_id'][:8]}), "
        f"test_accuracy {best['objective']:.4f}, with optimizer.learning_rate={lr:.4g}"
    ) in said(watched)


def trial(number: int, status: str, objective: float | None, **more: object) -> dict:
    return {
        "number": number,
        "status": status,
        "objective": objective,
        "params": {"batch_size": 32},
        "epochs": 1,
        "job_id": f"job{number:05d}",
        "pruned_at_epoch": None,
        **more,
    }


def test_ranked_puts_the_best_objective_first_for_either_direction_and_none_last():
    trials = [
        trial(0, "running", None),
        trial(1, "succeeded", 0.5),
        trial(2, "pruned", 0.9),
        trial(3, "queued", None),
        trial(4, "succeeded", 0.7),
        trial(5, "succeeded", 0.5),
    ]
    assert [t["number"] for t in ranked(trials, "max")] == [2, 4, 1, 5, 0, 3]
    assert [t["number"] for t in ranked(trials, "min")] == [1, 5, 4, 2, 0, 3]


def test_the_table_shows_where_a_pruned_trial_stopped():
    sweep = {
        "id": "abcdef0123456789",
        "best": {"number": 1},
        "spec": {"space": {"batch_size": {"choice": [32]}}, "objective": {"metric": "test_loss", "direction": "min"}},
    }
    trials = [trial(0, "pruned", 0.9, pruned_at_epoch=2, epochs=2), trial(1, "succeeded", 0.3, epochs=4)]
    console = Console(record=True, width=200)
    console.print(trials_table(sweep, trials))
    rows = table_rows(console.export_text())
    assert rows == [
        ["1", "succeeded", "32", "4", "0.3000", "job00001"],
        ["0", "pruned at epoch 2", "32", "2", "0.9000", "job00000"],
    ]
    console = Console(record=True, width=200)
    console.print(trials_table(sweep, trials, rows=1))
    assert "… and 1 more: `trainhub sweeps show abcdef01`" in console.export_text()
