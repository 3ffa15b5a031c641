"""`trainhub sweep` and `trainhub sweeps list|show|cancel`: hyperparameter searches from the
command line, over the API's /sweeps (app/sweeps/spec.py says what a sweep is).

app/cli.py registers these commands at its end (`register`). The helpers of app/cli.py (the
client from TRAINHUB_* settings, the one-line errors, the stderr console) are imported inside the
functions, when a command runs: imported here at the top, app/cli.py and this module would import
each other while neither is complete (and under `python -m app.cli` the commands would land on a
second copy of `cli`, not on the one that runs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from app.client import ApiError, TrainhubClient
from app.status import FINISHED, JobStatus, SweepStatus

sweeps_cli = typer.Typer(help="Your hyperparameter sweeps: list, show, cancel.", no_args_is_help=True)

# The options of `sweep` that set a field of the sweep spec, each with the field's path. None (not
# given) leaves the field to the --sweep-spec file, or to the API's default.
SWEEP_OPTIONS = {
    "objective": ("objective", "metric"),
    "direction": ("objective", "direction"),
    "method": ("method",),
    "max_trials": ("max_trials",),
    "parallelism": ("parallelism",),
    "max_total_s": ("max_total_s",),
    "early_stopping": ("early_stopping", "method"),
    "min_epochs": ("early_stopping", "min_epochs"),
    "seed": ("seed",),
    "name": ("name",),
}
# A field's dotted path -> the option that sets it, so a 422 says what to change on the command line.
FIELD_OPTION = {
    "base": "--spec",
    "space": "--space",
    **{".".join(path): "--" + option.replace("_", "-") for option, path in SWEEP_OPTIONS.items()},
}
SPACE_EXAMPLE = '{"optimizer.learning_rate": {"log_uniform": [0.0001, 0.1]}, "batch_size": {"choice": [32, 64]}}'
STATUS_STYLE = {
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.PRUNED: "yellow",
    JobStatus.CANCELLED: "dim",
    JobStatus.RUNNING: "cyan",
}
# Terminal lines the live view keeps for its header, the table's borders and its caption.
LIVE_CHROME_LINES = 8


class Direction(StrEnum):
    """Whether a higher objective is better (max) or a lower one (min)."""

    max = "max"
    min = "min"


class Method(StrEnum):
    """How trials pick their values (SweepSpec.method)."""

    tpe = "tpe"
    random = "random"
    grid = "grid"


class Pruner(StrEnum):
    """How losing trials are stopped early (SweepSpec.early_stopping.method)."""

    median = "median"
    asha = "asha"


def register(cli: typer.Typer) -> None:
    """Add `sweep` and the `sweeps` group to the `trainhub` command line."""
    cli.command("sweep")(sweep)
    cli.add_typer(sweeps_cli, name="sweeps")


# --- trainhub sweep --------------------------------------------------------------------------


def sweep(
    spec_file: Annotated[
        Optional[Path],
        typer.Option(
            "--spec", help="the base job spec (JSON, as for `trainhub submit --spec`) every trial starts from"
        ),
    ] = None,
    space_file: Annotated[
        Optional[Path],
        typer.Option("--space", help=f"JSON: dotted spec field -> the values to search, e.g. {SPACE_EXAMPLE}"),
    ] = None,
    objective: Annotated[
        Optional[str], typer.Option(help="the per-epoch metric trials are judged by (default test_accuracy)")
    ] = None,
    direction: Annotated[Optional[Direction], typer.Option(help="whether more is better (default max)")] = None,
    method: Annotated[Optional[Method], typer.Option(help="how trials pick their values (default tpe)")] = None,
    max_trials: Annotated[Optional[int], typer.Option(min=1, help="default 10")] = None,
    parallelism: Annotated[
        Optional[int], typer.Option(min=1, help="most trials queued or running at once (default 2)")
    ] = None,
    max_total_s: Annotated[
        Optional[float], typer.Option(help="budget: no new trial starts once the trials' train time passes it (s)")
    ] = None,
    early_stopping: Annotated[
        Optional[Pruner], typer.Option(help="stop trials doing worse than the others at the same epoch")
    ] = None,
    min_epochs: Annotated[
        Optional[int], typer.Option(min=1, help="with --early-stopping: no trial stops before it (default 1)")
    ] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, help="the sampler's seed (default 0)")] = None,
    name: Optional[str] = None,
    sweep_file: Annotated[
        Optional[Path],
        typer.Option("--sweep-spec", help="the whole POST /sweeps body (JSON); options given with it override it"),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="show a live table of the trials until it ends")
    ] = False,
    timeout: Annotated[
        Optional[float], typer.Option(min=0.1, help="with --wait: stop watching after this many seconds (exit 124)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help='print {"sweep": Sweep, "trials": [Trial]} as JSON')] = False,
) -> None:
    """Search hyperparameters: trials of a job spec over a space of its fields; prints the sweep's id.

    Each trial is a job: the base spec (--spec) with values of the space (--space) set. With
    --wait, a live table of the trials, best first, until the sweep ends, then the best trial:
    exits 0 when the sweep succeeded, 1 otherwise (130 on Ctrl-C, which stops watching, not the
    sweep; 124 after --timeout)."""
    from app.cli import call, client_from_settings, console

    if timeout is not None and not wait:
        fail("--timeout is for --wait: it says how long to watch the sweep")
    body = sweep_body(
        sweep_file,
        spec_file,
        space_file,
        objective=objective,
        direction=direction,
        method=method,
        max_trials=max_trials,
        parallelism=parallelism,
        max_total_s=max_total_s,
        early_stopping=early_stopping,
        min_epochs=min_epochs,
        seed=seed,
        name=name,
    )
    with client_from_settings() as client:
        created = submit_sweep(client, body)
        console.print(started_line(created))
        if wait:
            created, trials = watch(client, created, timeout)
        else:
            trials = call(client.trials, created["id"])
    if as_json:
        print(json.dumps({"sweep": created, "trials": trials}, indent=2))
    else:
        print(created["id"])
    if wait and created["status"] != SweepStatus.SUCCEEDED:
        raise typer.Exit(1)


def sweep_body(sweep_file: Path | None, spec_file: Path | None, space_file: Path | None, **options: Any) -> dict:
    """The POST /sweeps body: the --sweep-spec file's (or nothing), then the --spec file as its
    base and the --space file as its space, then each option given on its field (SWEEP_OPTIONS).
    BadParameter naming the option when a file is unreadable or not a JSON object, or when the
    base, the space or --early-stopping (for --min-epochs) is missing."""
    body = read_json_object(sweep_file, "--sweep-spec", "fields of a sweep spec") if sweep_file else {}
    if spec_file is not None:
        set_field(body, ("base",), read_json_object(spec_file, "--spec", "fields of a job spec"))
    if space_file is not None:
        set_field(body, ("space",), read_json_object(space_file, "--space", "dotted paths"))
    for option, value in options.items():
        if value is not None:
            set_field(body, SWEEP_OPTIONS[option], value.value if isinstance(value, StrEnum) else value)
    if not isinstance(body.get("base"), dict):
        raise typer.BadParameter(
            "no base job spec: give --spec base.json (a job spec, as for `trainhub submit --spec`), "
            'or a --sweep-spec file with a "base" object',
            param_hint="--spec",
        )
    if not isinstance(body.get("space"), dict):
        raise typer.BadParameter(
            f"no search space: give --space space.json holding e.g. {SPACE_EXAMPLE}, "
            'or a --sweep-spec file with a "space" object',
            param_hint="--space",
        )
    if options.get("min_epochs") is not None and not (body.get("early_stopping") or {}).get("method"):
        raise typer.BadParameter("--min-epochs needs --early-stopping median or asha", param_hint="--min-epochs")
    return body


def read_json_object(path: Path, option: str, holding: str) -> dict:
    """The JSON object in `path` (a key named twice in one object is refused, as `submit --spec`
    refuses it); BadParameter naming `option` when it is unreadable, not JSON or not an object."""
    from app.middleware import DuplicateKey, refuse_duplicate_keys

    try:
        found = json.loads(path.read_text(), object_pairs_hook=refuse_duplicate_keys)
    except DuplicateKey as exc:
        raise typer.BadParameter(
            f"{path} names the key {exc.key!r} twice in one object; keep one", param_hint=option
        ) from None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read JSON from {path}: {exc}", param_hint=option) from None
    if not isinstance(found, dict):
        raise typer.BadParameter(
            f"{path} holds a JSON {type(found).__name__}, not an object of {holding}", param_hint=option
        )
    return found


def set_field(body: dict, path: tuple[str, ...], value: Any) -> None:
    """Set `body`'s field at `path`, saying on stderr when it replaces what the --sweep-spec file
    set (nothing a user typed is silently ignored); BadParameter when a parent is not an object."""
    from app.cli import console

    *parents, field = path
    target = body
    for parent in parents:
        if not isinstance(target.get(parent, {}), dict):
            raise typer.BadParameter(f"the file's {parent!r} is not an object", param_hint="--sweep-spec")
        target = target.setdefault(parent, {})
    dotted = ".".join(path)
    if field in target and target[field] != value:
        given = FIELD_OPTION[dotted] + ("" if isinstance(value, dict) else f" {value}")  # a file's object: its option
        console.print(escape(f"{given} replaces the --sweep-spec file's {dotted}"))
    target[field] = value


def submit_sweep(client: TrainhubClient, body: dict) -> dict:
    """POST /sweeps; the created Sweep. A 422 exits 1 with one line per refused field, naming the
    option that sets it; other errors as every command prints them."""
    from app.cli import friendly_errors

    with friendly_errors():
        try:
            return client.sweep(body)
        except ApiError as exc:
            if exc.status_code != 422 or not isinstance(exc.detail, list):
                raise
            fail("the server refused the sweep (HTTP 422):\n" + "\n".join(refusal(item) for item in exc.detail))


def refusal(item: dict) -> str:
    """One FastAPI 422 item as '  space.batch_size (--space): message'."""
    loc = [str(p) for p in item.get("loc", []) if p != "body"]
    where, option = ".".join(loc), option_for(loc)
    label = f"{where} ({option})" if where and option else where or "the sweep"
    return f"  {label}: {item.get('msg')}"


def option_for(loc: list[str]) -> str | None:
    """The option that sets the field at `loc`, or the nearest field above it (space.batch_size: --space)."""
    for n in range(len(loc), 0, -1):
        if option := FIELD_OPTION.get(".".join(loc[:n])):
            return option
    return None


def started_line(sweep: dict) -> str:
    """What stderr says at once: the id, what runs, and how to end it (the table may take a while)."""
    budget = sweep["budget"]
    return (
        f"sweep {sweep['id']}: up to {budget['max_trials']} trials, {sweep['spec']['parallelism']} at a time "
        f"(`trainhub sweeps cancel {sweep['id'][:8]}` ends it)"
    )


# --- watching --------------------------------------------------------------------------------


@dataclass
class Seen:
    """The sweep and its trials as last polled."""

    sweep: dict
    trials: list[dict]


def watch(client: TrainhubClient, sweep: dict, timeout_s: float | None) -> tuple[dict, list[dict]]:
    """A live table of the sweep's trials, best first, redrawn at each poll (about 1 s) until the
    sweep ends; the final Sweep and its trials, after printing the best one. Ctrl-C, or `timeout_s`
    seconds, stop watching, not the sweep (exit 130, 124)."""
    from app.cli import call, console, friendly_errors

    seen = Seen(sweep, [])
    # On a terminal the table keeps to its height (the best rows) until the end; piped, only the
    # last frame is printed, whole.
    rows = max(console.height - LIVE_CHROME_LINES, 5) if console.is_terminal else None
    short = sweep["id"][:8]
    try:
        seen.trials = call(client.trials, sweep["id"])  # (a Ctrl-C here stops watching too)
        with live_view(console, sweep_view(seen.sweep, seen.trials, rows)) as live, friendly_errors():

            def redraw(current: dict) -> None:
                seen.sweep, seen.trials = current, client.trials(current["id"])
                live.update(sweep_view(seen.sweep, seen.trials, rows), refresh=True)

            client.wait_sweep(sweep["id"], timeout_s=timeout_s, on_update=redraw)
            live.update(sweep_view(seen.sweep, seen.trials))  # the last frame: every trial
    except KeyboardInterrupt:
        console.print(f"stopped watching; sweep {short} goes on (`trainhub sweeps cancel {short}` ends it)")
        raise typer.Exit(130) from None
    except TimeoutError:
        console.print(
            f"still {seen.sweep['status']} after {timeout_s:g} s; sweep {short} goes on "
            f"(`trainhub sweeps show {short}` to look again, `trainhub sweeps cancel {short}` to end it)"
        )
        raise typer.Exit(124) from None
    console.print(outcome(seen.sweep))
    return seen.sweep, seen.trials


@contextmanager
def live_view(console: Console, first: Group) -> Iterator[Live]:
    """rich's Live on `console`, redrawn when told (`update(..., refresh=True)`); it ends on a new
    line also when piped (Live adds one on a terminal only)."""
    try:
        with Live(first, console=console, auto_refresh=False) as live:
            yield live
    finally:
        if not console.is_terminal:
            console.line()


def outcome(sweep: dict) -> Text:
    """The last line: the best trial and its parameters, or why there is none."""
    best, metric = sweep["best"], sweep["spec"]["objective"]["metric"]
    if best is None:
        return Text(f"sweep {sweep['status']}: no trial completed, so there is no best trial", style="red")
    params = ", ".join(f"{path}={value_text(value)}" for path, value in best["params"].items())
    style = "green" if sweep["status"] == SweepStatus.SUCCEEDED else ""
    return Text(
        f"sweep {sweep['status']}; best: trial {best['number']} (job {best['job_id'][:8]}), "
        f"{metric} {best['objective']:.4f}, with {params}",
        style=style,
    )


# --- tables ----------------------------------------------------------------------------------


def ranked(trials: list[dict], direction: str) -> list[dict]:
    """Best first: the trials with an objective by it (highest first for max, lowest for min),
    then those without one; ties in trial order."""
    sign = -1 if direction == "max" else 1
    return sorted(trials, key=lambda t: (t["objective"] is None, sign * (t["objective"] or 0.0), t["number"]))


def sweep_view(sweep: dict, trials: list[dict], rows: int | None = None) -> Group:
    """The header line and the trials table, best first; only the first `rows` trials when given."""
    return Group(header(sweep), trials_table(sweep, trials, rows))


def header(sweep: dict) -> Text:
    """e.g. "sweep 1a2b3c4d 'lr' running (tpe, test_accuracy max, asha from epoch 1) · 3 of 8
    trials: 1 queued, 1 running, 1 pruned · train time 12.3 s of 60 s"."""
    spec, budget = sweep["spec"], sweep["budget"]
    how = f"{spec['method']}, {spec['objective']['metric']} {spec['objective']['direction']}"
    if stopping := spec.get("early_stopping"):
        how += f", {stopping['method']} from epoch {stopping['min_epochs']}"
    counts = ", ".join(f"{n} {status}" for status, n in sweep["trials"].items() if n) or "none yet"
    train = f"train time {budget['train_s']:.1f} s" + (
        f" of {budget['max_total_s']:g} s" if budget["max_total_s"] else ""
    )
    return Text.assemble(
        f"sweep {sweep['id'][:8]}" + (f" {sweep['name']!r} " if sweep["name"] else " "),
        (sweep["status"], STATUS_STYLE.get(sweep["status"], "bold")),
        f" ({how}) · {budget['trials']} of {budget['max_trials']} trials: {counts} · {train}",
    )


def trials_table(sweep: dict, trials: list[dict], rows: int | None = None) -> Table:
    """One row per trial, best first: number, status (where a pruned one stopped), each searched
    parameter, epochs run, objective, job. The sweep's best trial is in bold."""
    spec = sweep["spec"]
    objective = spec["objective"]
    shown = ranked(trials, objective["direction"])
    hidden = len(shown) - rows if rows is not None and len(shown) > rows else 0
    caption = f"… and {hidden} more: `trainhub sweeps show {sweep['id'][:8]}`" if hidden else None
    table = Table(caption=caption)
    table.add_column("trial", justify="right")
    table.add_column("status")
    # A long dotted path folds onto two lines on a narrow terminal rather than losing its end.
    for path in spec["space"]:
        table.add_column(escape(path), justify="right", overflow="fold")
    table.add_column("epochs", justify="right")
    table.add_column(f"{objective['metric']} ({objective['direction']})", justify="right", overflow="fold")
    table.add_column("job", no_wrap=True)
    best = (sweep["best"] or {}).get("number")
    for trial in shown[: len(shown) - hidden]:
        table.add_row(
            str(trial["number"]),
            status_text(trial),
            *(escape(value_text(trial["params"].get(path))) for path in spec["space"]),
            str(trial["epochs"]),
            "-" if trial["objective"] is None else f"{trial['objective']:.4f}",
            " ".join(job_id[:8] for job_id in (trial.get("jobs") or {}).values()) or trial["job_id"][:8],
            style="bold" if trial["number"] == best else None,
        )
    return table


def status_text(trial: dict) -> Text:
    """A trial's status in its colour; a pruned one says at which epoch it stopped."""
    status = trial["status"]
    if status == JobStatus.PRUNED and trial.get("pruned_at_epoch") is not None:
        return Text(f"pruned at epoch {trial['pruned_at_epoch']}", style=STATUS_STYLE[JobStatus.PRUNED])
    return Text(status, style=STATUS_STYLE.get(status, ""))


def value_text(value: Any) -> str:
    """A parameter as the table shows it: floats to 4 significant digits (1e-3 stays 0.001)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


# --- trainhub sweeps ... ---------------------------------------------------------------------


@sweeps_cli.command("list")
def sweeps_list(
    limit: Annotated[int, typer.Option(min=1, help="how many of the newest to list")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print the Sweeps as JSON")] = False,
) -> None:
    """Your sweeps, newest first: status, trials ended of the most (and how many were pruned), the
    best objective."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        sweeps = call(client.sweeps, limit)
    if as_json:
        print(json.dumps(sweeps, indent=2))
        return
    table = Table(title="sweeps")
    table.add_column("id", min_width=8, no_wrap=True)
    table.add_column("status", min_width=9)
    for column in ("name", "method", "objective", "trials", "best", "created"):
        table.add_column(column, justify="right" if column in ("trials", "best") else "left", overflow="fold")
    for s in sweeps:
        counts, objective = s["trials"], s["spec"]["objective"]
        ended, pruned = sum(counts[status] for status in FINISHED), counts[JobStatus.PRUNED]
        table.add_row(
            s["id"][:8],
            Text(s["status"], style=STATUS_STYLE.get(s["status"], "")),
            escape(s["name"] or ""),
            s["spec"]["method"],
            f"{objective['metric']} {objective['direction']}",
            f"{ended}/{s['budget']['max_trials']}" + (f", {pruned} pruned" if pruned else ""),
            "-" if s["best"] is None else f"{s['best']['objective']:.4f}",
            s["created_at"][:16].replace("T", " "),
        )
    Console().print(table)


@sweeps_cli.command("show")
def sweeps_show(
    sweep_id: Annotated[str, typer.Argument(help="the sweep's id, or its first 8 characters")],
    as_json: Annotated[bool, typer.Option("--json", help='print {"sweep": Sweep, "trials": [Trial]} as JSON')] = False,
) -> None:
    """One sweep: status, trials by status, budget used, every trial best first, the best one."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        found = call(client.get_sweep, sweep_id)
        trials = call(client.trials, found["id"])
    if as_json:
        print(json.dumps({"sweep": found, "trials": trials}, indent=2))
        return
    out = Console()
    out.print(sweep_view(found, trials))
    if found["best"] or found["status"] != SweepStatus.RUNNING:
        out.print(outcome(found))


@sweeps_cli.command("cancel")
def sweeps_cancel(sweep_id: Annotated[str, typer.Argument(help="the sweep's id, or its first 8 characters")]) -> None:
    """End a sweep and every trial still queued or running; prints its status.

    No new trial starts, queued trials are cancelled, running ones stop after their current step
    (their finished epochs stay). Cancelling a cancelled sweep is fine; one that had already ended
    exits 1."""
    from app.cli import call, client_from_settings, console

    with client_from_settings() as client:
        found = call(client.cancel_sweep, sweep_id)
    if found["status"] != SweepStatus.CANCELLED:
        fail(f"sweep {found['id']} had already ended ({found['status']}); nothing to cancel")
    running = found["trials"][JobStatus.RUNNING]
    stopping = f"; {running} running trial(s) stop after their current step" if running else ""
    console.print(f"sweep {found['id']} cancelled{stopping}")
    print(found["status"])


def fail(message: str) -> NoReturn:
    """app/cli.py's one red error line and exit 1."""
    from app.cli import fail as cli_fail

    cli_fail(message)
