"""`make demo`: the seeds' MLP (784-256-128-10) trained in JAX and in PyTorch through the embedded stack."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from app.client import FINISHED, TrainhubClient
from app.status import JobStatus

console = Console()

# The seeds' model: 784-256-128-10, ReLU, Adam 1e-3, batch 128.
SEED_MLP = {
    "model": {"name": "mlp", "hidden_sizes": [256, 128], "dropout": 0.0},
    "optimizer": {"name": "adam", "learning_rate": 1e-3},
    "batch_size": 128,
    "seed": 0,
}


def start_up(var_dir: Path) -> tuple[subprocess.Popen, str, str]:
    """Run `trainhub up` on a free port; return the process, its URL and the API key it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "up", "--port", "0", "--var-dir", str(var_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = key = None
    assert process.stdout is not None  # stdout=PIPE
    for line in process.stdout:
        if match := re.match(r"trainhub is up at (\S+)", line):
            url = match.group(1)
        if line.startswith("API key: "):
            key = line.split(": ", 1)[1].strip()
            break
    if not url or not key:
        process.wait()
        raise RuntimeError(f"`trainhub up` exited with code {process.returncode} before it was ready")
    return process, url, key


def run_demo(epochs: int, dataset: str, var_dir: Path) -> int:
    console.print(f"starting the embedded stack under {var_dir}/ …")
    process, url, key = start_up(var_dir)
    try:
        console.print(f"API at {url}; submitting the seeds' MLP on {dataset}, {epochs} epochs, in JAX and PyTorch")
        with TrainhubClient(url, key) as client:
            jobs = [
                client.submit(
                    {**SEED_MLP, "framework": fw, "epochs": epochs, "dataset": {"name": dataset}, "name": f"demo-{fw}"}
                )
                for fw in ("jax", "pytorch")
            ]
            jobs = watch(client, [j["id"] for j in jobs])
            weights = {
                j["id"]: client.download(j["id"], "weights.safetensors", var_dir / "demo" / j["spec"]["framework"])
                for j in jobs
                if j["status"] == JobStatus.SUCCEEDED
            }
        console.print(side_by_side(jobs, weights))
        ok = all(j["status"] == JobStatus.SUCCEEDED for j in jobs)
        for job in jobs:
            if job["error"]:
                console.print(
                    f"[red]{job['spec']['framework']} failed[/red]: {job['error']['type']}: {job['error']['message']}"
                )
        return 0 if ok else 1
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
        console.print("stack stopped")


def watch(client: TrainhubClient, job_ids: list[str]) -> list[dict]:
    """Progress bars for the jobs until all have ended; the final Jobs."""
    with Progress(
        TextColumn("{task.description:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    ) as progress:
        tasks = {job_id: progress.add_task(job_id, total=None, info=JobStatus.QUEUED.value) for job_id in job_ids}
        while True:
            jobs = [client.get(job_id) for job_id in job_ids]
            for job in jobs:
                last = job["metrics"][-1] if job["metrics"] else None
                info = job["waiting_reason"] or job["status"]
                if last:
                    info = f"{job['status']}  loss {last['train_loss']:.4f}  test acc {last['test_accuracy']:.4f}"
                progress.update(
                    tasks[job["id"]],
                    description=job["spec"]["framework"],
                    total=job["progress"]["epochs"],
                    completed=job["progress"]["epoch"],
                    info=info,
                )
            if all(job["status"] in FINISHED for job in jobs):
                return jobs
            time.sleep(0.5)


def side_by_side(jobs: list[dict], weights: dict[str, Path]) -> Table:
    table = Table(title=f"The seeds' MLP on {jobs[0]['spec']['dataset']['name']}, trained by trainhub")
    table.add_column("")
    for job in jobs:
        table.add_column(job["spec"]["framework"], justify="right", overflow="fold")

    def row(label: str, value: Callable[[dict], str]) -> None:
        table.add_row(label, *[value(j) for j in jobs])

    def timing(name: str) -> Callable[[dict], str]:
        return lambda j: f"{j['timings'][name]:.3f}" if j["timings"] else "-"

    row("status", lambda j: j["status"])
    row("compile s", timing("compile_s"))
    row("first epoch s", timing("first_epoch_s"))
    row("steady s/epoch", timing("steady_epoch_s"))
    row("test accuracy", lambda j: f"{j['result']['test_accuracy']:.4f}" if j["result"] else "-")
    row("weights", lambda j: str(weights.get(j["id"], "-")))
    return table
