"""The `trainhub` command line."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.client import FINISHED, ApiError, Event, TrainhubClient
from app.config import Settings, get_settings, setting_problems
from app.status import JobStatus

cli = typer.Typer(
    help="trainhub: training as a service for JAX and PyTorch.", no_args_is_help=True, pretty_exceptions_enable=False
)
keys_cli = typer.Typer(help="Manage API keys.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")
datasets_cli = typer.Typer(help="Upload and manage your datasets.", no_args_is_help=True)
cli.add_typer(datasets_cli, name="datasets")
T = TypeVar("T")
console = Console(stderr=True)


def main() -> None:
    try:
        cli()
    except ValidationError as error:
        problems = setting_problems(error)
        if problems is None:
            raise
        for line in problems:  # a bad TRAINHUB_* variable: say which and why, not a traceback
            console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
        raise SystemExit(2) from None


# --- processes -------------------------------------------------------------------------------


@cli.command()
def up(
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    var_dir: Annotated[
        Path, typer.Option(help="SQLite, broker and artifacts live here", envvar="TRAINHUB_VAR_DIR")
    ] = Path("var"),
    workers: Annotated[int, typer.Option(min=1, max=8)] = 1,
    cpu_devices: Annotated[
        int, typer.Option(min=1, help="devices each worker's cores count as, for data parallel jobs (spec devices > 1)")
    ] = 1,
) -> None:
    """The embedded stack: the API and cpu worker(s) over SQLite and a local broker under VAR_DIR.

    Prints the URL and a new API key, then runs until interrupted (Ctrl-C stops everything). A
    child that dies (killed, out of memory) is restarted after a short backoff; `up` gives up
    only when one keeps failing at start."""
    from sqlalchemy.orm import Session

    from app import stack
    from app.db import make_engine, migrate
    from app.keys import create_key

    if port and stack.port_in_use(host, port):
        fail(
            f"port {port} on {host} is already in use (another `trainhub up`?): pass --port with a free one, "
            "or --port 0 to pick one"
        )
    settings = Settings(var_dir=var_dir.resolve(), database_url=None, broker_url=None, artifact_dir=None)
    url = settings.resolved_database_url()
    migrate(url)
    with Session(make_engine(url)) as session:
        _, secret = create_key(session, "up")
    port = port or stack.free_port()
    running = stack.start(settings.var_dir, host, port, workers, cpu_devices)
    stopped = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopped.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        running.wait_ready()
        print(
            f"trainhub is up at {running.url} (docs at {running.url}/docs; logs in {settings.var_dir / 'logs'})",
            flush=True,
        )
        print(f"export TRAINHUB_API_URL={running.url}  # for the CLI in another shell", flush=True)
        print(f"export TRAINHUB_API_KEY={secret}  # for the CLI in another shell", flush=True)
        print(f"API key: {secret}", flush=True)
        while not stopped.wait(0.5):
            try:
                running.supervise(say=lambda line: console.print(f"[yellow]{escape(line)}[/yellow]"))
            except stack.ChildKeepsFailing as exc:
                console.print(f"[red]{escape(str(exc))}; stopping[/red]")
                raise typer.Exit(1) from None
    finally:
        running.stop()
        print("trainhub stopped", flush=True)


@cli.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=1, help="API processes (uvicorn workers); each runs its own Python, so more of them use more cores"
        ),
    ] = 1,
) -> None:
    """The API alone (uvicorn, under the bounds of app/server.py), on the database and broker of
    TRAINHUB_* settings."""
    from app import server

    if workers > 1 and get_settings().resolved_database_url().startswith("sqlite"):
        # The per-key quotas lock the key (app/limits.py), which SQLite cannot: one process.
        fail(
            "--workers above 1 needs PostgreSQL (TRAINHUB_DATABASE_URL); the embedded SQLite database "
            "serves one API process"
        )
    server.run(host, port, workers)


@cli.command()
def migrate() -> None:
    """Apply the database migrations and exit (the API and workers also apply them on start; a
    deployment runs this once first, e.g. docker compose's `migrate` service)."""
    from app.db import migrate as apply_migrations

    apply_migrations()
    console.print("database migrated")


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    hardware: Annotated[str, typer.Option(help="cpu, gpu or tpu")] = "cpu",
    devices: Annotated[Optional[str], typer.Option(help="device indices, e.g. 0,1")] = None,
    frameworks: Annotated[str, typer.Option(help="frameworks to serve")] = "jax,pytorch",
    cpu_devices: Annotated[
        int, typer.Option(min=1, help="cpu only: devices its cores count as for data parallel jobs (spec devices > 1)")
    ] = 1,
) -> None:
    """One worker pinned to HARDWARE, serving <hardware>.<framework> queues (pool solo); a worker
    owning N devices also serves the data parallel queues <hardware>.<framework>.x2 ... .xN."""
    argv = [
        sys.executable,
        "-m",
        "workers",
        "--hardware",
        hardware,
        "--frameworks",
        frameworks,
        "--cpu-devices",
        str(cpu_devices),
    ]
    if devices is not None:
        argv += ["--devices", devices]
    # exec, so the pinned process is this one: nothing was imported from jax or torch here.
    os.execv(sys.executable, argv)


# --- keys ------------------------------------------------------------------------------------


@keys_cli.callback()
def keys_options(
    var_dir: Annotated[
        Optional[Path], typer.Option(help="the var dir of the stack the keys are for (as `trainhub up --var-dir`)")
    ] = None,
) -> None:
    """Keys live in the database of TRAINHUB_DATABASE_URL, else of the var dir (--var-dir,
    TRAINHUB_VAR_DIR, ./var), where `trainhub up` keeps it."""
    if var_dir is not None:
        os.environ["TRAINHUB_VAR_DIR"] = str(var_dir.resolve())
        get_settings.cache_clear()


def open_database(init: bool = False, var_dir: Path | None = None) -> None:
    """Migrate the database the keys commands use (`var_dir` as `keys --var-dir`). An embedded
    (SQLite) one that does not exist yet is created only with `init`: a key made in a new, empty
    database from the wrong folder would be refused by the running stack (401) with no hint why."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.db import migrate

    if var_dir is not None:
        keys_options(var_dir)
    settings = get_settings()
    url = settings.resolved_database_url()
    if url.startswith("sqlite") and not init:
        path = Path(url.split("///", 1)[-1])
        if not path.is_file():
            fail(
                f"no trainhub database at {path}: run this where `trainhub up` runs, or name the stack's database "
                "with `trainhub keys create --var-dir DIR ...` (or TRAINHUB_VAR_DIR, or TRAINHUB_DATABASE_URL); "
                "--init creates a new one"
            )
    try:
        migrate()
    except SQLAlchemyError as exc:
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        fail(f"cannot open the keys' database ({url.split('@')[-1]}): {cause}")


@keys_cli.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="who or what the key is for")],
    admin: Annotated[bool, typer.Option("--admin", help="sees every job and worker, not only its own")] = False,
    init: Annotated[bool, typer.Option("--init", help="create the embedded database if there is none yet")] = False,
    var_dir: Annotated[Optional[Path], typer.Option(help="the var dir of the stack the key is for")] = None,
    max_priority: Annotated[
        Optional[Priority], typer.Option(help="the highest priority its jobs may ask for (default: any)")
    ] = None,
    scrape: Annotated[
        bool, typer.Option("--scrape", help="reads the service-wide /metrics and nothing else (for Prometheus)")
    ] = False,
    allow_code: Annotated[
        bool,
        typer.Option("--allow-code", help="may upload and train its own model code (if TRAINHUB_ALLOW_USER_CODE)"),
    ] = False,
) -> None:
    """Create an API key; the secret is printed once, on the last line of stdout (only its
    sha256 is stored)."""
    from app.db import session_scope
    from app.keys import create_key

    name = name.strip()
    if not name or len(name) > 200 or not name.isprintable():
        fail("--name must be 1 to 200 printable characters")
    open_database(init, var_dir)
    with session_scope() as session:
        key, secret = create_key(
            session,
            name,
            admin=admin,
            max_priority=max_priority.value if max_priority else None,
            scrape_only=scrape,
            allow_code=allow_code,
        )
    kind = "admin key" if admin else "scrape key" if scrape else "key"
    console.print(
        f"created {kind} {key.prefix}… (id {key.id}) named {escape(repr(name))}; store it now, it is not shown again"
    )
    print(secret)


@keys_cli.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json", help="print the keys as JSON")] = False,
    var_dir: Annotated[Optional[Path], typer.Option(help="the var dir of the stack the key is for")] = None,
) -> None:
    """Every key: id, prefix, name, kind (admin, scrape), priority cap, created and revoked times
    (never a secret or hash)."""
    from app.db import session_scope
    from app.keys import list_keys
    from app.models import rfc3339

    open_database(var_dir=var_dir)
    with session_scope() as session:
        rows = [
            {
                "id": k.id,
                "prefix": k.prefix,
                "name": k.name,
                "admin": k.is_admin,
                "scrape": k.scrape_only,
                "max_priority": k.max_priority,
                "allow_code": k.allow_code,
                "created_at": rfc3339(k.created_at),
                "revoked_at": rfc3339(k.revoked_at) if k.revoked_at else None,
            }
            for k in list_keys(session)
        ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    console = Console()
    console.print(_keys_table(rows, console.width))


def _keys_table(rows: list[dict[str, Any]], width: int) -> Table:
    """The keys as a table `width` columns wide at most where it can be: the id's first 8
    characters and the prefix, which `keys cap/code/revoke` take, are never cut; the columns
    after the name are left out, last first, where they would squeeze the others unreadable."""
    from app.keys import SHORT_ID

    cells = {
        "id": [str(r["id"])[:SHORT_ID] for r in rows],
        "prefix": [f"{r['prefix']}…" for r in rows],
        "name": [escape(str(r["name"])) for r in rows],
        "kind": ["admin" if r["admin"] else "scrape" if r["scrape"] else "" for r in rows],
        "max priority": [str(r["max_priority"] or "") for r in rows],
        "code": ["allowed" if r["allow_code"] else "" for r in rows],
        "created": [str(r["created_at"])[:19] for r in rows],
        "revoked": [str(r["revoked_at"] or "")[:19] for r in rows],
    }

    def wide(column: str) -> int:  # its cells' width (a name counts up to 16), and its border
        longest = max((len(cell) for cell in cells[column]), default=0)
        return max(len(column), min(longest, 16) if column == "name" else longest) + 3

    shown = ["id", "prefix", "name"]
    for column in ("kind", "max priority", "code", "created", "revoked"):
        if sum(map(wide, shown)) + wide(column) + 1 > width:
            break
        shown.append(column)
    table = Table(title="API keys")
    for column in shown:
        table.add_column(column, no_wrap=column != "name", min_width=wide(column) - 3 if column != "name" else None)
    for i in range(len(rows)):
        table.add_row(*(cells[column][i] for column in shown))
    return table


KEY_IDENT_HELP = "the key's id (or its first 8 characters) or prefix, as `keys list` shows them"


@keys_cli.command("cap")
def keys_cap(
    key: Annotated[str, typer.Argument(help=KEY_IDENT_HELP)],
    max_priority: Annotated[
        Optional[Priority], typer.Option(help="the highest priority its jobs may ask for; leave out to lift the cap")
    ] = None,
    var_dir: Annotated[Optional[Path], typer.Option(help="the var dir of the stack the key is for")] = None,
) -> None:
    """Cap the priority a key's jobs may ask for (a job above it is refused with 422); queued
    jobs keep theirs."""
    from app.db import session_scope
    from app.keys import AmbiguousKey, cap_key

    open_database(var_dir=var_dir)
    with session_scope() as session:
        try:
            capped = cap_key(session, key, max_priority.value if max_priority else None)
        except AmbiguousKey:
            fail(f"{key!r} names more than one key; use the whole id (`trainhub keys list --json`)")
        if capped is None:
            fail(f"no key has the id or prefix {key!r} (see `trainhub keys list`)")
        cap = f"capped at priority {capped.max_priority}" if capped.max_priority else "no longer capped"
        console.print(f"key {capped.prefix}… named {escape(repr(capped.name))} is {cap}")


@keys_cli.command("code")
def keys_code(
    key: Annotated[str, typer.Argument(help=KEY_IDENT_HELP)],
    allow: Annotated[
        bool,
        typer.Option("--allow/--revoke", help="grant the right to upload and train model code, or take it back"),
    ],
    var_dir: Annotated[Optional[Path], typer.Option(help="the var dir of the stack the key is for")] = None,
) -> None:
    """Grant (--allow) or take back (--revoke) a key's right to upload and train its own model code,
    from its next request on (the deployment must allow user code: TRAINHUB_ALLOW_USER_CODE=1).
    Jobs already queued keep running."""
    from app.db import session_scope
    from app.keys import AmbiguousKey
    from app.keys import allow_code as set_allow_code

    open_database(var_dir=var_dir)
    with session_scope() as session:
        try:
            changed = set_allow_code(session, key, allow)
        except AmbiguousKey:
            fail(f"{key!r} names more than one key; use the whole id (`trainhub keys list --json`)")
        if changed is None:
            fail(f"no key has the id or prefix {key!r} (see `trainhub keys list`)")
        verb = "may now" if allow else "may no longer"
        console.print(f"key {changed.prefix}… named {escape(repr(changed.name))} {verb} upload and train model code")


@keys_cli.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help=KEY_IDENT_HELP)],
    var_dir: Annotated[Optional[Path], typer.Option(help="the var dir of the stack the key is for")] = None,
) -> None:
    """Revoke a key: every request with it is refused (401) from now on, including its
    event streams' reconnects. Its jobs are kept."""
    from app.db import session_scope
    from app.keys import AmbiguousKey, revoke_key
    from app.models import rfc3339

    open_database(var_dir=var_dir)
    with session_scope() as session:
        try:
            revoked = revoke_key(session, key)
        except AmbiguousKey:
            fail(f"{key!r} names more than one key; use the whole id (`trainhub keys list --json`)")
        if revoked is None or revoked.revoked_at is None:
            fail(f"no key has the id or prefix {key!r} (see `trainhub keys list`)")
        console.print(
            f"revoked key {revoked.prefix}… named {escape(repr(revoked.name))} at {rfc3339(revoked.revoked_at)}"
        )


# --- jobs ------------------------------------------------------------------------------------


def client_from_settings() -> TrainhubClient:
    settings = get_settings()
    if not settings.api_key:
        fail("no API key: set TRAINHUB_API_KEY (create one with `trainhub keys create --name NAME`)")
    return TrainhubClient(settings.api_url, settings.api_key)


def fail(message: str, code: int = 1) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Turn API and connection errors (from a call or while reading a stream) into one clear line."""
    import httpx

    try:
        yield
    except ApiError as exc:
        hint = " (check TRAINHUB_API_KEY: the server does not know this key)" if exc.status_code == 401 else ""
        fail(f"{exc}{hint}")
    except httpx.TransportError as exc:
        fail(
            f"cannot reach trainhub at {get_settings().api_url}: {exc or type(exc).__name__} "
            "(is the server running? TRAINHUB_API_URL says where it is)"
        )


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a client call, turning API and connection errors into one clear line."""
    with friendly_errors():
        return fn(*args, **kwargs)


# The spec options of `submit` and `compare`, each with the field of the spec it sets. None (not
# given) leaves the field to the --spec file, or to the API's default.
SPEC_OPTIONS = {
    "framework": ("framework",),
    "hardware": ("hardware",),
    "dataset": ("dataset", "name"),
    "train_limit": ("dataset", "train_limit"),
    "test_limit": ("dataset", "test_limit"),
    "validation_split": ("dataset", "validation_split"),
    "epochs": ("epochs",),
    "batch_size": ("batch_size",),
    "learning_rate": ("optimizer", "learning_rate"),
    "hidden_sizes": ("model", "hidden_sizes"),
    "dropout": ("model", "dropout"),
    "seed": ("seed",),
    "name": ("name",),
    "priority": ("priority",),
    "webhook_url": ("webhook_url",),
    "compile": ("compile",),
}


class Priority(StrEnum):
    """A job's place in its queue (spec.priority)."""

    low = "low"
    normal = "normal"
    high = "high"


WEBHOOK_HELP = "POST each status change, signed, to this URL (needs `trainhub webhooks secret` first)"
PRIORITY_HELP = "low, normal (default) or high: its place in the queue; a high job may preempt a running low one"
# --dataset with this prefix is an uploaded dataset's id (dataset.id), else a built-in name (dataset.name).
DATASET_ID_PREFIX = "ds_"
DATASET_HELP = (
    "fashion-mnist (default), mnist, digits or synthetic, or an uploaded dataset's id (ds_..., see datasets list)"
)
VALIDATION_SPLIT_HELP = (
    "hold out this fraction of the training split as the test split, e.g. 0.2 (needed for an uploaded dataset "
    "without a test split)"
)


@cli.command()
def submit(
    framework: Annotated[Optional[str], typer.Option(help="jax or pytorch (default jax)")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="cpu, gpu or tpu (default cpu)")] = None,
    dataset: Annotated[Optional[str], typer.Option(help=DATASET_HELP)] = None,
    validation_split: Annotated[Optional[float], typer.Option(help=VALIDATION_SPLIT_HELP)] = None,
    epochs: Annotated[Optional[int], typer.Option(help="default 10")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="default 128")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(help="default 0.001")] = None,
    hidden_sizes: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. 256,128 (the default)")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="default 0")] = None,
    seed: Annotated[Optional[int], typer.Option(help="default 0")] = None,
    train_limit: Optional[int] = None,
    test_limit: Optional[int] = None,
    name: Optional[str] = None,
    priority: Annotated[Optional[Priority], typer.Option(help=PRIORITY_HELP)] = None,
    webhook_url: Annotated[Optional[str], typer.Option(help=WEBHOOK_HELP)] = None,
    compile: Annotated[
        Optional[bool],
        typer.Option("--compile/--no-compile", help="PyTorch: torch.compile the train step (default off)"),
    ] = None,
    spec_file: Annotated[
        Optional[Path], typer.Option("--spec", help="a JobSpec JSON file; options given with it override its fields")
    ] = None,
    wait: Annotated[bool, typer.Option(help="show progress and end with the result")] = False,
    timeout: Annotated[
        Optional[float], typer.Option(min=0.1, help="with --wait: stop watching after this many seconds (exit 124)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the Job as JSON")] = False,
) -> None:
    """Submit a job; prints its id (or the Job as JSON)."""
    spec = spec_from_options(
        spec_file,
        framework=framework,
        hardware=hardware,
        dataset=dataset,
        validation_split=validation_split,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        hidden_sizes=hidden_sizes,
        dropout=dropout,
        seed=seed,
        train_limit=train_limit,
        test_limit=test_limit,
        name=name,
        priority=priority.value if priority else None,
        webhook_url=webhook_url,
        compile=compile,
    )
    if timeout is not None and not wait:
        fail("--timeout is for --wait: it says how long to watch the job")
    spec.setdefault("framework", "jax")
    with client_from_settings() as client:
        job = call(client.submit, spec)
        if wait:
            job = follow(client, job["id"], timeout)
    if as_json:
        print(json.dumps(job, indent=2))
    else:
        print(job["id"])
    if wait and job["status"] != JobStatus.SUCCEEDED:
        raise typer.Exit(1)


def spec_from_options(spec_file: Path | None, **options: object) -> dict:
    """A spec body: the --spec file's JSON (or nothing), then each option given set on its field
    (SPEC_OPTIONS). An option that changes a field the file set says so on stderr, so nothing a
    user typed is silently ignored; the submitted spec shows the result."""
    spec = read_spec_file(spec_file) if spec_file else {}
    for option, value in options.items():
        if value is None:
            continue
        if option == "hidden_sizes":
            value = parse_sizes(str(value))
        *parents, field = spec_field(option, value)
        target = spec
        for parent in parents:
            if not isinstance(target.get(parent, {}), dict):
                raise typer.BadParameter(
                    f"the spec file's {parent!r} is not an object, so --{option.replace('_', '-')} "
                    "cannot set a field in it",
                    param_hint="--spec",
                )
            target = target.setdefault(parent, {})
        if field in target and target[field] != value:
            console.print(
                f"--{option.replace('_', '-')} {value} overrides the spec file's "
                f"{'.'.join([*parents, field])} ({target[field]})"
            )
        target[field] = value
        if option == "dataset":
            drop_other_dataset_field(target, field, str(value))
    return spec


def spec_field(option: str, value: object) -> tuple[str, ...]:
    """The spec field an option sets (SPEC_OPTIONS); --dataset sets dataset.id for an uploaded
    dataset's id (ds_...) and dataset.name for a built-in one."""
    if option == "dataset" and str(value).startswith(DATASET_ID_PREFIX):
        return ("dataset", "id")
    return SPEC_OPTIONS[option]


def drop_other_dataset_field(dataset: dict, field: str, value: str) -> None:
    """A spec names a built-in dataset (name) or an uploaded one (id), not both: after --dataset set
    `field`, drop the spec file's other one, saying so when it had a value."""
    other = "id" if field == "name" else "name"
    if dataset.pop(other, None) is not None:
        console.print(f"--dataset {value} replaces the spec file's dataset.{other}")


def read_spec_file(path: Path) -> dict:
    """The JSON object in `path`; BadParameter (naming --spec) when it is unreadable, not JSON, not
    an object, or names a key twice."""
    from app.middleware import DuplicateKey, refuse_duplicate_keys

    try:
        spec = json.loads(path.read_text(), object_pairs_hook=refuse_duplicate_keys)
    except DuplicateKey as exc:
        raise typer.BadParameter(
            f"{path} names the key {exc.key!r} twice in one object; keep one", param_hint="--spec"
        ) from None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read a JSON spec from {path}: {exc}", param_hint="--spec") from None
    if not isinstance(spec, dict):
        raise typer.BadParameter(f"{path} holds JSON but not an object of spec fields", param_hint="--spec")
    return spec


def parse_sizes(hidden_sizes: str) -> list[int]:
    try:
        return [int(h) for h in hidden_sizes.split(",") if h.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{hidden_sizes!r} is not a comma-separated list of whole numbers, e.g. 256,128",
            param_hint="--hidden-sizes",
        ) from None


class WatchTimeout(Exception):
    """`--timeout` seconds passed while watching."""


def follow(client: TrainhubClient, job_id: str, timeout_s: float | None = None) -> dict:
    """A progress bar fed by the job's event stream (epoch k of n, loss, test accuracy, ETA)
    until the job ends; the final Job. A queued job says at once why it waits. Ctrl-C, or
    `timeout_s` seconds, stop watching, not the job (exit 130, 124)."""
    from rich.progress import BarColumn, Progress, TextColumn

    job = call(client.get, job_id)
    if job["waiting_reason"] and "no online worker" in job["waiting_reason"]:
        console.print(f"[yellow]job {job_id[:8]} waits: {escape(job['waiting_reason'])}[/yellow]")
    epochs = job["progress"]["epochs"]
    text = ProgressText(epochs)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("epoch {task.completed:.0f} of {task.total:.0f}"),
        TextColumn("{task.fields[info]}"),
    )
    try:
        with Progress(*columns, console=console) as progress, friendly_errors(), deadline(timeout_s):
            task = progress.add_task(
                f"{job['spec']['framework']} {job_id[:8]}",
                total=epochs,
                completed=job["progress"]["epoch"],
                info=job["waiting_reason"] or job["status"],
            )
            for event in client.events(job_id):
                if (info := text.after(event)) is not None:
                    progress.update(task, info=info)
                if event.event == "metrics":
                    progress.update(task, completed=event.data["epoch"])
    except KeyboardInterrupt:
        console.print(f"stopped watching; job {job_id} goes on (`trainhub watch {job_id}` to follow it again)")
        raise typer.Exit(130) from None
    except WatchTimeout:
        job = call(client.get, job_id)
        console.print(
            f"still {job['status']} after {timeout_s:g} s; job {job_id} goes on "
            f"(`trainhub watch {job_id}` to follow it again)"
        )
        raise typer.Exit(124) from None
    job = call(client.get, job_id)
    print_result(job)
    return job


class ProgressText:
    """The progress bar's text as a job's events arrive: each epoch's loss, test accuracy and ETA;
    why a queued job waits; and at the end its final status in place of the ETA (a cancelled
    job's ETA no longer means anything)."""

    FINAL = set(FINISHED)

    def __init__(self, epochs: int) -> None:
        self.epochs, self.epoch_s, self.scores = epochs, list[float](), ""

    def after(self, event: Event) -> str | None:
        """The new text after `event`, or None to leave it as it is."""
        if event.event == "metrics":
            metrics = event.data
            self.epoch_s.append(metrics["epoch_time_s"] + metrics["eval_time_s"])
            self.scores = f"loss {_metric(metrics['train_loss'])}  {test_score(metrics)}"
            return f"{self.scores}  ETA {_clock(eta_s(self.epoch_s, self.epochs - metrics['epoch']))}"
        if event.event == "waiting":
            reason = event.data["waiting_reason"]
            return None if not reason else reason if reason.startswith("waiting") else f"waiting: {reason}"
        status, waiting = event.data.get("status", ""), event.data.get("waiting_reason")
        if status in self.FINAL:
            return f"{self.scores}  {status}" if self.scores else status
        return None if self.scores else status + (f": {waiting}" if waiting else "")


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise WatchTimeout in this (main) thread after `seconds`, even during a blocking read."""
    if not seconds:
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise WatchTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def eta_s(epoch_s: list[float], remaining: int) -> float:
    """Seconds left: the median epoch after the first (which pays for compiling) times the
    epochs remaining; the first epoch's time when it is the only one."""
    steady = sorted(epoch_s[1:]) or epoch_s
    return steady[len(steady) // 2] * remaining if steady else 0.0


def dataset_label(dataset: dict) -> str:
    """How a spec's dataset is shown: its built-in name or its uploaded id."""
    return str(dataset.get("name") or dataset.get("id") or "")


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def test_score(scores: dict, accuracy: str = "test acc") -> str:
    """An epoch's (or a result's) test score as the task has it: accuracy, or RMSE and R²."""
    if scores.get("test_accuracy") is None and scores.get("test_rmse") is not None:
        return f"test RMSE {_metric(scores['test_rmse'])}, R² {_metric(scores.get('test_r2'))}"
    return f"{accuracy} {_metric(scores.get('test_accuracy'))}"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def failure_name(error: dict) -> str:
    """A job error's type with its finer cause, as the dashboard shows it: "data_error (data_not_found)"."""
    return f"{error['type']} ({error['reason']})" if error.get("reason") else str(error["type"])


def print_result(job: dict) -> None:
    if job["status"] == JobStatus.SUCCEEDED:
        result = job["result"] or {}
        score, loss = test_score(result, "test accuracy"), _metric(result.get("test_loss"))
        console.print(f"[green]succeeded[/green]: {score}, test loss {loss}")
    elif job["status"] == JobStatus.FAILED:
        error = job["error"] or {"type": "internal", "message": ""}
        console.print(f"[red]failed[/red]: {failure_name(error)}: {escape(error['message'])}")
    else:
        console.print(f"{job['status']}")


@cli.command()
def status(job_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One look at a job."""
    with client_from_settings() as client:
        job = call(client.get, job_id)
    if as_json:
        print(json.dumps(job, indent=2))
        return
    table = Table(title=f"job {job['id']}", show_header=False)
    spec = job["spec"]
    table.add_row("status", job["status"] + (f" ({job['waiting_reason']})" if job["waiting_reason"] else ""))
    devices = spec.get("devices", 1)
    table.add_row(
        "spec",
        f"{spec['framework']} on {spec['hardware']}"
        f"{f' x{devices} devices' if devices > 1 else ''}, {dataset_label(spec['dataset'])}, "
        f"{spec['epochs']} epochs, batch {spec['batch_size']}",
    )
    table.add_row("progress", f"epoch {job['progress']['epoch']} of {job['progress']['epochs']}")
    if (worker := job["worker"]) and job["status"] != JobStatus.QUEUED:  # (a released job's is its last attempt's)
        table.add_row("worker", f"{worker['name']} on {', '.join(worker.get('devices', [])) or worker['hardware']}")
    if job["result"]:
        table.add_row("result", ", ".join(f"{k} {v:.4f}" for k, v in job["result"].items()))
    if job["timings"]:
        table.add_row("timings", ", ".join(f"{k} {v:.3g}" for k, v in job["timings"].items()))
    if job["error"]:
        table.add_row("error", f"{failure_name(job['error'])}: {escape(job['error']['message'])}")
    if job.get("retries") and job.get("last_error"):
        last = job["last_error"]
        table.add_row("retries", f"{job['retries']}, last after {failure_name(last)}: {escape(last['message'])}")
    for artifact in job["artifacts"]:
        table.add_row("artifact", f"{artifact['name']} ({artifact['size_bytes']} bytes)")
    Console().print(table)


@cli.command()
def cancel(
    job_id: str, wait: Annotated[bool, typer.Option("--wait", help="wait until the job has stopped")] = False
) -> None:
    """Cancel a job: a queued one never runs; a running one stops after the step it is on (its
    finished epochs' metrics stay). Cancelling a cancelled job is fine; exits 1 if it had
    already succeeded or failed."""
    with client_from_settings() as client:
        job = call(client.cancel, job_id)
        if job["status"] == JobStatus.RUNNING:
            print(f"job {job['id']}: cancel requested; it stops after its current step", file=sys.stderr)
            if wait:
                job = call(client.wait, job["id"])
    print(job["status"])


@cli.command()
def watch(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="print the final Job as JSON")] = False,
    timeout: Annotated[
        Optional[float], typer.Option(min=0.1, help="stop watching after this many seconds (exit 124)")
    ] = None,
) -> None:
    """Follow a job with a progress bar (epoch k of n, loss, accuracy, ETA) until it ends;
    exits 0 only when it succeeded."""
    with client_from_settings() as client:
        job = follow(client, job_id, timeout)
    if as_json:
        print(json.dumps(job, indent=2))
    if job["status"] != JobStatus.SUCCEEDED:
        raise typer.Exit(1)


@cli.command()
def download(
    job_id: str,
    artifact: Annotated[Optional[str], typer.Option(help="one artifact name; default all")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="directory")] = Path("."),
    as_json: Annotated[bool, typer.Option("--json", help="print [{name, path, size_bytes, sha256}] as JSON")] = False,
) -> None:
    """Fetch a job's artifacts (sha256 checked), with a progress bar on a terminal; prints each saved path."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    saved = []
    with client_from_settings() as client:
        listed = {a["name"]: a for a in call(client.artifacts, job_id)}
        names = [artifact] if artifact else list(listed)
        if not names:
            fail(f"job {job_id} has no artifacts (they are written when a job succeeds)")
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
            for name in names:
                task = progress.add_task(name, total=listed.get(name, {}).get("size_bytes"))
                try:
                    path = call(
                        client.download,
                        job_id,
                        name,
                        output,
                        on_progress=lambda done, total, task=task: progress.update(task, completed=done, total=total),
                    )
                except ValueError as exc:  # the checksum differs: the file was not kept
                    fail(str(exc))
                saved.append(
                    {
                        "name": name,
                        "path": str(path),
                        "size_bytes": listed[name]["size_bytes"],
                        "sha256": listed[name]["sha256"],
                    }
                )
                if not as_json:
                    print(path)
    if as_json:
        print(json.dumps(saved, indent=2))


@cli.command("list")
def list_jobs(
    status: Annotated[Optional[JobStatus], typer.Option(help="only jobs in this status")] = None,
    framework: Annotated[Optional[str], typer.Option(help="jax or pytorch")] = None,
    hardware: Annotated[Optional[str], typer.Option(help="cpu, gpu or tpu")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="jobs per page")] = 20,
    cursor: Annotated[Optional[str], typer.Option(help="the next_cursor a previous page printed")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JobPage as JSON")] = False,
) -> None:
    """Your jobs, newest first (an admin key: everyone's), with the API's filters."""
    with client_from_settings() as client:
        page = call(
            client.list,
            status=status.value if status else None,
            framework=framework,
            hardware=hardware,
            limit=limit,
            cursor=cursor,
        )
    if as_json:
        print(json.dumps(page, indent=2))
        return
    table = Table(title="jobs")
    table.add_column("id", min_width=8, no_wrap=True)
    for column in ("status", "runs on", "dataset", "epoch", "test score", "created", "name"):
        table.add_column(column)
    for job in page["items"]:
        spec = job["spec"]
        table.add_row(
            job["id"][:8],
            job["status"],
            f"{spec['framework']}/{spec['hardware']}",
            dataset_label(spec["dataset"]),
            f"{job['progress']['epoch']}/{job['progress']['epochs']}",
            test_score(job["result"] or {}, "").strip().removeprefix("test "),
            job["created_at"][:16].replace("T", " "),
            escape(spec.get("name") or ""),
        )
    Console().print(table)
    if page["next_cursor"]:
        console.print(f"more: trainhub list --cursor {page['next_cursor']}")


@cli.command("comparisons")
def list_comparisons(
    limit: Annotated[int, typer.Option(min=1, help="how many, newest first")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print the Comparisons as JSON")] = False,
) -> None:
    """Your comparisons, newest first: both jobs, the status and the parity check."""
    with client_from_settings() as client:
        comparisons = call(client.comparisons, limit)
    if as_json:
        print(json.dumps(comparisons, indent=2))
        return
    table = Table(title="comparisons")
    table.add_column("id", min_width=8, no_wrap=True)
    for column in ("status", "dataset", "jax job", "pytorch job", "parity", "created"):
        table.add_column(column, no_wrap=column.endswith("job"))
    for comparison in comparisons:
        parity = comparison["parity"]
        table.add_row(
            comparison["id"][:8],
            comparison["status"],
            dataset_label(comparison["spec"]["dataset"]),
            comparison["jobs"]["jax"]["id"][:8],
            comparison["jobs"]["pytorch"]["id"][:8],
            "" if parity is None else "passed" if parity["passed"] else "mismatch",
            comparison["created_at"][:19],
        )
    Console().print(table)


@cli.command("workers")
def list_workers(as_json: Annotated[bool, typer.Option("--json", help="print the WorkerList as JSON")] = False) -> None:
    """Who is online, what each serves, and how many jobs wait on each queue."""
    with client_from_settings() as client:
        fleet = call(client.workers)
    if as_json:
        print(json.dumps(fleet, indent=2))
        return
    queues = Table(title="queues")
    for column in ("queue", "queued jobs", "workers online"):
        queues.add_column(column, justify="left" if column == "queue" else "right")
    for queue in fleet["queues"]:
        queues.add_row(queue["name"], str(queue["depth"]), str(queue["workers_online"]))
    workers = Table(title="workers")
    for column in ("worker", "online", "serves", "devices", "current job"):
        workers.add_column(column)
    for w in fleet["workers"]:
        current = w["current_job_id"] or ("busy" if w["busy"] else "idle" if w["online"] else "")
        workers.add_row(
            w["name"], "yes" if w["online"] else "no", ", ".join(w["queues"]), ", ".join(w["devices"]), current
        )
    Console().print(queues, workers)


@cli.command()
def compare(
    hardware: Annotated[Optional[str], typer.Option(help="cpu, gpu or tpu (default cpu)")] = None,
    dataset: Annotated[Optional[str], typer.Option(help=DATASET_HELP)] = None,
    validation_split: Annotated[Optional[float], typer.Option(help=VALIDATION_SPLIT_HELP)] = None,
    epochs: Annotated[Optional[int], typer.Option(help="default 10")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="default 128")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(help="default 0.001")] = None,
    hidden_sizes: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. 256,128 (the default)")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="default 0")] = None,
    seed: Annotated[Optional[int], typer.Option(help="default 0")] = None,
    train_limit: Optional[int] = None,
    test_limit: Optional[int] = None,
    name: Optional[str] = None,
    webhook_url: Annotated[Optional[str], typer.Option(help=WEBHOOK_HELP + ", for both jobs")] = None,
    spec_file: Annotated[
        Optional[Path],
        typer.Option("--spec", help="a spec JSON file (no framework); options given with it override its fields"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the Comparison as JSON")] = False,
) -> None:
    """Train one spec in JAX and in PyTorch and print them side by side."""
    spec = spec_from_options(
        spec_file,
        hardware=hardware,
        dataset=dataset,
        validation_split=validation_split,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        hidden_sizes=hidden_sizes,
        dropout=dropout,
        seed=seed,
        train_limit=train_limit,
        test_limit=test_limit,
        name=name,
        webhook_url=webhook_url,
    )
    with client_from_settings() as client:
        comparison = call(client.compare, spec)
        console.print(
            f"comparison {comparison['id']}: jax job {comparison['jobs']['jax']['id']}, "
            f"pytorch job {comparison['jobs']['pytorch']['id']}"
        )
        with console.status("training in both frameworks…") as spinner:

            def update(c: dict) -> None:
                spinner.update(
                    " · ".join(
                        f"{fw} {job['status']} epoch {job['progress']['epoch']}/{job['progress']['epochs']}"
                        for fw, job in c["jobs"].items()
                    )
                )

            comparison = call(client.wait_comparison, comparison["id"], on_update=update)
    if as_json:
        print(json.dumps(comparison, indent=2))
    else:
        Console().print(comparison_table(comparison))
    if comparison["status"] != JobStatus.SUCCEEDED:
        error = comparison["error"] or {}
        fail(f"comparison {comparison['status']}: {error.get('type', '')}: {error.get('message', '')}")


def comparison_table(comparison: dict) -> Table:
    """The seeds' "Side by side" table, with measured numbers and the JAX/PyTorch ratio."""
    spec = comparison["spec"]
    caption = [(comparison["parity"] or {}).get("message") or ""]
    if comparison.get("overlap_s"):
        caption.append(
            f"the two jobs ran at the same time for {comparison['overlap_s']:.1f} s: "
            "on one host, their timings include that contention"
        )
    table = Table(
        title=f"{dataset_label(spec['dataset'])} {model_summary(spec['model'])} on {spec['hardware']}, "
        f"{spec['epochs']} epochs",
        caption="\n".join(c for c in caption if c),
    )
    for column in ("", "PyTorch", "JAX", "JAX / PyTorch"):
        table.add_column(column, justify="left" if not column else "right")
    for row in comparison["table"] or []:
        table.add_row(row["metric"], _number(row["pytorch"]), _number(row["jax"]), _number(row["ratio"]))
    return table


def model_summary(model: dict) -> str:
    """e.g. "MLP [256, 128]", "CNN conv [32, 64], dense [128], batch norm", "resnet8", "6 layers",
    or "your code code_... (m:f)"."""
    if model.get("code"):
        entrypoints = model.get("entrypoints") or {}
        named = model.get("entrypoint") or ", ".join(f"{fw} {ep}" for fw, ep in entrypoints.items())
        return f"your code {model['code']} ({named})"
    if model.get("layers"):
        return f"{len(model['layers'])} layers"
    name = model.get("name") or "mlp"
    if name == "cnn":
        text = f"CNN conv {model.get('channels')}, dense {model.get('hidden_sizes')}"
    elif name == "mlp":
        text = f"MLP {model.get('hidden_sizes')}"
    else:
        text = name
    return text + (", batch norm" if model.get("batch_norm") else "")


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


@cli.command()
def export(
    job_id: str,
    to: Annotated[str, typer.Option(help="the framework whose format to write: pytorch or jax")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory")] = Path("."),
) -> None:
    """Download a job's weights and write them in the other framework's format
    (state_dict.pt for pytorch, params.msgpack for jax)."""
    if to not in ("pytorch", "jax"):
        fail(f"--to must be pytorch or jax, not {to!r}")
    import tempfile

    from trainers.export import export as export_weights  # imports the framework; client side only

    # The downloaded weights are a means, not a result: only the exported file is left in `output`.
    with client_from_settings() as client, tempfile.TemporaryDirectory(prefix="trainhub-export-") as scratch:
        weights = call(client.download, job_id, "weights.safetensors", Path(scratch))
        print(export_weights(weights, to, output))


@cli.command()
def demo(
    epochs: int = 5,
    dataset: str = "fashion-mnist",
    var_dir: Annotated[
        Path, typer.Option(help="where the embedded stack keeps its files", envvar="TRAINHUB_VAR_DIR")
    ] = Path("var"),
) -> None:
    """Start the embedded stack, train the seeds' MLP (on Fashion-MNIST by default) in JAX and in
    PyTorch through the HTTP API, print them side by side, and stop the stack."""
    from app.demo import run_demo

    raise typer.Exit(run_demo(epochs=epochs, dataset=dataset, var_dir=var_dir))


# --- datasets --------------------------------------------------------------------------------


class UploadTask(StrEnum):
    """What an uploaded dataset's labels are (POST /datasets `task`)."""

    classification = "classification"
    regression = "regression"


class UploadFormat(StrEnum):
    """How to read an upload (POST /datasets `format`)."""

    npz = "npz"
    idx = "idx"
    csv = "csv"
    parquet = "parquet"
    imagefolder = "imagefolder"


@datasets_cli.command("upload")
def datasets_upload(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="the file to upload")],
    name: Annotated[Optional[str], typer.Option(help="default: the file's name without its extension")] = None,
    label_column: Annotated[
        Optional[str], typer.Option(help="csv, parquet: the column of labels (default: label)")
    ] = None,
    image_size: Annotated[
        Optional[str], typer.Option(help="imagefolder: resize the images to HxW, or N for NxN")
    ] = None,
    task: Annotated[
        Optional[UploadTask], typer.Option(help="default: guessed from the labels (floats: regression)")
    ] = None,
    data_format: Annotated[
        Optional[UploadFormat], typer.Option("--format", help="default: from the file's name, else detected")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the Dataset as JSON")] = False,
) -> None:
    """Upload a dataset file (streamed, with a progress bar on a terminal); prints its id (or the
    Dataset as JSON). The same content uploaded again gives back the dataset it already made."""
    options = {"name": name, "label_column": label_column, "image_size": image_size}
    options |= {"task": task.value if task else None, "format": data_format.value if data_format else None}
    with client_from_settings() as client:
        had = {d["id"] for d in call(client.datasets) if not d["built_in"]}
        dataset = send_dataset(client, path, options)
    if dataset["id"] in had:
        console.print(f"already uploaded as {dataset['id']} (named {escape(repr(dataset['name']))})")
    if as_json:
        print(json.dumps(dataset, indent=2))
    else:
        print(dataset["id"])


def send_dataset(client: TrainhubClient, path: Path, options: dict[str, str | None]) -> dict:
    """POST the file at `path` with a bar of the bytes sent (on stderr, on a terminal only); the Dataset."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    shown = escape(path.name)
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"uploading {shown}", total=path.stat().st_size)

        def sent(done: int, total: int) -> None:
            step = f"{shown} sent; the server reads and checks it…" if done >= total else f"uploading {shown}"
            progress.update(task, completed=done, total=total, description=step)

        return call(client.upload_dataset, path, on_progress=sent, **options)


@datasets_cli.command("list")
def datasets_list(as_json: Annotated[bool, typer.Option("--json", help="print the Datasets as JSON")] = False) -> None:
    """The built-in datasets this deployment has (pass their name to --dataset), then yours,
    newest first (pass their id)."""
    with client_from_settings() as client:
        datasets = call(client.datasets)
    if as_json:
        print(json.dumps(datasets, indent=2))
        return
    table = Table(title="datasets")
    table.add_column("id", no_wrap=True)
    for column in ("name", "task", "input shape", "classes", "train", "test", "bytes", "created"):
        table.add_column(column, justify="right" if column in ("classes", "train", "test", "bytes") else "left")
    for dataset in datasets:
        table.add_row(
            "built-in" if dataset["built_in"] else dataset["id"],
            escape(dataset["name"]),
            dataset["task"],
            _shape(dataset["input_shape"]),
            str(dataset["num_classes"] or "-"),
            f"{dataset['train_size']:,}",
            f"{dataset['test_size']:,}",
            _bytes(dataset.get("bytes")),
            (dataset.get("created_at") or "")[:16].replace("T", " "),
        )
    Console().print(table)


@datasets_cli.command("show")
def datasets_show(
    dataset_id: Annotated[str, typer.Argument(help="the id `trainhub datasets list` shows")],
    as_json: Annotated[bool, typer.Option("--json", help="print the Dataset as JSON")] = False,
) -> None:
    """One of your datasets: format, task, shapes, classes, split sizes, bytes and sha256."""
    with client_from_settings() as client:
        dataset = call(client.get_dataset, dataset_id)
    if as_json:
        print(json.dumps(dataset, indent=2))
        return
    table = Table(title=f"dataset {dataset['id']}", show_header=False)
    rows = {
        "name": escape(dataset["name"]),
        "data": f"{dataset['format']}, {dataset['task']}, input shape {_shape(dataset['input_shape'])}",
        "classes": _classes(dataset),
        "examples": f"{dataset['train_size']:,} train, {dataset['test_size']:,} test"
        + ("" if dataset["test_size"] else " (submit with --validation-split to hold out a test split)"),
        "bytes": f"{_bytes(dataset['bytes'])} stored, {_bytes(dataset['upload_bytes'])} uploaded",
        "sha256": dataset["sha256"],
        "created": dataset["created_at"],
    }
    for field, value in rows.items():
        table.add_row(field, value)
    Console().print(table)


@datasets_cli.command("delete")
def datasets_delete(dataset_id: Annotated[str, typer.Argument(help="the id `trainhub datasets list` shows")]) -> None:
    """Delete one of your datasets and its stored data. Refused (exit 1) while a queued or running
    job uses it; finished jobs that trained on it keep their results."""
    with client_from_settings() as client:
        dataset = call(client.get_dataset, dataset_id)
        call(client.delete_dataset, dataset["id"])
    print(f"deleted dataset {dataset['id']} named {dataset['name']!r} ({_bytes(dataset['bytes'])})")


def _classes(dataset: dict, shown: int = 20) -> str:
    """e.g. "3: cat, dog, bird"; "-" for a regression dataset."""
    names = dataset["class_names"] or []
    if not dataset["num_classes"]:
        return "-"
    listed = ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
    return f"{dataset['num_classes']}: {escape(listed)}" if names else str(dataset["num_classes"])


def _shape(shape: list[int]) -> str:
    return "x".join(str(n) for n in shape)


def _bytes(size: int | None) -> str:
    from rich.filesize import decimal

    return "" if size is None else decimal(size)


# Sweeps and gc have their own modules (they import the helpers above when their commands run).
from app import cli_code, cli_gc, cli_sweeps, cli_webhooks  # noqa: E402

cli_sweeps.register(cli)
cli_gc.register(cli)
cli_webhooks.register(cli)
cli_code.register(cli)

__all__ = ["cli", "main", "FINISHED"]


if __name__ == "__main__":
    main()
