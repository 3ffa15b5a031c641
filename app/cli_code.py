"""`trainhub code upload FILE|list|delete ID`: your model code (POST/GET/DELETE /code), over the API
with TRAINHUB_API_KEY, like `trainhub datasets ...`.

app/cli.py registers them at its end (`register`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

code_cli = typer.Typer(
    help="Upload and manage your model code (see the README's 'Your own code').", no_args_is_help=True
)


def register(cli: typer.Typer) -> None:
    """Add the `code` group to the `trainhub` command line."""
    cli.add_typer(code_cli, name="code")


@code_cli.command("upload")
def upload(
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="a .py file or a .zip of them")
    ],
    name: Annotated[Optional[str], typer.Option(help="default: the file's name")] = None,
    entrypoint: Annotated[
        Optional[list[str]], typer.Option(help="module:function that must be in it (repeatable)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the code's record as JSON")] = False,
) -> None:
    """Upload model code; prints its id, then its entrypoints with the framework each builds (or
    the record as JSON). The same content again gives back the record it already made."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        had = {c["id"] for c in call(client.code)}
        code = call(client.upload_code, path, name=name, entrypoints=entrypoint or ())
    if as_json:
        print(json.dumps(code, indent=2))
        return
    print(code["id"])
    console = Console(stderr=True)
    if code["id"] in had:
        console.print(f"already uploaded as {code['id']} (named {escape(repr(code['name']))})")
    for function, framework in sorted(code["entrypoints"].items()):
        console.print(f"  {escape(function)}  {framework or 'framework unknown'}")


@code_cli.command("list")
def list_code(as_json: Annotated[bool, typer.Option("--json", help="print the records as JSON")] = False) -> None:
    """Your uploaded code, newest first: id, name, files, entrypoints, bytes."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        items = call(client.code)
    if as_json:
        print(json.dumps(items, indent=2))
        return
    table = Table(title="code")
    table.add_column("id", no_wrap=True)
    for column in ("name", "files", "entrypoints", "bytes", "created"):
        table.add_column(column, justify="right" if column in ("files", "bytes") else "left")
    for code in items:
        entrypoints = ", ".join(f"{e} ({fw or '?'})" for e, fw in sorted(code["entrypoints"].items()))
        table.add_row(
            code["id"],
            escape(code["name"]),
            str(len(code["files"])),
            escape(entrypoints),
            f"{code['bytes']:,}",
            code["created_at"][:16].replace("T", " "),
        )
    Console().print(table)


@code_cli.command("delete")
def delete(
    code_id: Annotated[str, typer.Argument(help="the id `trainhub code list` shows (or its first 8+ digits)")],
) -> None:
    """Delete your code. Refused (exit 1) while a queued or running job trains it; finished jobs
    keep their results and artifacts."""
    from app.cli import call, client_from_settings

    with client_from_settings() as client:
        code = call(client.get_code, code_id)
        call(client.delete_code, code["id"])
    print(f"deleted code {code['id']} named {code['name']!r}")
