"""The sweep example of the README, measured: the same random search over the seeds' MLP's
learning rate on Fashion-MNIST run twice through the service (the API and one cpu worker over
PostgreSQL and Redis), once with ASHA pruning and once running every trial to the end.

Both sweeps draw the same learning rates (RandomSampler seeded by the sweep's seed and the
trial's number), so the difference is the pruning alone: trials pruned, the best learning rate
found, summed train time and wall time, and the ratios. Writes bench/sweeps.json.

    .venv/bin/python -m bench.sweeps [--trials 12] [--epochs 5] [--train-limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.service import Service, ensure_database

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"


def sweep_spec(trials: int, epochs: int, train_limit: int | None, pruning: bool) -> dict:
    """The seeds' MLP (784-256-128-10, Adam, batch 128) on Fashion-MNIST, its learning rate searched."""
    dataset = {"name": "fashion-mnist", **({"train_limit": train_limit} if train_limit else {})}
    return {
        "base": {"framework": "jax", "dataset": dataset, "epochs": epochs, "batch_size": 128,
                 "labels": {"bench": "sweeps"}},
        "space": {"optimizer.learning_rate": {"log_uniform": [1e-5, 1e-1]}},
        "objective": {"metric": "test_accuracy", "direction": "max"},
        "method": "random", "max_trials": trials, "parallelism": 1, "seed": 0,
        **({"early_stopping": {"method": "asha", "min_epochs": 1, "reduction_factor": 3}} if pruning else {}),
        "name": "bench asha" if pruning else "bench every trial to the end",
    }


def run_sweep(service: Service, spec: dict, timeout_s: float = 3600.0) -> dict:
    """POST the sweep, wait for it to end; its figures."""
    with service.client() as client:
        start = time.perf_counter()
        response = client.post("/sweeps", json=spec)
        response.raise_for_status()
        sweep = response.json()
        while sweep["status"] == "running":
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError(f"sweep {sweep['id']} still running after {timeout_s} s")
            time.sleep(0.5)
            sweep = client.get(f"/sweeps/{sweep['id']}").json()
        wall_s = time.perf_counter() - start
        trials = client.get(f"/sweeps/{sweep['id']}/trials").json()["items"]
    best = sweep["best"] or {}
    return {
        "id": sweep["id"],
        "status": sweep["status"],
        "trials": sweep["trials"],
        "best_learning_rate": best.get("params", {}).get("optimizer.learning_rate"),
        "best_test_accuracy": best.get("objective"),
        "train_s": sweep["budget"]["train_s"],
        "wall_s": round(wall_s, 2),
        "epochs_run": sum(t["epochs"] for t in trials),
        "learning_rates": [t["params"]["optimizer.learning_rate"] for t in trials],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--database-url", default=os.environ.get("TRAINHUB_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--redis-url", default=os.environ.get("TRAINHUB_BENCH_REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("sweeps.json"))
    args = parser.parse_args()
    ensure_database(args.database_url)
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-sweeps-") as root:
        service = Service(args.database_url, args.redis_url, Path(root))
        service.start()
        try:
            runs = {
                name: run_sweep(service, sweep_spec(args.trials, args.epochs, args.train_limit, pruning))
                for name, pruning in (("asha", True), ("every_trial", False))
            }
        finally:
            service.stop()
    asha, full = runs["asha"], runs["every_trial"]
    assert asha["learning_rates"] == full["learning_rates"], "both sweeps must draw the same learning rates"
    result = {
        **runs,
        "train_s_ratio": round(asha["train_s"] / full["train_s"], 3),
        "wall_s_ratio": round(asha["wall_s"] / full["wall_s"], 3),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, run in runs.items():
        print(f"{name:12s} best lr {run['best_learning_rate']:.2e}  test_accuracy {run['best_test_accuracy']:.4f}  "
              f"pruned {run['trials'].get('pruned', 0):2d}/{sum(run['trials'].values())}  epochs run {run['epochs_run']:3d}"
              f"  train {run['train_s']:7.1f} s  wall {run['wall_s']:7.1f} s")
    print(f"asha / every trial: train time {result['train_s_ratio']:.2f} x, wall time {result['wall_s_ratio']:.2f} x")


if __name__ == "__main__":
    main()
