"""Uploads through the API and the workers' dataset cache, for the benchmark.

Three measurements, each against something run side by side in the same bench run:

- the streaming of a large upload (1 GiB; `--quick` 16 MiB): a body in no dataset format, sent
  with `TrainhubClient.upload_dataset`. The API streams it to a temporary file while hashing it,
  then refuses it (422) from its first 512 bytes, so what is timed is the body to disk and its
  sha256, not the validation. Meanwhile the resident memory (VmRSS) of every uvicorn process is
  sampled: the upload must never be held in memory, so it may grow by less than 100 MB. The
  rate is set against `cp` of the same file into the same folder (alternating, best of each);
- a smaller valid upload (a numeric CSV of 50 MB; quick 2 MB) timed end to end to its 201:
  streamed, parsed with pyarrow, validated, normalised and stored; its rate against `cp` too;
- a job's `data_s` on that dataset with a cold worker cache (a miss: fetched from the artifact
  store and checked by sha256) and then warm (a hit), and their ratio.

The CSV's numbers are drawn from a fresh seed each run and the dataset is deleted afterwards:
an upload is content-addressed, and a record of a previous run's content would point at that
run's (deleted) artifact dir.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from bench.procs import die_with_parent

# The API's resident memory may grow by less than this while an upload streams.
UPLOAD_RSS_LIMIT_BYTES = 100 * 10**6
STREAM_WHAT = ("body streamed to disk and hashed; validation not included (the body is in no dataset format: "
               "the API answers 422 after receiving it all, from its first 512 bytes)")
VALID_WHAT = "end to end: streamed, hashed, parsed, validated, normalised and stored (201)"
CSV_FEATURES = 32
CSV_CLASSES = 10
BLOCK = 1 << 20


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn's supervisor and the worker processes it spawned)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return out


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


class RssSampler:
    """Samples the VmRSS of each process of a tree every `interval_s` in a thread, from `start()`
    to `stop()`. growth_bytes: the largest rise of one process over its own RSS at start (the
    upload lands on one uvicorn process, whichever it is)."""

    def __init__(self, pid: int, interval_s: float = 0.01) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.baseline: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.after: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[int, int]:
        return {pid: rss for pid in process_tree(self.pid) if (rss := _rss(pid)) is not None}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for pid, rss in self._sample().items():
                self.peak[pid] = max(self.peak.get(pid, 0), rss)

    def start(self) -> RssSampler:
        self.baseline = self._sample()
        self.peak = dict(self.baseline)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.after = self._sample()
        for pid, rss in self.after.items():
            self.peak[pid] = max(self.peak.get(pid, 0), rss)

    def growth_bytes(self) -> int:
        return max((self.peak[pid] - base for pid, base in self.baseline.items() if pid in self.peak), default=0)

    def to_dict(self) -> dict:
        return {"growth_bytes": self.growth_bytes(), "processes": len(self.baseline),
                "baseline_bytes": self.baseline, "peak_bytes": self.peak, "after_bytes": self.after}


def write_stream_body(path: Path, size: int) -> Path:
    """`size` bytes in no upload format: a random 1 MiB block over and over, starting with NUL
    bytes (no zip, Parquet, gzip or tar magic, and not text, so not a CSV either)."""
    block = bytearray(os.urandom(BLOCK))
    block[:8] = b"\x00bench\x00\x00"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[:left] if left < BLOCK else block)
            left -= BLOCK
    return path


def write_csv(path: Path, size: int, seed: int) -> dict:
    """A valid CSV upload of at least `size` bytes: CSV_FEATURES standard-normal feature columns
    (3 decimals) and a `label` of CSV_CLASSES classes from a fixed linear teacher, so a job learns
    something from it. Returns {"path", "bytes", "rows", "features", "classes"}."""
    import pyarrow as pa
    import pyarrow.csv as pv

    rng = np.random.default_rng(seed)
    teacher = np.random.default_rng(0).standard_normal((CSV_FEATURES, CSV_CLASSES))
    names = [f"f{i}" for i in range(CSV_FEATURES)]
    schema = pa.schema([*(pa.field(name, pa.float64()) for name in names), pa.field("label", pa.int64())])
    rows, rows_per_chunk = 0, max(500, min(20000, size // 2000))  # a row is ~200 bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    with pv.CSVWriter(path, schema) as writer:
        while rows == 0 or path.stat().st_size < size:
            x = np.round(rng.standard_normal((rows_per_chunk, CSV_FEATURES)), 3)
            y = np.argmax(x @ teacher, axis=1)
            writer.write_table(pa.table([*(x[:, i] for i in range(CSV_FEATURES)), y], schema=schema))
            rows += rows_per_chunk
    return {"path": str(path), "bytes": path.stat().st_size, "rows": rows, "features": CSV_FEATURES,
            "classes": CSV_CLASSES}


def timed_cp(source: Path, folder: Path) -> float:
    """Seconds `cp` takes to copy `source` into `folder` (the copy is removed afterwards)."""
    target = folder / f".bench-cp-{source.name}"
    os.sync()  # each timed copy or upload starts with no dirty pages of the one before
    start = time.perf_counter()
    subprocess.run(["cp", str(source), str(target)], check=True, preexec_fn=die_with_parent)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


def timed_upload(client, source: Path, api_pid: int) -> tuple[float, int, dict, RssSampler]:
    """(seconds, HTTP status, body, RSS sampler) of one `client.upload_dataset(source)`."""
    from app.client import ApiError

    os.sync()
    sampler = RssSampler(api_pid).start()
    start = time.perf_counter()
    try:
        body, status = client.upload_dataset(source), 201
    except ApiError as exc:
        body, status = {"detail": exc.detail}, exc.status_code
    seconds = time.perf_counter() - start
    sampler.stop()
    return seconds, status, body, sampler


def _rate(size: int, seconds: float) -> float:
    return size / seconds / 1e6  # MB/s


def measure_stream(client, api_pid: int, source: Path, cp_folder: Path, rounds: int, log) -> dict:
    """The large upload and `cp` of the same file, `rounds` times, alternating which goes first."""
    size = source.stat().st_size
    uploads, copies, growth, statuses, processes = [], [], [], [], 0
    for r in range(rounds):
        for step in (("cp", "upload") if r % 2 == 0 else ("upload", "cp")):
            if step == "cp":
                copies.append(timed_cp(source, cp_folder))
                log(f"  cp {size / 1e6:.0f} MB: {copies[-1]:.2f} s")
                continue
            seconds, status, body, sampler = timed_upload(client, source, api_pid)
            if status != 422:
                raise RuntimeError(f"the {size / 1e6:.0f} MB body in no format was answered {status}, not 422: {body}")
            uploads.append(seconds)
            growth.append(sampler.growth_bytes())
            statuses.append(status)
            processes = max(processes, len(sampler.baseline))
            log(f"  upload {size / 1e6:.0f} MB: {seconds:.2f} s, API RSS +{growth[-1] / 1e6:.1f} MB")
    upload_s, cp_s = min(uploads), min(copies)
    return {
        "what": STREAM_WHAT,
        "bytes": size,
        "rounds": rounds,
        "status": statuses[0],
        "upload_s": upload_s,
        "upload_s_by_round": uploads,
        "cp_s": cp_s,
        "cp_s_by_round": copies,
        "rate_mb_s": _rate(size, upload_s),
        "cp_rate_mb_s": _rate(size, cp_s),
        "vs_cp": cp_s / upload_s,  # the upload's rate as a fraction of cp's
        "rss_growth_bytes": max(growth),
        "rss_growth_by_round": growth,
        "rss_limit_bytes": UPLOAD_RSS_LIMIT_BYTES,
        "api_processes": processes,  # uvicorn's supervisor and its workers, all sampled
    }


def measure_valid(client, api_pid: int, csv: dict, cp_folder: Path, log) -> dict:
    """The valid CSV upload, end to end, once, and `cp` of it."""
    source = Path(csv["path"])
    cp_s = timed_cp(source, cp_folder)
    seconds, status, body, sampler = timed_upload(client, source, api_pid)
    if status != 201:
        raise RuntimeError(f"the valid CSV upload was answered {status}: {body}")
    log(f"  valid CSV {csv['bytes'] / 1e6:.0f} MB end to end: {seconds:.2f} s (cp {cp_s:.2f} s)")
    return {
        "what": VALID_WHAT,
        "bytes": csv["bytes"],
        "rows": csv["rows"],
        "features": csv["features"],
        "status": status,
        "upload_s": seconds,
        "rate_mb_s": _rate(csv["bytes"], seconds),
        "cp_s": cp_s,
        "cp_rate_mb_s": _rate(csv["bytes"], cp_s),
        "vs_cp": cp_s / seconds,
        # pyarrow's parse holds the table in memory: reported, not held to the streaming limit.
        "rss_growth_bytes": sampler.growth_bytes(),
        "dataset": {k: body.get(k) for k in ("id", "task", "input_shape", "num_classes", "train_size",
                                               "test_size", "bytes", "sha256")},
    }


def cache_spec(dataset_id: str, train_limit: int) -> dict:
    return {"framework": "jax", "epochs": 1, "labels": {"bench": "dataset-cache"},
            "dataset": {"id": dataset_id, "validation_split": 0.2, "train_limit": train_limit}}


def measure_cache(http, dataset: dict, train_limit: int, log) -> dict:
    """Two identical jobs on the uploaded dataset on the bench's one worker: the first fetches it
    into the worker's (fresh) cache, the second finds it there."""
    from bench.service import run_job

    jobs = []
    for label in ("cold", "warm"):
        job = run_job(http, cache_spec(dataset["id"], train_limit))
        if job["status"] != "succeeded":
            raise RuntimeError(f"the {label} dataset job ended {job['status']}: {job['error']}")
        t = job["timings"]
        jobs.append({"label": label, "id": job["id"], "data_s": t.get("data_s"),
                     "data_cache_hit": t.get("data_cache_hit"), "setup_s": t.get("setup_s"),
                     "train_s": t.get("train_s")})
        log(f"  job ({label} cache): data_s {t.get('data_s')}, data_cache_hit {t.get('data_cache_hit')}")
    cold, warm = jobs[0]["data_s"], jobs[1]["data_s"]
    return {
        "dataset_bytes": dataset["bytes"],
        "train_limit": train_limit,
        "jobs": jobs,
        "cold_data_s": cold,
        "warm_data_s": warm,
        "warm_vs_cold": warm / cold if cold else None,
        "hits": [job["data_cache_hit"] for job in jobs],
    }


def measure(service, config, root: Path, log) -> dict:
    """The three measurements through the running `service` (bench.service.Service)."""
    from app.client import TrainhubClient

    files = root / "upload-files"
    cp_folder = Path(service.env["TRAINHUB_UPLOAD_DIR"])  # where the API spools uploads: the same disk
    cp_folder.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    with TrainhubClient(service.url, service.key, timeout_s=600) as client, service.client() as http:
        try:
            log(f"datasets: a {config.upload_stream_bytes / 1e6:.0f} MB body in no format streamed to the API "
                f"(API VmRSS sampled) and cp of it, {config.upload_rounds} round(s)")
            body = write_stream_body(files / "stream.bin", config.upload_stream_bytes)
            out["stream"] = measure_stream(client, service.api.pid, body, cp_folder, config.upload_rounds, log)
        finally:
            (files / "stream.bin").unlink(missing_ok=True)

        csv = write_csv(files / "bench-table.csv", config.upload_csv_bytes, seed=int.from_bytes(os.urandom(4), "big"))
        log(f"datasets: a valid CSV upload, {csv['bytes'] / 1e6:.0f} MB ({csv['rows']} rows x {csv['features']} "
            "features), end to end")
        out["valid"] = measure_valid(client, service.api.pid, csv, cp_folder, log)
        dataset = out["valid"]["dataset"]
        try:
            log("datasets: two jobs on it, the worker's dataset cache cold then warm")
            out["data_cache"] = measure_cache(http, dataset, config.dataset_train_limit, log)
        finally:
            client.delete_dataset(dataset["id"])
    return out
