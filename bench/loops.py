"""One benchmark process: run training loops (or the matmul probe) and print their results.

    python -m bench.loops jax_seed,jax_trainer --epochs 10 [--dataset fashion-mnist]
        [--train-limit N] [--test-limit N]
    python -m bench.loops jax_trainer@synthetic:20000 --linear-epochs 5
    python -m bench.loops matmul

Each loop prints one line `BENCH_RESULT {json}` on stdout; everything else a framework may
print goes to stderr or is ignored by the parent. The parent (`python -m bench`) starts one such
process per loop and round, so every loop starts from a fresh interpreter, as in a worker.

Loops:
- jax_seed, torch_seed: the seeds' loops as written (bench/seeds.py); torch_seed_tensor: the
  PyTorch seed with its DataLoader over a TensorDataset instead of torchvision's dataset, for
  reference;
- jax_trainer, torch_trainer, torch_compile: trainhub's trainers called directly with
  `trainers.fit`, on the seeds' settings (784-256-128-10, Adam 1e-3, batch 128; dropout 0.2 on
  the PyTorch side, as in the PyTorch seed; torch_compile adds "compile": true);
- jax_cnn, torch_cnn: both trainers on the small CNN (conv 32, conv 64, dense 128; Adam 1e-3,
  batch 128, no dropout), the same spec in both;
- jax_resnet8, torch_resnet8: both trainers on the resnet8 preset (`{"name": "resnet8"}`: a
  16-channel conv with batch norm, three residual blocks at 16/32/64 channels with max pools
  between, global average pool, dense; Adam 1e-3, batch 128), the same spec in both;
- matmul: the fp32 matmul rate of both frameworks (GFLOP/s), the machine's limit for the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# The loops issue 3 compares; the CNN and resnet8 ones run apart, each on a slice of the data
# (bench.__main__.measure_model).
ISSUE_LOOPS = ("jax_seed", "jax_trainer", "torch_seed", "torch_seed_tensor", "torch_trainer", "torch_compile")
CNN_LOOPS = ("jax_cnn", "torch_cnn")
RESNET_LOOPS = ("jax_resnet8", "torch_resnet8")
LOOPS = ISSUE_LOOPS + CNN_LOOPS + RESNET_LOOPS
# The model each of the side-by-side loops trains (both frameworks the same spec).
MODEL_OF = {
    "jax_cnn": {"name": "cnn", "channels": [32, 64], "hidden_sizes": [128]},
    "torch_cnn": {"name": "cnn", "channels": [32, 64], "hidden_sizes": [128]},
    "jax_resnet8": {"name": "resnet8"},
    "torch_resnet8": {"name": "resnet8"},
}
RESULT_PREFIX = "BENCH_RESULT "


def run_loop(name: str, epochs: int, dataset: str, train_limit: int | None, test_limit: int | None) -> dict:
    """Run one loop; a dict with epoch_times (s), test_accuracy per epoch, compile_s, compilations."""
    if name in ("jax_seed", "torch_seed", "torch_seed_tensor"):
        return _run_seed(name, epochs, dataset, train_limit, test_limit)
    return _run_trainer(name, epochs, dataset, train_limit, test_limit)


def _run_seed(name, epochs, dataset, train_limit, test_limit) -> dict:
    from bench import seeds
    from trainers.data import load_dataset
    from trainers.spec import DatasetSpec

    data = load_dataset(DatasetSpec(name=dataset, train_limit=train_limit, test_limit=test_limit), run_options().data_dir)
    start = time.perf_counter()
    if name == "jax_seed":
        result = seeds.jax_seed(data.x_train, data.y_train, data.x_test, data.y_test, epochs)
    else:
        result = seeds.torch_seed(data.x_train, data.y_train, data.x_test, data.y_test, epochs,
                                  dataset="tensor" if name == "torch_seed_tensor" else "torchvision")
    return {
        "epoch_times": result.epoch_times,
        "test_accuracy": result.test_accuracy,
        "compile_s": None,  # the seeds compile inside their first epoch
        "compilations": result.compilations,
        "samples": len(data.x_train),
        "wall_s": time.perf_counter() - start,
    }


def trainer_spec(name: str, epochs: int, dataset: str, train_limit: int | None, test_limit: int | None):
    """The JobSpec trainhub's trainer runs for loop `name`: the seeds' settings."""
    from trainers import JobSpec

    framework = "jax" if name.startswith("jax") else "pytorch"
    if name in MODEL_OF:
        return JobSpec(
            framework=framework,
            dataset={"name": dataset, "train_limit": train_limit, "test_limit": test_limit},
            model=MODEL_OF[name],
            batch_size=128,
            epochs=epochs,
            seed=0,
        )
    return JobSpec(
        framework=framework,
        dataset={"name": dataset, "train_limit": train_limit, "test_limit": test_limit},
        model={"hidden_sizes": [256, 128], "dropout": 0.0 if framework == "jax" else 0.2},
        optimizer={"name": "adam", "learning_rate": 1e-3},
        batch_size=128,
        epochs=epochs,
        seed=0,
        compile=name == "torch_compile",
    )


def run_options():
    """The trainers' RunOptions as a worker would pass them, from the bench's environment."""
    from trainers import RunOptions
    from trainers.base import COMPILE_CACHE_MAX_BYTES

    data_dir, cache_dir = os.environ.get("TRAINHUB_DATA_DIR"), os.environ.get("TRAINHUB_COMPILE_CACHE_DIR")
    max_bytes = int(os.environ.get("TRAINHUB_COMPILE_CACHE_MAX_BYTES") or COMPILE_CACHE_MAX_BYTES)
    return RunOptions(data_dir=Path(data_dir) if data_dir else None, compile_cache_dir=Path(cache_dir) if cache_dir else None,
                      compile_cache_max_bytes=max_bytes)


def _run_trainer(name, epochs, dataset, train_limit, test_limit) -> dict:
    from trainers import fit
    from trainers.spec import train_size
    from workers.hardware import xla_cpu_flags

    # XLA's flags as a cpu worker sets them (workers.hardware.pin): read when JAX's CPU backend
    # starts, so too late in a --quick run, whose matmul probe started it in this process.
    os.environ["XLA_FLAGS"] = xla_cpu_flags(os.environ.get("XLA_FLAGS", ""), 1)

    spec = trainer_spec(name, epochs, dataset, train_limit, test_limit)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as workdir:
        result = fit(spec, workdir, lambda epoch, metrics: None, options=run_options())
    return {
        "epoch_times": [m.epoch_time_s for m in result.metrics],
        "test_accuracy": [m.test_accuracy for m in result.metrics],
        "compile_s": result.timings["compile_s"],
        "compilations": result.timings["compilations"],
        "timings": result.timings,
        "samples": train_size(spec.dataset) // spec.batch_size * spec.batch_size,  # the partial batch is dropped
        "wall_s": time.perf_counter() - start,
    }


def matmul_rate(sizes=(2048, 3072), repeats: int = 3) -> dict:
    """Best-of-`repeats` fp32 GFLOP/s of an n x n @ n x n matmul (2 n^3 flops) in torch and JAX."""
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    rates: dict[str, dict[str, float]] = {"torch": {}, "jax": {}}
    for n in sizes:
        a = np.random.default_rng(0).random((n, n), dtype=np.float32)
        b = np.random.default_rng(1).random((n, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        matmul = jax.jit(jnp.matmul)
        ja, jb = jax.device_put(a), jax.device_put(b)
        torch.mm(ta, tb)
        matmul(ja, jb).block_until_ready()
        best_torch = best_jax = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(ta, tb)
            best_torch = min(best_torch, time.perf_counter() - start)
            start = time.perf_counter()
            matmul(ja, jb).block_until_ready()
            best_jax = min(best_jax, time.perf_counter() - start)
        rates["torch"][str(n)] = 2 * n**3 / best_torch / 1e9
        rates["jax"][str(n)] = 2 * n**3 / best_jax / 1e9
    best = max(max(r.values()) for r in rates.values())
    return {"gflops": best, "by_framework": rates, "step_matmuls_ms": step_matmuls_ms()}


def step_matmuls_ms(batch: int = 128, layers: tuple[int, ...] = (784, 256, 128, 10), steps: int = 100,
                    repeats: int = 3) -> dict[str, float]:
    """ms a step of the matmuls alone of the seeds' MLP's train step, at its shapes, in torch and in
    JAX (best of `repeats` runs of `steps` steps): each layer's forward [B, in] @ [in, out] and
    weight gradient [in, B] @ [B, out], and the input gradient [B, out] @ [out, in] of every layer
    but the first. How fast each framework's matmuls run at a batch of 128, where they fall short of
    the large matmuls the floor's rate comes from: the trainers cannot beat this."""
    import jax
    import jax.numpy as jnp
    import torch

    rng = np.random.default_rng(0)
    weights = [rng.random((n_in, n_out), dtype=np.float32) * 0.01 for n_in, n_out in zip(layers, layers[1:])]
    x = rng.random((batch, layers[0]), dtype=np.float32)

    def step(mm, t, ws, x):
        acts = [x]
        for w in ws:
            acts.append(mm(acts[-1], w))
        grad = acts[-1]
        out = []
        for i in reversed(range(len(ws))):
            out.append(mm(t(acts[i]), grad))  # the weight's gradient
            if i:
                grad = mm(grad, t(ws[i]))  # the layer's input gradient
        return sum(o[0, 0] for o in out) * 1e-9

    @jax.jit
    def jax_steps(ws, x):
        def body(carry, _):
            return carry + step(jnp.matmul, jnp.transpose, ws, x + carry), None
        return jax.lax.scan(body, jnp.float32(0), None, length=steps)[0]

    tws, tx = [torch.from_numpy(w) for w in weights], torch.from_numpy(x)
    jws, jx = [jax.device_put(w) for w in weights], jax.device_put(x)
    jax_steps(jws, jx).block_until_ready()
    best = {"torch": float("inf"), "jax": float("inf")}
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step(torch.mm, torch.t, tws, tx)
        best["torch"] = min(best["torch"], time.perf_counter() - start)
        start = time.perf_counter()
        jax_steps(jws, jx).block_until_ready()
        best["jax"] = min(best["jax"], time.perf_counter() - start)
    return {name: seconds / steps * 1e3 for name, seconds in best.items()}


def steady(epoch_times: list[float]) -> float:
    """Median of epochs 2..n (the first is warm-up); the first epoch when alone."""
    return statistics.median(epoch_times[1:]) if len(epoch_times) > 1 else epoch_times[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loops")
    parser.add_argument("loops", help=f"comma-separated: {', '.join(LOOPS)}, matmul; LOOP@synthetic:N runs "
                                      "LOOP on N synthetic samples for --linear-epochs")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--test-limit", type=int, default=None)
    parser.add_argument("--linear-epochs", type=int, default=5)
    parser.add_argument("--matmul-sizes", default="2048,3072", help="n of the n x n matmuls, comma-separated")
    args = parser.parse_args(argv)
    for name in args.loops.split(","):
        loop, _, synthetic = name.partition("@synthetic:")
        if loop == "matmul":
            result = matmul_rate(tuple(int(n) for n in args.matmul_sizes.split(",")))
        elif loop in LOOPS and synthetic:
            result = run_loop(loop, args.linear_epochs, "synthetic", int(synthetic), None)
        elif loop in LOOPS:
            result = run_loop(loop, args.epochs, args.dataset, args.train_limit, args.test_limit)
        else:
            parser.error(f"unknown loop {name!r}")
        print(RESULT_PREFIX + json.dumps({"loop": name, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
