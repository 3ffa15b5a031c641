"""`make deploy-test` (`python -m bench.deploy_test`): docker-compose.yml run for real, with podman.

    python -m bench.deploy_test [--local-images] [--build-only] [--timeout-s 900]

1. images: with --local-images, docker/local-base.sh makes the Debian base and the PostgreSQL and
   Redis images from the Debian mirror (for hosts that cannot pull public images); then
   `podman-compose build` builds the API image and the cpu worker image (JAX only:
   TRAINHUB_CPU_EXTRAS=jax, see below) from the compose file's build sections;
2. up: the default services of the compose file, started in the order of their `depends_on`,
   each condition waited for as docker compose waits for it (service_healthy: the service's own
   healthcheck passes; service_completed_successfully: it exited 0). podman before 4.6 neither
   runs healthchecks without systemd nor waits on them, so this script runs each one with
   `podman healthcheck run` until it passes, as a docker daemon would;
3. a key made inside the API container (`trainhub keys create`), a JAX job submitted through
   the published API port, run on the worker container to `succeeded`, and its
   weights.safetensors downloaded and checked (sha256 and the MLP's tensor shapes);
4. a longer job, and the worker container restarted (`podman-compose restart`, SIGTERM with the
   stop_grace_period) after its first epoch: the job goes back to the queue, the restarted worker
   resumes it from its checkpoint on the shared artifact volume (it records no epoch twice) and
   it succeeds with every epoch recorded once (attempts 2);
5. down: `podman-compose down -v`, then no container, volume or network of the project is left.
   `--build-only` runs step 1 alone (CI builds the images while the tests run; the full run
   after them finds every layer cached).
   Step 5 runs however the others end (an error, Ctrl-C, SIGTERM), after printing the end of
   every service's log when something failed.

The stack runs as compose project `trainhub-deploy-test` (its own network and volumes) with the
API published on a free port of 127.0.0.1's host (TRAINHUB_API_PORT), so it never touches a
PostgreSQL or Redis of the host. The cpu worker is JAX only (TRAINHUB_CPU_EXTRAS=jax): PyPI's
torch wheels are the CUDA builds (gigabytes), and the CPU ones come from download.pytorch.org,
which a host that only reaches a PyPI mirror cannot fetch. Each step prints its time; exit 0 when
all pass, 1 (with what failed) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "trainhub-deploy-test"
LOCAL_IMAGES = {
    "TRAINHUB_BASE_IMAGE": "localhost/trainhub-base:bookworm",
    "TRAINHUB_POSTGRES_IMAGE": "localhost/trainhub-postgres:15",
    "TRAINHUB_REDIS_IMAGE": "localhost/trainhub-redis:7",
}
# Digits (bundled with scikit-learn): seconds. The second job is Fashion-MNIST, long enough for a
# restart to land mid-run (0.5-1 s an epoch on one shared core), and the 784-256-128-10 MLP.
QUICK = {"framework": "jax", "hardware": "cpu", "dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}
LONG = {
    "framework": "jax",
    "hardware": "cpu",
    "epochs": 20,
    "batch_size": 32,
    "dataset": {"name": "fashion-mnist", "train_limit": 12000, "test_limit": 2000},
}


class Failed(Exception):
    """A step's check did not hold; the message says what was seen."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deploy_test", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--local-images",
        action="store_true",
        help="make the base, PostgreSQL and Redis images locally (docker/local-base.sh)",
    )
    parser.add_argument("--build-only", action="store_true", help="make the images (step 1) and stop")
    parser.add_argument("--timeout-s", type=float, default=900, help="the whole test's deadline")
    args = parser.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the stack still comes down.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    # BUILDAH_FORMAT: podman builds Docker-format images, which keep the Dockerfiles' HEALTHCHECK
    # (its default OCI format drops it), so the images are those `docker build` makes.
    env = {
        **os.environ,
        "TRAINHUB_CPU_EXTRAS": "jax",
        "TRAINHUB_API_PORT": str(free_port()),
        "BUILDAH_FORMAT": "docker",
    }
    if args.local_images:
        env.update(LOCAL_IMAGES)
    stack = Stack(env, deadline=time.monotonic() + args.timeout_s)
    started = time.monotonic()
    ok = False
    try:
        local_base = [str(ROOT / "docker" / "local-base.sh")]
        if args.local_images:
            with step("the local Debian base (docker/local-base.sh base)"):
                run([*local_base, "base"], env=env, capture=False)
        with step(
            "build the api and cpu worker images (podman-compose build)"
            + (", and PostgreSQL and Redis (docker/local-base.sh services)" if args.local_images else "")
        ):
            # apt and pip download while the other builds unpack: side by side is quicker
            services = subprocess.Popen([*local_base, "services"], env=env) if args.local_images else None
            # the API image first: the worker image's first layers are its (the same steps)
            stack.build("api")
            stack.build("worker-cpu")
            if services is not None and services.wait() != 0:
                raise Failed(f"docker/local-base.sh services exited {services.returncode}")
        if args.build_only:
            ok = True
            print(f"\nimages built in {time.monotonic() - started:.0f} s")
            return 0
        stack.down(quiet=True)  # what an interrupted earlier run may have left
        for level in stack.start_order():
            with step(f"up {', '.join(level)}"):
                stack.up(level)
        key = stack.create_key()
        client = stack.client(key)
        with step("a job through the published port, run on the worker container"):
            job = client.submit(QUICK)
            job = wait_job(client, job["id"], stack.left_s())
            check(job["status"] == "succeeded", f"job {job['id']} ended {job['status']}: {job.get('error')}")
            print(f"    job {job['id']}: {job['status']}, test accuracy {job['result']['test_accuracy']:.3f}")
            cached = stack.exec("worker-cpu", "sh", "-c", "ls -A /srv/trainhub/var/jax-cache | wc -l").strip()
            check(int(cached) > 0, "the worker kept no compiled program in its jax-cache volume")
            print(f"    the jax-cache volume holds {cached} compiled programs")
        with step("download its weights"):
            check_weights(client, job["id"], inputs=64)
        with step("restart the worker container mid-job; the job resumes and succeeds"):
            restart_mid_job(stack, client)
        ok = True
    except (Failed, subprocess.CalledProcessError, TimeoutError) as exc:
        detail = f"\n{exc.output}" if isinstance(exc, subprocess.CalledProcessError) and exc.output else ""
        print(f"\nFAILED: {exc}{detail}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        if not ok:
            stack.print_logs()
        with step("down -v: no container, volume or network left"):
            stack.down()
            left = stack.leftovers()
            if left:
                print(f"FAILED: left behind: {left}", file=sys.stderr)
                ok = False
    print(f"\ndeploy test {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


class Stack:
    """The compose project under test, driven with podman-compose and podman."""

    def __init__(self, env: dict[str, str], deadline: float) -> None:
        self.env = env
        self.deadline = deadline
        self.compose_file = ROOT / "docker-compose.yml"
        self.config = self._config()
        self.port = int(env["TRAINHUB_API_PORT"])

    def left_s(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the test's deadline (--timeout-s) passed")
        return left

    def compose(self, *args: str, capture: bool = True) -> str:
        podman_compose = shutil.which("podman-compose", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        if podman_compose is None:
            raise Failed("podman-compose is not installed (pip install podman-compose)")
        command = [podman_compose, "--project-name", PROJECT, "--file", str(self.compose_file), *args]
        return run(command, env=self.env, capture=capture)

    def _config(self) -> dict:
        """The compose file as podman-compose reads it (variables and merge keys applied)."""
        import yaml

        return yaml.safe_load(self.compose("config"))

    def services(self) -> dict[str, dict]:
        """The services `up` starts with no profile given."""
        return {name: s for name, s in self.config["services"].items() if not s.get("profiles")}

    def start_order(self) -> list[list[str]]:
        return start_order(self.services())

    def build(self, *services: str) -> None:
        self.compose("build", *services, capture=False)

    def up(self, names: list[str]) -> None:
        """Start `names` (their dependencies are up and their conditions met), then wait for
        what the services after them wait for: health, or exit 0."""
        services = self.services()
        self.compose("up", "--detach", "--no-deps", *names)
        for name in names:
            waited_for = {d[name] for s in services.values() for d in [depends(s)] if name in d}
            if "service_completed_successfully" in waited_for:
                code = run(["podman", "wait", self.container(name)]).strip()
                check(code == "0", f"{name} exited {code}, not 0")
                print(f"    {name}: exited 0")
            if "healthcheck" in services[name]:
                self.wait_healthy(name)

    def wait_healthy(self, name: str) -> None:
        """Run the container's healthcheck (its test, as the compose file gives it) until it
        passes; as docker does, a failure is only final after start_period and the retries."""
        container = self.container(name)
        health = self.services()[name]["healthcheck"]
        patience = seconds(health.get("start_period", "0s")) + seconds(health.get("interval", "30s")) * int(
            health.get("retries", 3)
        )
        until = time.monotonic() + min(patience + 30, self.left_s())
        while True:
            result = subprocess.run(["podman", "healthcheck", "run", container], capture_output=True, text=True)
            if result.returncode == 0:
                print(f"    {name}: healthy")
                return
            state = run(["podman", "inspect", "--format", "{{.State.Status}}", container]).strip()
            if state not in ("running", "created") or time.monotonic() > until:
                raise Failed(f"{name} is not healthy ({state}): {(result.stdout + result.stderr).strip()[-500:]}")
            time.sleep(2)

    def container(self, name: str) -> str:
        names = run(
            [
                "podman",
                "ps",
                "--all",
                "--format",
                "{{.Names}}",
                "--filter",
                f"label=io.podman.compose.project={PROJECT}",
                "--filter",
                f"label=com.docker.compose.service={name}",
            ]
        ).split()
        check(len(names) == 1, f"service {name}: containers {names}")
        return names[0]

    def exec(self, name: str, *command: str) -> str:
        return run(["podman", "exec", self.container(name), *command])

    def create_key(self) -> str:
        with step("a key made in the API container (trainhub keys create)"):
            out = self.exec("api", "trainhub", "keys", "create", "--name", "deploy-test")
            key = out.strip().splitlines()[-1].strip()
            check(key.startswith("th_"), f"keys create printed {out!r}")
            return key

    def client(self, key: str):
        from app.client import TrainhubClient

        client = TrainhubClient(f"http://127.0.0.1:{self.port}", key)
        ready = client.http.get("/readyz")
        check(ready.status_code == 200, f"GET /readyz on the published port {self.port}: {ready.status_code}")
        return client

    def restart(self, name: str) -> None:
        self.compose("restart", name)

    def logs(self, name: str, since: str | None = None) -> str:
        args = ["--since", since] if since else []
        result = subprocess.run(["podman", "logs", *args, self.container(name)], capture_output=True, text=True)
        return result.stdout + result.stderr

    def print_logs(self, lines: int = 40) -> None:
        for name in self.services():
            try:
                text = self.logs(name)
            except (Failed, subprocess.CalledProcessError):
                continue
            tail = "\n".join(text.splitlines()[-lines:])
            print(f"\n--- {name} (last {lines} lines) ---\n{tail}", file=sys.stderr)

    def down(self, quiet: bool = False) -> None:
        try:
            self.compose("down", "--volumes", "--remove-orphans", "--timeout", "30")
        except subprocess.CalledProcessError as exc:
            if not quiet:
                print(f"    podman-compose down: {exc}", file=sys.stderr)
        # Whatever `down` missed (a container of an interrupted `up`): by the project's label.
        label = f"label=io.podman.compose.project={PROJECT}"
        for kind in ("container", "volume", "network"):
            names = self._listed(kind, label)
            if names:
                extra = ["--force", "--time", "10"] if kind == "container" else ["--force"]
                subprocess.run(["podman", kind, "rm", *extra, *names], capture_output=True)

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=io.podman.compose.project={PROJECT}"
        left = {kind: self._listed(kind, label) for kind in ("container", "volume", "network")}
        # and by name, should a podman-compose version not label one of them
        left["volume"] += [v for v in self._listed("volume") if v.startswith(PROJECT) and v not in left["volume"]]
        left["network"] += [n for n in self._listed("network") if n.startswith(PROJECT) and n not in left["network"]]
        return {kind: names for kind, names in left.items() if names}

    def _listed(self, kind: str, label: str | None = None) -> list[str]:
        command = ["podman", kind, "ls" if kind != "container" else "ps"]
        if kind == "container":
            command.append("--all")
        command += ["--format", "{{.Name}}" if kind != "container" else "{{.Names}}"]
        if label:
            command += ["--filter", label]
        return run(command).split()


def restart_mid_job(stack: Stack, client) -> None:
    job = client.submit(LONG)
    # after its first checkpoint (epoch 1), with most of its epochs to go
    wait_for(lambda: (client.get(job["id"])["progress"] or {}).get("epoch", 0) >= 1, stack.left_s(), "epoch 1")
    at = client.get(job["id"])["progress"]["epoch"]
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stack.restart("worker-cpu")
    print(f"    restarted worker-cpu at epoch {at}")
    stack.wait_healthy("worker-cpu")
    job = wait_job(client, job["id"], stack.left_s())
    check(job["status"] == "succeeded", f"job {job['id']} ended {job['status']} after the restart: {job.get('error')}")
    epochs = [m["epoch"] for m in job["metrics"]]
    check(epochs == list(range(1, LONG["epochs"] + 1)), f"epochs recorded {epochs}")
    # A warm stop hands the job back uncounted (attempts stays 1; a lost worker would count).
    check(job["attempts"] == 1, f"attempts {job['attempts']}: the stopped worker did not hand the job back")
    log = stack.logs("worker-cpu", since=since)
    resumed = re.search(rf"resuming from the checkpoint of epoch (\d+) in \S*{job['id']}", log)
    check(
        resumed is not None,
        "the restarted worker did not resume the job from a checkpoint (its log says no "
        "'resuming from the checkpoint of epoch')",
    )
    check(at <= int(resumed.group(1)) < LONG["epochs"], f"resumed at epoch {resumed.group(1)}, the restart was at {at}")
    print(
        f"    job {job['id']}: resumed from its epoch {resumed.group(1)} checkpoint and succeeded, "
        f"epochs 1..{epochs[-1]} "
        "recorded once each"
    )


def check_weights(client, job_id: str, inputs: int) -> None:
    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory() as tmp:
        path = client.download(job_id, "weights.safetensors", Path(tmp))  # sha256-checked against the listing
        tensors = load_file(path)
    shapes = {name: list(t.shape) for name, t in tensors.items()}
    check(shapes.get("layers.0.weight", [None, None])[1] == inputs, f"weights.safetensors holds {shapes}")
    print(f"    weights.safetensors: {len(shapes)} tensors, {json.dumps(shapes)}")


def wait_job(client, job_id: str, timeout_s: float) -> dict:
    try:
        return client.wait(job_id, poll_s=1, timeout_s=timeout_s)
    except TimeoutError:
        job = client.get(job_id)
        raise Failed(f"job {job_id} still {job['status']} ({job.get('waiting_reason')})") from None


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    until = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > until:
            raise Failed(f"timed out waiting for {what}")
        time.sleep(0.5)


def start_order(services: dict[str, dict]) -> list[list[str]]:
    """The services in levels, each sorted: a level's dependencies are all in earlier levels."""
    levels: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(services):
        level = sorted(n for n, s in services.items() if n not in placed and set(depends(s)) <= placed)
        if not level:
            raise Failed(f"depends_on has a cycle among {set(services) - placed}")
        levels.append(level)
        placed |= set(level)
    return levels


def depends(service: dict) -> dict[str, str]:
    """A service's depends_on as {service: condition} (the list form means service_started)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (d or {}).get("condition", "service_started") for name, d in deps.items()}


def seconds(duration: str) -> float:
    """A compose duration ("1m30s", "15s", "500ms") in seconds."""
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    i = 0
    while i < len(duration):
        ch = duration[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if duration.startswith("ms", i) else "us" if duration.startswith("us", i) else ch
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    return total + (float(number) if number else 0)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


def run(command: list[str], env: dict[str, str] | None = None, capture: bool = True) -> str:
    """Run `command`; its stdout (or "" when not captured). Raises CalledProcessError with its
    stderr on a non-zero exit."""
    result = subprocess.run(
        command,
        env=env,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if result.returncode != 0:
        detail = (result.stderr or "").strip()[-2000:]
        raise subprocess.CalledProcessError(result.returncode, " ".join(command[:4]) + " ...", detail) from None
    return result.stdout or ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def step(what: str) -> Iterator[None]:
    print(f"{time.strftime('%H:%M:%S')} {what} ...", flush=True)
    started = time.monotonic()
    try:
        yield
    finally:
        print(f"{time.strftime('%H:%M:%S')}   {time.monotonic() - started:.1f} s: {what}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
