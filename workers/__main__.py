"""`python -m workers --hardware cpu [--devices 0,1] [--cpu-devices 2] [--frameworks jax,pytorch]`

Pins the process to its hardware before any framework is imported, checks which frameworks
really use that hardware, and consumes `<hardware>.<framework>` for each of them with a solo
pool (the process that imports a framework is the one that trains; one job at a time).
Exits with code 2 and a message when it can serve nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable

from trainers.spec import FRAMEWORKS, HARDWARE
from workers.hardware import detect, pin


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trainhub worker", description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", choices=list(HARDWARE), default="cpu")
    parser.add_argument(
        "--devices",
        type=lambda s: [int(d) for d in s.split(",") if d != ""],
        default=None,
        help="device indices to pin to, e.g. 0,1 (cpu: core numbers)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=1,
        help="cpu only: how many devices the worker's cores count as for data parallel jobs "
        "(spec devices > 1); at most the cores it owns",
    )
    parser.add_argument(
        "--frameworks",
        type=lambda s: [f for f in s.split(",") if f],
        default=list(FRAMEWORKS),
        help="frameworks to serve, e.g. jax,pytorch",
    )
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    unknown = [f for f in args.frameworks if f not in FRAMEWORKS]
    if unknown:
        parser.error(f"--frameworks: unknown {', '.join(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_when_ready = stop_once_celery_is_ready()  # first: importing a framework takes seconds
    try:
        pin(args.hardware, args.devices, args.cpu_devices)  # before jax or torch is imported anywhere
    except ValueError as exc:
        print(f"trainhub worker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. --devices names a core this host (or cgroup) does not have
        print(f"trainhub worker: cannot pin to {args.hardware} devices {args.devices}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    caps = detect(args.hardware, args.frameworks, args.cpu_devices)
    for framework, why in caps.refused.items():
        print(f"trainhub worker: not serving {args.hardware}.{framework}: {why}", file=sys.stderr)
    if not caps.queues:
        print(
            f"trainhub worker: this host cannot serve any of {', '.join(args.frameworks)} on "
            f"{args.hardware}; nothing to do",
            file=sys.stderr,
        )
        return 2

    from pydantic import ValidationError

    from app.config import get_settings, setting_problems

    try:
        settings = get_settings()  # before any import that reads them
    except ValidationError as error:
        problems = setting_problems(error)
        if problems is None:
            raise
        for line in problems:
            print(f"trainhub worker: {line}", file=sys.stderr)
        return 2
    from app.db import migrate, schema_current
    from app.storage import StoreUnavailable, get_store
    from workers.celery_app import celery

    try:
        get_store(settings).check()  # a worker that could train but not store its results serves nothing
    except StoreUnavailable as exc:
        print(f"trainhub worker: cannot store artifacts ({settings.artifact_store}): {exc}", file=sys.stderr)
        return 2
    from workers.identity import Heartbeat, broker_reachable, register

    if not schema_current():  # most starts find it migrated: no Alembic, no migration lock
        migrate()
    # The task's code, before the first heartbeat: online then means a job is taken within about
    # a tenth of a second, not after the ~0.7 s Celery would spend importing it (and no framework
    # is imported by it: each job imports its own).
    from celery.apps import worker as _celery_worker  # noqa: F401

    import workers.tasks  # noqa: F401

    identity, heartbeat = register(caps), None
    try:
        # Online once Celery consumes, so a job submitted then is taken at once (a beat before
        # Celery's ~0.3 s start told clients to expect that sooner): until then its beats say
        # broker_ok false. The first beat waits for Celery too, unless the broker does not answer:
        # then the worker is listed at once, as not online, rather than missing. The reconciler
        # (and its imports) is first needed a heartbeat later.
        heartbeat = Heartbeat(
            identity, settings.heartbeat_s, reconcile_later, beat_now=not broker_reachable(), consuming=False
        )
        print(
            f"trainhub worker {identity.name} serving {', '.join(caps.queues)} on {', '.join(caps.devices)}", flush=True
        )
        if settings.allow_user_code:  # which of its walls this host gives (README: user code security)
            from workers import sandbox

            print(f"trainhub worker: user code runs in a child with {sandbox.available()}", flush=True)
            from workers import cgroup

            if removed := cgroup.remove_orphans():  # what a worker killed outright left on this host
                print(f"trainhub worker: removed {removed} job cgroup(s) a stopped worker left", flush=True)
        from workers import warm_up

        served = {queue.split(".")[1] for queue in caps.queues}
        warm = [f for f in settings.warm_up.split(",") if f in served]
        # (the warm-up's imports would slow Celery's start: they follow it)
        once_consuming(heartbeat.consuming, lambda: warm_up.start(warm))
        if stop_when_ready:  # stopped while starting
            return 0
        celery.worker_main(
            [
                "worker",
                "--pool=solo",
                "--concurrency=1",
                f"--queues={','.join(caps.queues)}",
                f"--hostname=trainhub-{args.hardware}@{identity.name}",
                f"--loglevel={args.loglevel}",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:  # a warm shutdown (SIGTERM, SIGINT) has released the job it was running
        if heartbeat is not None:
            heartbeat.stop()
    return 0


def reconcile_later() -> None:
    """The heartbeat's tick: workers/reconciler.py, imported at its first call."""
    from workers.reconciler import reconcile

    reconcile()


def once_consuming(*steps: Callable[[], object]) -> None:
    """Run `steps` in turn when Celery is ready (consuming its queues), in its thread; a step that
    raises is logged (the heartbeat thread's next beat is the fallback) and the next one runs."""
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)
    def _run(**_: object) -> None:
        for step in steps:
            try:
                step()
            except Exception as exc:  # e.g. the database is away for the first beat
                logging.getLogger(__name__).warning("once consuming: %s: %s", type(exc).__name__, exc)


def stop_once_celery_is_ready() -> list[int]:
    """Until Celery installs its signal handlers, a SIGTERM or SIGINT (Ctrl-C) is remembered (in
    the returned list) rather than fatal, or lost in whatever code it lands in; once the worker
    is ready it is sent again, to Celery's handler: a warm shutdown, so the worker leaves the
    fleet through main's `finally` whenever it was stopped."""
    from celery.signals import worker_ready

    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: received.append(signum))

    @worker_ready.connect(weak=False)
    def _stop_if_asked(**_: object) -> None:
        if received:
            os.kill(os.getpid(), received[0])

    return received


if __name__ == "__main__":
    sys.exit(main())
