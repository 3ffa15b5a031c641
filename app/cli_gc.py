"""`trainhub gc [--dry-run] [--json]`: retention by hand (app/retention.py says what expires);
and `trainhub rebuild-metrics`: the tallies /metrics reads, counted again (app/tallies.py).

It runs the same code as the workers' periodic run, directly against the database the keys
commands use (TRAINHUB_DATABASE_URL, else the var dir's: `--var-dir`, TRAINHUB_VAR_DIR, ./var),
with the artifact store of the same settings, and to the end rather than for a few seconds.

app/cli.py registers the command at its end (`register`); its helpers are imported when the
command runs, as app/cli_sweeps.py explains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.filesize import decimal

if TYPE_CHECKING:  # the database layer is imported when the command runs: other commands start light
    from app.retention import Report

SHOWN_IDS = 50  # ids listed in the text output; --json lists them all


def register(cli: typer.Typer) -> None:
    """Add `gc` and `rebuild-metrics` to the `trainhub` command line."""
    cli.command("gc")(gc)
    cli.command("rebuild-metrics")(rebuild_metrics)


def rebuild_metrics(
    var_dir: Annotated[
        Optional[Path], typer.Option(help="the var dir of the stack (as `trainhub up --var-dir`)")
    ] = None,
) -> None:
    """Count /metrics' job counts, queue depths and duration histograms again from the stored
    jobs and epochs (the queued-jobs quota reads the same counts). Database triggers keep them in
    step as rows change, so this is needed only if they were ever lost (e.g. rows changed with
    the triggers disabled); on PostgreSQL it holds writes to the jobs and epochs until it is done
    (about a second per million jobs)."""
    from app import tallies
    from app.db import session_scope

    open_existing_database(var_dir)
    with session_scope() as session:
        tallies.rebuild(session)
        counts = tallies.jobs_by_status(session)
    print("rebuilt the tallies: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()) if n) + " jobs")


def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be deleted; delete nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON, every id in full")] = False,
    var_dir: Annotated[
        Optional[Path], typer.Option(help="the var dir of the stack (as `trainhub up --var-dir`)")
    ] = None,
) -> None:
    """Delete the finished jobs past their retention (TRAINHUB_RETENTION_DAYS, or a job's shorter
    retention_days) with their metrics, artifacts and files, and the comparisons and sweeps
    whose jobs all expired. Queued and running jobs are never deleted, nor a job whose
    comparison or sweep still holds one that is kept."""
    from app import retention

    open_existing_database(var_dir)
    report = retention.delete_expired(dry_run=dry_run)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
        return
    for line in summary(report):
        print(line)


def open_existing_database(var_dir: Path | None) -> None:
    """Migrate the stack's database (as the keys commands find it); exit 1 with a hint where
    there is no embedded one: retention has nothing to do in a new, empty database."""
    from app.cli import fail, keys_options, open_database
    from app.config import get_settings

    if var_dir is not None:
        keys_options(var_dir)
    url = get_settings().resolved_database_url()
    if url.startswith("sqlite") and not Path(url.split("///", 1)[-1]).is_file():
        fail(
            f"no trainhub database at {url.split('///', 1)[-1]}: run this where `trainhub up` runs, or name "
            "the stack's with --var-dir DIR (or TRAINHUB_VAR_DIR, or TRAINHUB_DATABASE_URL)"
        )
    open_database()


def summary(report: Report) -> list[str]:
    """The report as lines: the retention in effect, what went (or would go), the ids."""
    verb = "would delete" if report.dry_run else "deleted"
    lines = [
        retention_in_effect(report.retention_days),
        f"{verb} {_count(report.jobs, 'job')}, {_count(report.comparisons, 'comparison')}, "
        f"{_count(report.sweeps, 'sweep')}; {report.files} files, {decimal(report.bytes)}",
    ]
    for kind, ids in (("jobs", report.jobs), ("comparisons", report.comparisons), ("sweeps", report.sweeps)):
        if ids:
            more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
            lines.append(f"{kind}: " + " ".join(i[:8] for i in ids[:SHOWN_IDS]) + more)
    if report.kept:
        lines.append(
            f"kept {_count(report.kept, 'expired job')}: a comparison or sweep of theirs still holds a job "
            "that has not expired, or is running"
        )
    return lines


def retention_in_effect(days: int | None) -> str:
    if days is None:
        return "retention: TRAINHUB_RETENTION_DAYS is unset: only jobs with a retention_days of their own expire"
    return f"retention: {days} days after a job ends (TRAINHUB_RETENTION_DAYS), or its own retention_days if shorter"


def _count(items: list[str] | int, noun: str) -> str:
    n = items if isinstance(items, int) else len(items)
    return f"{n} {noun}" + ("" if n == 1 else "s")
