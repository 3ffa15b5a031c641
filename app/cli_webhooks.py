"""`trainhub webhooks show|secret|set URL|clear`: the key's webhook settings, over the API (with
TRAINHUB_API_KEY, like `submit`); and `trainhub deliveries ID`: a job's webhook deliveries.

app/cli.py registers them at its end (`register`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

webhooks_cli = typer.Typer(help="Your key's webhooks: signing secret and default URL.", no_args_is_help=True)


def register(cli: typer.Typer) -> None:
    """Add the `webhooks` group and `deliveries` to the `trainhub` command line."""
    cli.add_typer(webhooks_cli, name="webhooks")
    cli.command("deliveries")(deliveries)


def _show(settings: dict) -> None:
    secret = settings["secret"]
    print(f"url: {settings['url'] or '(none: only jobs whose spec names a webhook_url send any)'}")
    made = f"{secret['prefix']}… made {secret['created_at']}" if secret else "(none: run `trainhub webhooks secret`)"
    print(f"secret: {made}")


@webhooks_cli.command("show")
def show() -> None:
    """The key's default webhook URL and its signing secret's prefix (never the secret)."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        _show(call(client.webhooks))


@webhooks_cli.command("secret")
def secret() -> None:
    """Make (or replace) the key's signing secret; printed once, on the last line of stdout. A
    replaced secret stops signing at once."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        made = call(client.webhook_secret)
    Console(stderr=True).print("keep it: deliveries are signed with it and it is not shown again")
    print(made["secret"])


@webhooks_cli.command("set")
def set_url(url: Annotated[str, typer.Argument(help="https://... : where the key's jobs' status changes go")]) -> None:
    """Set the key's default webhook URL (used by its jobs whose spec names none)."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        _show(call(client.set_webhook_url, url))


@webhooks_cli.command("clear")
def clear() -> None:
    """Clear the key's default webhook URL."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        _show(call(client.set_webhook_url, None))


def deliveries(
    job_id: Annotated[str, typer.Argument(help="the job's id (or its first 8 characters)")],
    as_json: Annotated[bool, typer.Option("--json", help="print them as JSON")] = False,
) -> None:
    """A job's webhook deliveries, newest first: event, status, attempts, last answer or error."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        items = call(client.deliveries, job_id)
    if as_json:
        print(json.dumps(items, indent=2))
        return
    table = Table(title=f"deliveries of job {escape(job_id)}")
    for column in ("event", "status", "attempts", "answer", "next attempt", "delivered"):
        table.add_column(column)
    for item in items:
        # The error names the answer's status when there was one ("answered 500"): not said twice.
        answer = item["error"] or str(item["response_status"] or "")
        table.add_row(
            item["event"],
            item["status"],
            str(item["attempts"]),
            escape(answer.strip()),
            str(item["next_attempt_at"] or "")[:19],
            str(item["delivered_at"] or "")[:19],
        )
    Console().print(table)
