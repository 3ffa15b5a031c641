"""`python -m bench` (`make bench`): trainhub's trainers and service against the seeds' loops.

One run measures, on the same data and machine, in turns:

1. the machine: the fp32 matmul rate (GFLOP/s, best of torch and JAX, probed before, between
   and after the loops), the MLP's FLOPs per epoch and the resulting floor (seconds per epoch
   if every FLOP ran at that rate);
2. the training loops, each in a fresh process, round after round (the order reversed every
   other round, so a drift in the machine's load does not favour one): the seeds' JAX and
   PyTorch loops as written (and the PyTorch one over a TensorDataset, for reference), and
   trainhub's JAX trainer and PyTorch trainer (eager and with "compile": true) called
   directly with `trainers.fit`;
3. cost against size: the trainers on synthetic data of N and 4N samples;
4. the CNN rows: both trainers on the same small CNN (conv 32, conv 64, dense 128) on a slice
   of the data, against the CNN's own floor (its FLOPs at the matmul rate); then the resnet8
   rows, the same for the resnet8 preset (its floor from its own FLOPs, `trainers.spec.model_plan`);
5. the service: uvicorn and a cpu worker over PostgreSQL and Redis; identical jobs run cold
   then warm (submit-to-succeeded minus the job's setup_s + train_s; the JAX compilation
   cache), then consecutive jobs while the worker's resident memory is read;
6. uploads and the dataset cache (bench/datasets.py): a 1 GiB body streamed through the API to
   disk and hashed (refused after, so validation is not timed) while the API's resident memory
   is sampled, against `cp` of the same file; a valid 50 MB CSV uploaded end to end; a job's
   data_s on that dataset with the worker's cache cold, then warm;
7. the API under load from a second process: POST /jobs flat out, then GET /jobs/{id} at a
   steady rate; every accepted job must be stored and queued exactly once;
8. the scale row (bench/scale.py, issue 21): on a database of its own, grown to 10^3, 10^5 and
   10^6 stored jobs, the p50/p99 of /metrics, the job list, a job, its metrics and POST /jobs at
   each size; then 1,000 event streams held open (the database's transactions per second, and
   the delay from an epoch stored to its event reaching the client);
9. the small-jobs row (bench/small_jobs.py, issue 23): one cpu worker running one-epoch digits
   MLP jobs back to back, jobs a second and where each job's time goes; and the cold-start row
   (bench/cold_start.py): a fresh worker's time to online and its first job's time to its
   first epoch, with the compilation caches warm from an earlier worker.

It prints the tables and a PASS/FAIL line per target of issue 3, and writes bench/results.json.
`--quick` runs every part at toy sizes (1-2 minutes): a smoke test of the code, not a
measurement. `--only api` runs part 7 alone (the service started, no training jobs), for work on
the API's throughput; `--only scale` part 8 alone, its figures merged into the results file
(`--only small-jobs` and `--only cold-start` the same for part 9's two rows, `--only models`
for the CNN and resnet8 rows, their floors from matmul probes before and after them).
The service parts use their own database and Redis db (see --database-url,
--redis-url; the database is created when the server has none of its name) and are skipped,
saying why, when those are unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from bench import flops as flops_model
from bench import report
from bench.procs import die_with_parent
from bench.loops import CNN_LOOPS, ISSUE_LOOPS, RESNET_LOOPS, RESULT_PREFIX, steady, trainer_spec

if TYPE_CHECKING:
    from bench.scale import ScaleConfig

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
DEFAULT_SCALE_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_scale"
DEFAULT_OUT = Path(__file__).resolve().parent / "results.json"



@dataclass
class Config:
    """What one bench run does; `quick()` shrinks every part to a smoke test."""

    epochs: int = 10             # the seeds train for 10 epochs
    rounds: int = 2
    dataset: str = "fashion-mnist"
    train_limit: int | None = None
    test_limit: int | None = None
    linear_n: int = 20000        # synthetic samples; the large run has 4x
    # An epoch of the small run is ~0.1 s (JAX): a stall of the shared machine is a large part of
    # one, so each run's median is over 7 steady epochs, and the ratio the median of 3 rounds'.
    linear_epochs: int = 8
    linear_rounds: int = 3
    service_epochs: int = 3
    service_train_limit: int | None = None
    rss_jobs: int = 20
    user_code_pairs: int = 3  # built-in and user-code jobs in turn (bench/user_code.py)
    rss_train_limit: int = 12800
    api_post_s: float = 10.0
    api_get_s: float = 10.0
    api_get_rate: float = 200.0
    api_concurrency: int = 16
    # uvicorn processes serving the API: two use both cores (one Python process is held to one by
    # its GIL), which on 2 cores, the load generator included, takes more POSTs and GETs a second.
    api_workers: int = 2
    matmul_sizes: str = "2048,3072"
    # The CNN rows: both trainers on the same CNN spec, on a slice of the data (an epoch of the
    # full 60000 costs ~30 s on 2 cores), one process per loop and round, the order reversed in the
    # second round; each loop's best round counts, as for the MLP loops.
    cnn_epochs: int = 3
    cnn_train_limit: int | None = 12800
    cnn_rounds: int = 2
    # The resnet8 rows, the same way: ~2.5 s (PyTorch) and ~7 s (JAX) an epoch of 4096 samples on
    # 2 cores; two rounds, the order reversed in the second, as the two are held against each other.
    # The test split is cut too: evaluation is not in the epoch's time, only in the run's.
    resnet_epochs: int = 3
    resnet_train_limit: int | None = 4096
    resnet_test_limit: int | None = 2000
    resnet_rounds: int = 2
    # Uploads: a body in no format streamed through the API (and cp of it, alternating, best of
    # the rounds), a valid CSV end to end, and jobs on it with the dataset cache cold then warm.
    upload_stream_bytes: int = 1024**3
    upload_rounds: int = 3
    upload_csv_bytes: int = 50 * 10**6
    dataset_train_limit: int = 10000
    # The scale row (bench/scale.py): the sizes grown to, timed requests per endpoint and size,
    # event streams held open, each transactions/s window.
    scale_sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    scale_requests: int = 600
    scale_streams: int = 1000
    # 30 s: PostgreSQL 15 reports an idle backend's transactions up to 10 s late, so a window's count
    # is off by a few either way; the idle streams' own cost is ~0.4/s (the hub's fleet check).
    scale_window_s: float = 30.0
    scale_settle_s: float = 11.0
    scale_stream_epochs: int = 50
    # Part 9: one-epoch digits jobs submitted back to back, per framework (issue 23: over 100).
    small_jobs: int = 100
    # The cold-start row's Inductor caches in a folder of their own, empty at first like JAX's;
    # quick: the machine's (a smoke test; an empty one costs its first compile job ~18 s more).
    cold_start_own_inductor_cache: bool = True
    loops: tuple[str, ...] = ISSUE_LOOPS
    one_process: bool = False  # quick: the matmul, the loops (one round) and linearity in one process

    @classmethod
    def quick(cls) -> "Config":
        return cls(epochs=2, rounds=1, train_limit=1280, test_limit=500, linear_n=1024, linear_epochs=2,
                   linear_rounds=1, service_epochs=1, service_train_limit=1280, rss_jobs=3, rss_train_limit=1280,
                   user_code_pairs=1,
                   api_post_s=1.0, api_get_s=1.0, api_get_rate=50.0, api_concurrency=4,
                   matmul_sizes="256,512", cnn_epochs=2, cnn_train_limit=256, resnet_epochs=2, resnet_train_limit=256,
                   resnet_test_limit=256, resnet_rounds=1, upload_stream_bytes=64 * 1024**2,
                   upload_rounds=1, upload_csv_bytes=2 * 10**6, dataset_train_limit=1024, scale_sizes=(100, 1000),
                   scale_requests=20, scale_streams=20, scale_window_s=2.0, scale_settle_s=0.0, scale_stream_epochs=10, small_jobs=10,
                   cold_start_own_inductor_cache=False, one_process=True)

    def scale(self) -> ScaleConfig:
        from bench.scale import ScaleConfig

        return ScaleConfig(sizes=self.scale_sizes, requests=self.scale_requests, warmup=min(20, self.scale_requests),
                           streams=self.scale_streams, window_s=self.scale_window_s, settle_s=self.scale_settle_s,
                           stream_epochs=self.scale_stream_epochs, api_workers=self.api_workers)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_loops(names: list[str], args: list[str], env: dict[str, str], timeout_s: float = 900) -> dict[str, dict]:
    """Run `python -m bench.loops NAMES ARGS` in a fresh process; {loop name: result}."""
    command = [sys.executable, "-m", "bench.loops", ",".join(names), *args]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s,
                         preexec_fn=die_with_parent)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            results[result.pop("loop")] = result
    if out.returncode != 0 or set(results) != set(names):
        raise RuntimeError(f"{' '.join(command[2:])} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return results


def summarize_loop(rounds: list[dict]) -> dict:
    """A loop's figures over its rounds.

    steady_s: the median of epochs 2..n (what a job reports as steady_epoch_s), from the best
    round: other processes on a shared machine only ever add time, so the best round is the
    one least disturbed. first_epoch_s: the best round's too. test_accuracy: the final one.
    """
    per_round = [steady(r["epoch_times"]) for r in rounds]
    compile_s = [r["compile_s"] for r in rounds if r.get("compile_s") is not None]
    return {
        "steady_s": min(per_round),
        "steady_by_round": per_round,
        "first_epoch_s": min(r["epoch_times"][0] for r in rounds),
        "test_accuracy": rounds[0]["test_accuracy"][-1],
        "test_accuracy_by_round": [r["test_accuracy"][-1] for r in rounds],
        "compile_s": min(compile_s) if compile_s else None,
        "compilations": rounds[0].get("compilations"),
        "rounds": rounds,
    }


LINEAR_LOOPS = {"jax_trainer": "jax", "torch_trainer": "pytorch"}


def loop_args(config: Config) -> list[str]:
    args = ["--epochs", str(config.epochs), "--dataset", config.dataset, "--linear-epochs", str(config.linear_epochs),
            "--matmul-sizes", config.matmul_sizes]
    if config.train_limit:
        args += ["--train-limit", str(config.train_limit)]
    if config.test_limit:
        args += ["--test-limit", str(config.test_limit)]
    return args


def linear_name(loop: str, n: int) -> str:
    return f"{loop}@synthetic:{n}"


def measure_all_in_one_process(config: Config, env: dict[str, str]) -> dict[str, dict]:
    """--quick: the matmul probe, one round of the loops and the linearity runs in one process."""
    sizes = (config.linear_n, 4 * config.linear_n)
    names = ["matmul", *config.loops, *(linear_name(loop, n) for loop in LINEAR_LOOPS for n in sizes)]
    log(f"one process: {', '.join(names)}")
    return run_loops(names, loop_args(config), env)


def measure_loops(config: Config, env: dict[str, str], done: dict[str, dict] | None = None) -> dict:
    """Each loop `config.rounds` times, one process per loop and round (`done`: a first round
    already run), the order reversed every other round."""
    by_loop: dict[str, list[dict]] = {name: [] for name in config.loops}
    first_round = 0
    if done:
        for name in config.loops:
            by_loop[name].append(done[name])
        first_round = 1
    for r in range(first_round, config.rounds):
        order = list(config.loops) if r % 2 == 0 else list(reversed(config.loops))
        for name in order:
            log(f"round {r + 1}/{config.rounds}: {name} ({config.epochs} epochs)")
            result = run_loops([name], loop_args(config), env)[name]
            by_loop[name].append(result)
            log(f"  epochs {[round(t, 3) for t in result['epoch_times']]}, accuracy {result['test_accuracy'][-1]:.4f}")
    return {name: summarize_loop(rounds) for name, rounds in by_loop.items()}


def measure_model(config: Config, env: dict[str, str], kind: str, loops: tuple[str, ...], epochs: int,
                  train_limit: int | None, test_limit: int | None, rounds: int) -> dict:
    """Side-by-side loops on one model (`kind` names it in the log), `rounds` processes each, the
    order reversed every other round; their figures as measure_loops'."""
    args = ["--epochs", str(epochs), "--dataset", config.dataset]
    if train_limit:
        args += ["--train-limit", str(train_limit)]
    if test_limit:
        args += ["--test-limit", str(test_limit)]
    by_loop: dict[str, list[dict]] = {name: [] for name in loops}
    for r in range(rounds):
        for name in (loops if r % 2 == 0 else loops[::-1]):
            log(f"{kind} {r + 1}/{rounds}: {name} ({epochs} epochs, {train_limit} samples)")
            result = run_loops([name], args, env)[name]
            by_loop[name].append(result)
            log(f"  epochs {[round(t, 3) for t in result['epoch_times']]}, accuracy {result['test_accuracy'][-1]:.4f}")
    return {"epochs": epochs, "samples": by_loop[loops[0]][0]["samples"], "rounds": rounds,
            "loops": {name: summarize_loop(runs) for name, runs in by_loop.items()}}


def measure_cnn(config: Config, env: dict[str, str]) -> dict:
    """Both trainers on the CNN, `config.cnn_rounds` processes each."""
    return {"model": "conv 32, conv 64, dense 128",
            **measure_model(config, env, "cnn", CNN_LOOPS, config.cnn_epochs, config.cnn_train_limit,
                            config.test_limit, config.cnn_rounds)}


def measure_resnet(config: Config, env: dict[str, str]) -> dict:
    """Both trainers on the resnet8 preset, `config.resnet_rounds` processes each; the JAX/PyTorch
    ratio of their steady epochs."""
    out = {"model": "resnet8",
           **measure_model(config, env, "resnet8", RESNET_LOOPS, config.resnet_epochs, config.resnet_train_limit,
                           config.resnet_test_limit, config.resnet_rounds)}
    jax_s, torch_s = (out["loops"][name]["steady_s"] for name in RESNET_LOOPS)
    out["jax_over_pytorch"] = jax_s / torch_s
    return out


def resnet_floor(config: Config, resnet: dict, gflops: float) -> dict:
    """The resnet8 floor: 3 x its forward FLOPs per example (model_plan) x the samples an epoch
    trains, at the machine's matmul rate."""
    spec = trainer_spec(RESNET_LOOPS[0], config.resnet_epochs, config.dataset, config.resnet_train_limit,
                        config.resnet_test_limit)
    flops = flops_model.model_flops_per_epoch(spec, resnet["samples"])
    return {**flops, "floor_s": flops_model.floor_s(flops["flops"], gflops)}


def measure_linearity(config: Config, env: dict[str, str], done: dict[str, dict] | None = None) -> dict:
    """Steady s/epoch of each trainer on N and 4N synthetic samples (a process each, the sizes
    alternating), and their ratio: the median over `config.linear_rounds` rounds of each round's
    large / small. A round's two runs follow each other, so they share the machine's state (a
    busy host slows both); the best of each size apart pairs a lucky small run with an unlucky
    large one (2026-12-03: small runs 0.38, 0.71, 0.72 s, large 2.81, 2.76, 2.40 s)."""
    sizes = (config.linear_n, 4 * config.linear_n)
    runs: dict[str, dict[int, list[float]]] = {loop: {n: [] for n in sizes} for loop in LINEAR_LOOPS}
    if done:
        for loop in LINEAR_LOOPS:
            for n in sizes:
                runs[loop][n].append(steady(done[linear_name(loop, n)]["epoch_times"]))
    else:
        for r in range(config.linear_rounds):
            for n in (sizes if r % 2 == 0 else sizes[::-1]):
                for loop in LINEAR_LOOPS:
                    log(f"linearity {r + 1}/{config.linear_rounds}: {loop} on {n} synthetic samples "
                        f"({config.linear_epochs} epochs)")
                    name = linear_name(loop, n)
                    runs[loop][n].append(steady(run_loops([name], loop_args(config), env)[name]["epoch_times"]))
    out = {}
    for loop, label in LINEAR_LOOPS.items():
        small, large = runs[loop][sizes[0]], runs[loop][sizes[1]]
        rounds = [b / a for a, b in zip(small, large)]
        out[label] = {"small_n": sizes[0], "large_n": sizes[1], "small_s": min(small), "large_s": min(large),
                      "ratio": statistics.median(rounds), "round_ratios": rounds,
                      "runs": {str(n): runs[loop][n] for n in sizes}}
    return out


def service_spec(framework: str, config: Config, epochs: int, train_limit: int | None, compile: bool = False) -> dict:
    spec = {"framework": framework, "epochs": epochs, "labels": {"bench": "service"},
            "dataset": {"name": config.dataset, "train_limit": train_limit, "test_limit": config.test_limit},
            "model": {"hidden_sizes": [256, 128], "dropout": 0.0 if framework == "jax" else 0.2}}
    if compile:
        spec["compile"] = True
    return spec


def breakdown(job: dict) -> str:
    """Where a job's overhead went: its own timings, and the rest (HTTP, queue hops, DB, artifacts)."""
    t = job["timings"]
    parts = {"queue_wait": t.get("queue_wait_s", 0.0), "compile": t.get("compile_s", 0.0),
             "eval": t.get("eval_s", 0.0), "checkpoint": t.get("checkpoint_s", 0.0)}
    rest = job["overhead_s"] - sum(parts.values())
    return "overhead = " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + f", other {rest:.3f} s"


def measure_service(config: Config, database_url: str, redis_url: str, root: Path,
                    only_api: bool = False, only_jobs: bool = False) -> tuple[dict, dict, dict]:
    """(service results, api results, datasets results) through the real processes. A part that
    fails is recorded as skipped with its error (the API part still runs after failed jobs), so
    the rest of the run is still reported. `only_api`: the API part alone (the others skipped);
    `only_jobs`: the service's jobs alone."""
    from bench.service import Service

    service = Service(database_url, redis_url, root, api_workers=config.api_workers)
    log(f"service: starting uvicorn ({config.api_workers} process(es)) and a cpu worker")
    service_out: dict = {"jobs": []}
    try:
        try:
            service.start()
        except Exception as exc:
            message = f"the service did not start: {type(exc).__name__}: {exc}"
            log(message)
            return {"skipped": message}, {"skipped": message}, {"skipped": message}
        try:
            if only_api:
                service_out["skipped"] = "--only api"
            else:
                measure_jobs(config, service, service_out)
        except Exception as exc:
            service_out["skipped"] = f"service jobs failed: {type(exc).__name__}: {exc}"
            log(service_out["skipped"])
        if only_jobs:
            return service_out, {"skipped": "--only service"}, {"skipped": "--only service"}
        datasets_out: dict = {"skipped": "--only api"} if only_api else {}
        if not only_api:
            try:
                datasets_out = measure_datasets(config, service, root)
            except Exception as exc:
                datasets_out = {"skipped": f"uploads failed: {type(exc).__name__}: {exc}"}
                log(datasets_out["skipped"])
        try:
            api_out = measure_api(config, service, database_url, redis_url)
        except Exception as exc:
            api_out = {"skipped": f"API load failed: {type(exc).__name__}: {exc}"}
            log(api_out["skipped"])
    finally:
        service.stop()
    return service_out, api_out, datasets_out


def measure_datasets(config: Config, service, root: Path) -> dict:
    """Uploads through the API and the dataset cache (bench/datasets.py)."""
    from bench import datasets

    return datasets.measure(service, config, root, log)


def measure_jobs(config: Config, service, service_out: dict) -> None:
    """Each job kind cold then warm, then `config.rss_jobs` consecutive jobs with VmRSS read."""
    from bench.service import job_series, run_job, vm_rss_bytes

    with service.client() as client:
        sequence = [
            ("jax, cold", "jax", False), ("jax, warm", "jax", False),
            ("pytorch, cold", "pytorch", False), ("pytorch, warm", "pytorch", False),
            ("pytorch+compile, cold", "pytorch", True), ("pytorch+compile, warm", "pytorch", True),
        ]
        jobs = {}
        for label, framework, compile in sequence:
            log(f"service: job {label}")
            job = run_job(client, service_spec(framework, config, config.service_epochs,
                                               config.service_train_limit, compile))
            if job["status"] != "succeeded":
                raise RuntimeError(f"service job {label} ended {job['status']}: {job['error']}")
            job["label"] = label
            job["rss_bytes"] = vm_rss_bytes(service.worker.pid)
            job["breakdown"] = breakdown(job)
            jobs[label] = job
            service_out["jobs"].append(job)
        service_out["warm_jobs"] = {kind: jobs[f"{kind}, warm"] for kind in ("jax", "pytorch", "pytorch+compile")}
        from bench import user_code

        builtin = service_spec("pytorch", config, config.service_epochs, config.service_train_limit)
        service_out["user_code"] = user_code.measure(client, builtin, log, config.user_code_pairs)
        service_out["compile_cache"] = {"first_compile_s": jobs["jax, cold"]["timings"]["compile_s"],
                                        "second_compile_s": jobs["jax, warm"]["timings"]["compile_s"]}

        kinds = [("jax", False), ("pytorch", False), ("pytorch", True)]
        specs = [service_spec(kinds[i % 3][0], config, 1, config.rss_train_limit, kinds[i % 3][1])
                 for i in range(config.rss_jobs)]
        log(f"service: {len(specs)} consecutive jobs (jax, pytorch, pytorch+compile in turn), reading VmRSS")
        series = job_series(service, client, specs)
        failed = [j for j in series if j["status"] != "succeeded"]
        if failed:
            raise RuntimeError(f"{len(failed)} of the consecutive jobs did not succeed: {failed[0]['error']}")
        service_out["rss"] = {
            "jobs": len(series),
            "first_bytes": series[0]["rss_bytes"],
            "last_bytes": series[-1]["rss_bytes"],
            "max_bytes": max(j["rss_bytes"] for j in series),
            "by_job_mib": [round(j["rss_bytes"] / 2**20, 1) for j in series],
            "worker_first_job_bytes": service_out["jobs"][0]["rss_bytes"],
            "note": "the series follows the six jobs above, so the worker had run each kind once already; "
                    f"RSS after the worker's very first job was "
                    f"{service_out['jobs'][0]['rss_bytes'] / 2**20:.0f} MiB",
        }


def measure_api(config: Config, service, database_url: str, redis_url: str) -> dict:
    from bench import api
    from bench.service import QUOTAS

    reconciled = service.wait_reconciled()
    log(f"api: POST /jobs for {config.api_post_s:g} s, then GET /jobs/{{id}} at {config.api_get_rate:g}/s "
        f"for {config.api_get_s:g} s, from a second process")
    api_out = api.measure(service.url, service.key, database_url, redis_url, config.api_post_s,
                          config.api_get_s, config.api_get_rate, config.api_concurrency)
    api_out["quotas"] = QUOTAS
    api_out["api_workers"] = config.api_workers
    api_out["reconciler_settled"] = reconciled
    return api_out


def measure_scale(config: Config, database_url: str, redis_url: str, root: Path) -> dict:
    """Part 8 (bench/scale.py); {"skipped": why} when its services are not there or it fails."""
    from bench import scale

    why = services_unavailable(database_url, redis_url)
    if why:
        log(f"scale row skipped: {why}")
        return {"skipped": why}
    scale.log = log
    try:
        out = scale.measure(database_url, redis_url, root, config.scale())
    except Exception as exc:
        log(f"scale row failed: {type(exc).__name__}: {exc}")
        return {"skipped": f"the scale row failed: {type(exc).__name__}: {exc}"}
    out["database_url"] = database_url
    return out


def run_scale_only(config: Config, args: argparse.Namespace) -> int:
    """`--only scale`: part 8 alone; its figures and verdicts replace those in the results file
    (bench/results.json unless --out), the other parts' are kept."""
    started = time.perf_counter()
    out_path = args.out or DEFAULT_OUT
    results: dict = json.loads(out_path.read_text()) if out_path.exists() else {"config": asdict(config)}
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        scale = measure_scale(config, args.scale_database_url, args.redis_url, Path(tmp) / "scale")
    scale["started_at"] = datetime.fromtimestamp(time.time() - (time.perf_counter() - started), timezone.utc).isoformat(
        timespec="seconds")
    scale["duration_s"] = time.perf_counter() - started
    scale["quick"] = args.quick
    scale["host"] = {"cpus": len(os.sched_getaffinity(0)), "load_avg_at_end": os.getloadavg()}
    results["scale"] = scale
    verdicts = report.criteria(results)
    results["criteria"] = [c.to_dict() for c in verdicts]
    scale_verdicts = [c for c in verdicts if c.name.startswith("scale: ")]
    print("\n".join([*report.scale_table(results), "", *report.criteria_lines(scale_verdicts)]), flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results written to {out_path}")
    return 0


def measure_part9(name: str, config: Config, database_url: str, redis_url: str, root: Path) -> dict:
    """The small-jobs or cold-start row on a service of its own (the API and one cpu worker);
    {"skipped": why} when PostgreSQL or Redis is not there or the row fails."""
    from bench import cold_start, small_jobs
    from bench.service import Service

    why = services_unavailable(database_url, redis_url)
    if why:
        log(f"{name} row skipped: {why}")
        return {"skipped": why}
    # Inductor's caches (its FX graph cache among them) in the row's own folder, fresh like JAX's.
    own_cache = name == "cold-start" and config.cold_start_own_inductor_cache
    extra_env = {"TORCHINDUCTOR_CACHE_DIR": str(root / name / "inductor-cache")} if own_cache else {}
    service = Service(database_url, redis_url, root / name, extra_env=extra_env)
    try:
        service.start()
        if name == "small-jobs":
            out = {"frameworks": small_jobs.measure(service, config.small_jobs, log)}
        else:
            out = cold_start.measure(service, log)
    except Exception as exc:
        log(f"{name} row failed: {type(exc).__name__}: {exc}")
        return {"skipped": f"the {name} row failed: {type(exc).__name__}: {exc}"}
    finally:
        service.stop()
    return out


def run_part9_only(name: str, config: Config, args: argparse.Namespace) -> int:
    """`--only small-jobs` / `--only cold-start`: that row alone; its figures and verdicts replace
    those in the results file (bench/results.json unless --out), the other parts' are kept."""
    started = time.perf_counter()
    out_path = args.out or DEFAULT_OUT
    results: dict = json.loads(out_path.read_text()) if out_path.exists() else {"config": asdict(config)}
    key = name.replace("-", "_")
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        row = measure_part9(name, config, args.database_url, args.redis_url, Path(tmp))
    row["started_at"] = datetime.fromtimestamp(time.time() - (time.perf_counter() - started), timezone.utc).isoformat(
        timespec="seconds")
    row["duration_s"] = time.perf_counter() - started
    row["quick"] = args.quick
    row["host"] = {"cpus": len(os.sched_getaffinity(0)), "load_avg_at_end": os.getloadavg()}
    results[key] = row
    verdicts = report.criteria(results)
    results["criteria"] = [c.to_dict() for c in verdicts]
    mine = [c for c in verdicts if c.name.startswith(f"{name}: ")]
    print("\n".join([*report.small_jobs_table(results), "", *report.criteria_lines(mine)]), flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results written to {out_path}")
    return 0


def services_unavailable(database_url: str, redis_url: str) -> str | None:
    """None when the service parts can run: the database is created if the server lacks it
    (`make bench`'s `bench`), then PostgreSQL and Redis must answer. Otherwise why not, in words."""
    from bench.service import check_reachable, ensure_database

    try:
        if ensure_database(database_url):
            log(f"created the database {database_url}")
    except Exception as exc:  # the server is down, or this role may not create databases
        why = check_reachable(database_url, redis_url)
        return why and f"{why}; creating it failed too ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    return check_reachable(database_url, redis_url)


def run_service_only(config: Config, args: argparse.Namespace) -> int:
    """`--only service`: part 5 alone (the jobs cold and warm, the user-code row, the compile
    cache, worker RSS); its figures and verdicts replace those in the results file, the other
    parts' are kept."""
    started = time.perf_counter()
    out_path = args.out or DEFAULT_OUT
    results: dict = json.loads(out_path.read_text()) if out_path.exists() else {"config": asdict(config)}
    why = services_unavailable(args.database_url, args.redis_url)
    if why:
        log(f"service part skipped: {why}")
        service: dict = {"skipped": why}
    else:
        with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
            service, _, _ = measure_service(config, args.database_url, args.redis_url, Path(tmp) / "service",
                                            only_jobs=True)
    service.update(started_at=datetime.fromtimestamp(time.time() - (time.perf_counter() - started),
                                                     timezone.utc).isoformat(timespec="seconds"),
                   duration_s=time.perf_counter() - started, quick=args.quick,
                   host={"cpus": len(os.sched_getaffinity(0)), "load_avg_at_end": os.getloadavg()})
    results["service"] = service
    verdicts = report.criteria(results)
    results["criteria"] = [c.to_dict() for c in verdicts]
    names = ("service overhead", "user-code", "second identical JAX", "worker RSS")
    print("\n".join(report.criteria_lines([c for c in verdicts if c.name.startswith(names)])), flush=True)
    if not args.quick or args.out:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {out_path}")
    return 0


def probe_matmul(config: Config, env: dict[str, str], when: str) -> dict:
    """One matmul probe (bench.loops matmul) in a fresh process, labelled `when`."""
    log(f"machine: matmul rate ({when})")
    return {"when": when, **run_loops(["matmul"], loop_args(config), env)["matmul"]}


def model_floors(config: Config, results: dict, gflops: float) -> None:
    """The CNN's and resnet8's floors in `results` (where those rows ran) at `gflops` GFLOP/s."""
    if "cnn" in results:
        cnn_flops = flops_model.cnn_flops_per_epoch(results["cnn"]["samples"])
        results["cnn"]["floor"] = {**cnn_flops, "floor_s": flops_model.floor_s(cnn_flops["flops"], gflops)}
    if "resnet8" in results:
        resnet = results["resnet8"]
        resnet["floor"] = resnet_floor(config, resnet, gflops)
        for loop in resnet["loops"].values():
            loop["vs_floor"] = loop["steady_s"] / resnet["floor"]["floor_s"]


def run_models_only(config: Config, args: argparse.Namespace) -> int:
    """`--only models`: the CNN and resnet8 rows alone, the matmul rate probed before and after
    them for their floors (the best probe, held in each row as `matmul_gflops`); their figures
    and verdicts replace those in the results file (bench/results.json unless --out), the other
    parts' are kept."""
    started = time.perf_counter()
    out_path = args.out or DEFAULT_OUT
    results: dict = json.loads(out_path.read_text()) if out_path.exists() else {"config": asdict(config)}
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        env = {**os.environ, "TRAINHUB_COMPILE_CACHE_DIR": str(Path(tmp) / "jax-cache-direct")}
        probes = [probe_matmul(config, env, "before the models")]
        rows["cnn"] = measure_cnn(config, env)
        rows["resnet8"] = measure_resnet(config, env)
        probes.append(probe_matmul(config, env, "after the models"))
    gflops = max(p["gflops"] for p in probes)
    model_floors(config, rows, gflops)
    when = datetime.fromtimestamp(time.time() - (time.perf_counter() - started), timezone.utc)
    for row in rows.values():
        row.update(matmul_gflops=gflops, started_at=when.isoformat(timespec="seconds"), quick=args.quick,
                   host={"cpus": len(os.sched_getaffinity(0)), "load_avg_at_end": os.getloadavg()})
    results.update(rows)
    verdicts = report.criteria(results)
    results["criteria"] = [c.to_dict() for c in verdicts]
    mine = [c for c in verdicts if "CNN" in c.name or "resnet8" in c.name]
    print("\n".join([f"matmul {gflops:.0f} GFLOP/s (fp32, the best of {len(probes)} probes)",
                     *report.cnn_table(results), "", *report.resnet_table(results), "",
                     *report.criteria_lines(mine)]), flush=True)
    if not args.quick or args.out:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {out_path}")
    return 0


def run_api_only(config: Config, args: argparse.Namespace) -> int:
    """`--only api`: the service started, the API load and its verdicts; nothing else."""
    started = time.perf_counter()
    results: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "quick": args.quick,
                     "only": "api", "config": asdict(config),
                     "host": {"cpus": len(os.sched_getaffinity(0)), "load_avg_at_start": os.getloadavg()}}
    why = services_unavailable(args.database_url, args.redis_url)
    if why:
        log(f"API part skipped: {why}")
        results["api"] = {"skipped": why}
    else:
        with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
            _, results["api"], _ = measure_service(config, args.database_url, args.redis_url,
                                                   Path(tmp) / "service", only_api=True)
    names = ("POST /jobs accepted rate", "every accepted job stored and queued exactly once", "GET /jobs/")
    verdicts = [c for c in report.criteria(results) if c.name.startswith(names)]
    results["criteria"] = [c.to_dict() for c in verdicts]
    results["duration_s"] = time.perf_counter() - started
    print("\n".join(report.criteria_lines(verdicts)), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every part at toy sizes: a smoke test, not a measurement")
    parser.add_argument("--epochs", type=int, help="epochs per training loop (default 10; quick 2)")
    parser.add_argument("--rounds", type=int, help="rounds of the five loops (default 2; quick 1)")
    parser.add_argument("--database-url", default=os.environ.get("TRAINHUB_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL),
                        help="PostgreSQL for the service parts (env TRAINHUB_BENCH_DATABASE_URL)")
    parser.add_argument("--redis-url", default=os.environ.get("TRAINHUB_BENCH_REDIS_URL", DEFAULT_REDIS_URL),
                        help="Redis for the service parts (env TRAINHUB_BENCH_REDIS_URL)")
    parser.add_argument("--skip-service", action="store_true", help="skip the service, uploads and API parts")
    parser.add_argument("--skip-cnn", action="store_true", help="skip the CNN rows (both trainers on the CNN)")
    parser.add_argument("--skip-resnet", action="store_true",
                        help="skip the resnet8 rows (both trainers on the resnet8 preset)")
    parser.add_argument("--only", choices=["api", "scale", "service", "small-jobs", "cold-start", "models"],
                        help="run one part alone: api (POST and GET load against the service; results written only "
                             "with --out), scale (the scale row), service (the service's jobs, the user-code row, "
                             "worker RSS), small-jobs or cold-start (part 9's rows), models (the CNN and resnet8 "
                             "rows, between two matmul probes); all but api are merged into the results file")
    parser.add_argument("--small-jobs", type=int, help="jobs per framework in the small-jobs row (default 100; "
                                                       "quick 10)")
    parser.add_argument("--skip-scale", action="store_true", help="skip the scale row (part 8)")
    parser.add_argument("--scale-database-url",
                        default=os.environ.get("TRAINHUB_BENCH_SCALE_DATABASE_URL", DEFAULT_SCALE_DATABASE_URL),
                        help="PostgreSQL database of the scale row, emptied of its rows and grown at each run (env "
                             "TRAINHUB_BENCH_SCALE_DATABASE_URL)")
    parser.add_argument("--scale-sizes", help="jobs stored at each step of the scale row, comma-separated (default "
                                              "1000,100000,1000000; quick 100,1000)")
    parser.add_argument("--scale-streams", type=int, help="event streams the scale row holds open (default 1000; "
                                                          "quick 20; 0: none)")
    parser.add_argument("--api-workers", type=int, help=f"uvicorn processes serving the API (default "
                                                          f"{Config.api_workers})")
    parser.add_argument("--out", type=Path, default=None, help=f"results file (default {DEFAULT_OUT}; quick: none "
                                                               "unless given)")
    args = parser.parse_args(argv)

    config = Config.quick() if args.quick else Config()
    if args.epochs:
        config.epochs = args.epochs
    if args.rounds:
        config.rounds = args.rounds
    if args.api_workers:
        config.api_workers = args.api_workers
    if args.scale_sizes:
        config.scale_sizes = tuple(int(n) for n in args.scale_sizes.split(","))
    if args.scale_streams is not None:
        config.scale_streams = args.scale_streams
    if args.only == "api":
        return run_api_only(config, args)
    if args.small_jobs:
        config.small_jobs = args.small_jobs
    if args.only == "scale":
        return run_scale_only(config, args)
    if args.only == "service":
        return run_service_only(config, args)
    if args.only == "models":
        return run_models_only(config, args)
    if args.only in ("small-jobs", "cold-start"):
        return run_part9_only(args.only, config, args)
    out_path = args.out or (None if args.quick else DEFAULT_OUT)
    started = time.perf_counter()
    results: dict = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "config": asdict(config),
        "host": {"cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(),
                 "python": platform.python_version(), "load_avg_at_start": os.getloadavg()},
    }

    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        root = Path(tmp)
        # The direct trainer runs get a fresh JAX compilation cache of their own, as a new worker would.
        env = {**os.environ, "TRAINHUB_COMPILE_CACHE_DIR": str(root / "jax-cache-direct")}

        # The matmul rate is probed before, between and after the loops: the machine's limit is
        # the best of the probes, as the loops' figures are the best of their rounds.
        def probe(when: str) -> dict:
            return probe_matmul(config, env, when)

        done = measure_all_in_one_process(config, env) if config.one_process else None
        probes = [{"when": "with the loops", **done["matmul"]}] if done else [probe("before the loops")]
        results["loops"] = measure_loops(config, env, done)
        if not done:
            probes.append(probe("after the loops"))
        results["linearity"] = measure_linearity(config, env, done)
        if not done:
            probes.append(probe("after the linearity runs"))
        if not args.skip_cnn:
            results["cnn"] = measure_cnn(config, env)
        if not args.skip_resnet:
            results["resnet8"] = measure_resnet(config, env)
        best = max(probes, key=lambda p: p["gflops"])
        samples = (config.train_limit or 60000) if config.dataset in ("fashion-mnist", "mnist") else config.train_limit
        flops = flops_model.mlp_flops_per_epoch(samples)
        # The step's matmuls at the MLP's shapes: the fastest each framework ran them in any probe.
        step_ms = {fw: min(p["step_matmuls_ms"][fw] for p in probes) for fw in ("torch", "jax")}
        results["machine"] = {"matmul_gflops": best["gflops"], "matmul_by_framework": best["by_framework"],
                              "step_matmuls_ms": step_ms, "probes": probes}
        results["floor"] = {**flops, "floor_s": flops_model.floor_s(flops["flops"], best["gflops"]),
                            "floor_needed_s": flops_model.floor_s(flops["flops_needed"], best["gflops"])}
        model_floors(config, results, best["gflops"])

        if args.skip_service:
            results["service"] = {"skipped": "--skip-service"}
            results["api"] = {"skipped": "--skip-service"}
            results["datasets"] = {"skipped": "--skip-service"}
        else:
            why = services_unavailable(args.database_url, args.redis_url)
            if why:
                message = f"service and API parts skipped: {why}"
                log(message)
                results["service"] = {"skipped": message}
                results["api"] = {"skipped": message}
                results["datasets"] = {"skipped": message}
            else:
                results["service"], results["api"], results["datasets"] = measure_service(
                    config, args.database_url, args.redis_url, root / "service")
                results["service"]["database_url"] = args.database_url
                results["service"]["redis_url"] = args.redis_url
        results["scale"] = ({"skipped": "--skip-scale"} if args.skip_scale or args.skip_service else
                            measure_scale(config, args.scale_database_url, args.redis_url, root / "scale"))
        for name in ("small-jobs", "cold-start"):
            results[name.replace("-", "_")] = (
                {"skipped": "--skip-service"} if args.skip_service else
                measure_part9(name, config, args.database_url, args.redis_url, root))

    verdicts = report.criteria(results)
    results["criteria"] = [c.to_dict() for c in verdicts]
    results["duration_s"] = time.perf_counter() - started
    results["host"]["load_avg_at_end"] = os.getloadavg()

    lines = [
        "",
        f"trainhub bench{' --quick (toy sizes: not a measurement)' if args.quick else ''}: "
        f"{config.dataset}, 784-256-128-10, Adam 1e-3, batch 128, {config.epochs} epochs x {config.rounds} round(s); "
        f"{results['host']['cpus']} CPUs, load average {results['host']['load_avg_at_start'][0]:.1f} at start",
        f"matmul {results['machine']['matmul_gflops']:.0f} GFLOP/s (fp32, best of torch and JAX, of "
        f"{len(results['machine']['probes'])} probe(s)); "
        f"model {results['floor']['flops'] / 1e9:.1f} GFLOP/epoch (6 x MACs x {results['floor']['samples']} samples; "
        f"{results['floor']['flops_needed'] / 1e9:.1f} without the unused input gradient); "
        f"floor {results['floor']['floor_s']:.3f} s/epoch",
        report.step_matmuls_line(results),
        "steady s = median of epochs 2..n (a job's steady_epoch_s), best of the rounds; "
        "the seeds compile inside their first epoch, the trainers before it (compile s)",
        "",
        *report.loop_table(results),
        "",
    ]
    cnn_lines = report.cnn_table(results)
    if cnn_lines:
        lines += [*cnn_lines, ""]
    resnet_lines = report.resnet_table(results)
    if resnet_lines:
        lines += [*resnet_lines, ""]
    service_lines = report.service_table(results)
    if service_lines:
        lines += [*service_lines, ""]
    dataset_lines = report.datasets_table(results)
    if dataset_lines:
        lines += [*dataset_lines, ""]
    scale_lines = report.scale_table(results)
    if scale_lines:
        lines += [*scale_lines, ""]
    small_lines = report.small_jobs_table(results)
    if small_lines:
        lines += [*small_lines, ""]
    lines += report.criteria_lines(verdicts)
    passed = sum(c.passed is True for c in verdicts)
    failed = sum(c.passed is False for c in verdicts)
    skipped = sum(c.passed is None for c in verdicts)
    lines.append(f"\n{passed} passed, {failed} failed, {skipped} not measured; {results['duration_s']:.0f} s")
    print("\n".join(lines), flush=True)

    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
