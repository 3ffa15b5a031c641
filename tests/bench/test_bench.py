"""The benchmark's code paths at toy sizes (`python -m bench --quick`), and its verdicts.

These check that every part runs and reports what it measured, not how fast anything is: the
quick run is far too small for its numbers to mean anything.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from bench import datasets, report
from bench.__main__ import Config, summarize_loop
from bench.flops import cnn_macs_per_sample, mlp_flops_per_epoch, model_flops_per_epoch
from bench.loops import RESNET_LOOPS, trainer_spec
from bench.service import check_reachable, ensure_database
from tests.e2e.conftest import forget_unfinished_jobs
from trainers.spec import flops_per_example, model_plan

LOOPS = ["jax_seed", "jax_trainer", "torch_seed", "torch_seed_tensor", "torch_trainer", "torch_compile"]


# Under 2 min on a quiet machine; PyTorch slows 10x or more when the cores are shared.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def quick(database_url, redis_url, tmp_path_factory, repo_root):
    """One `python -m bench --quick` against the test database and Redis: (stdout, results).

    On a timeout subprocess.run kills the bench; the API and worker it started die with it
    (bench/procs.py), so no worker is left consuming the test queues."""
    # Earlier tests leave queued jobs (the fuzzer's among them); the bench's worker would run them.
    forget_unfinished_jobs(database_url)
    out = tmp_path_factory.mktemp("bench") / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--skip-scale", "--out", str(out),
         "--database-url", database_url, "--redis-url", redis_url],
        cwd=repo_root, capture_output=True, text=True, timeout=780,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.e2e
def test_quick_run_measures_every_part(quick):
    stdout, results = quick

    assert results["quick"] is True
    assert results["machine"]["matmul_gflops"] > 0
    # the MLP step's matmuls alone in each framework, set against the floor in the table's header
    assert set(results["machine"]["step_matmuls_ms"]) == {"torch", "jax"}
    assert all(ms > 0 for ms in results["machine"]["step_matmuls_ms"].values())
    assert "the step's matmuls alone (batch 128" in stdout and "x floor" in stdout
    assert results["floor"]["floor_s"] > 0
    for name in LOOPS:
        loop = results["loops"][name]
        assert loop["steady_s"] > 0 and loop["first_epoch_s"] > 0, name
        assert 0 < loop["test_accuracy"] <= 1, name
        assert len(loop["rounds"][0]["epoch_times"]) == results["config"]["epochs"], name
    assert set(results["linearity"]) == {"jax", "pytorch"}
    assert all(lin["ratio"] > 0 for lin in results["linearity"].values())
    # Every criterion was judged (nothing skipped: the services were there) and is printed, but
    # the scale row's (tests/bench/test_scale.py runs that row alone; here --skip-scale) and the GET
    # latency's, offered under its target's rate at quick sizes (its answers are still judged).
    assert len(results["criteria"]) >= 17
    for c in results["criteria"]:
        unjudged = c["name"].startswith("scale: ") or "not judged" in c["note"]
        assert c["passed"] in ((None,) if unjudged else (True, False)), c
        assert f"] {c['name']}: " in stdout
    get = next(c for c in results["criteria"] if c["name"].startswith("GET /jobs/{id} p99"))
    assert get["passed"] is None and "not judged" in get["note"]
    assert results["scale"] == {"skipped": "--skip-scale"}
    assert "steady s" in stdout and "submit->done" in stdout
    # The CNN rows: both trainers on the same CNN, with its own floor.
    cnn = results["cnn"]
    assert set(cnn["loops"]) == {"jax_cnn", "torch_cnn"} and cnn["floor"]["floor_s"] > 0
    assert cnn["loops"]["jax_cnn"]["compilations"] == 1
    assert all(len(loop["rounds"][0]["epoch_times"]) == results["config"]["cnn_epochs"] for loop in cnn["loops"].values())
    assert "trainhub JAX trainer (flax, scan)" in stdout and "x floor" in stdout


@pytest.mark.e2e
def test_quick_run_has_the_resnet8_rows(quick):
    stdout, results = quick
    config, resnet = results["config"], results["resnet8"]

    # Both frameworks on the same resnet8 spec, the epochs and samples asked for.
    assert resnet["model"] == "resnet8" and set(resnet["loops"]) == {"jax_resnet8", "torch_resnet8"}
    assert resnet["samples"] == config["resnet_train_limit"] and resnet["epochs"] == config["resnet_epochs"]
    for name, loop in resnet["loops"].items():
        assert len(loop["rounds"]) == config["resnet_rounds"], name
        assert len(loop["rounds"][0]["epoch_times"]) == config["resnet_epochs"], name
        assert loop["steady_s"] > 0 and 0 < loop["test_accuracy"] <= 1, name
        assert loop["vs_floor"] == pytest.approx(loop["steady_s"] / resnet["floor"]["floor_s"]), name
        assert 0 < loop["vs_floor"] < float("inf"), name
    assert resnet["loops"]["jax_resnet8"]["compilations"] == 1
    # The floor: 3 x the model's own forward FLOPs (model_plan) x the samples, at the matmul rate.
    floor = resnet["floor"]
    spec = trainer_spec("jax_resnet8", config["resnet_epochs"], config["dataset"], config["resnet_train_limit"],
                        config["resnet_test_limit"])
    assert floor["flops"] == 3 * flops_per_example(spec) * resnet["samples"]
    assert floor["floor_s"] == pytest.approx(floor["flops"] / (results["machine"]["matmul_gflops"] * 1e9))
    assert resnet["jax_over_pytorch"] == pytest.approx(
        resnet["loops"]["jax_resnet8"]["steady_s"] / resnet["loops"]["torch_resnet8"]["steady_s"])
    assert resnet["jax_over_pytorch"] > 0
    assert "resnet8 loop" in stdout and "JAX/PyTorch" in stdout


@pytest.mark.e2e
def test_quick_run_counts_compilations(quick):
    _, results = quick
    loops = results["loops"]

    assert loops["jax_trainer"]["compilations"] == 1
    assert loops["jax_trainer"]["compile_s"] > 0
    assert loops["torch_trainer"]["compilations"] == 0 and loops["torch_trainer"]["compile_s"] == 0
    assert loops["torch_compile"]["compilations"] == 1 and loops["torch_compile"]["compile_s"] > 0
    for name in ("jax_trainer", "torch_trainer", "torch_compile"):
        timings = loops[name]["rounds"][0]["timings"]
        assert timings["train_s"] == pytest.approx(sum(loops[name]["rounds"][0]["epoch_times"]))


@pytest.mark.e2e
def test_quick_run_goes_through_the_service(quick):
    _, results = quick
    service, api = results["service"], results["api"]

    labels = [job["label"] for job in service["jobs"]]
    assert labels == ["jax, cold", "jax, warm", "pytorch, cold", "pytorch, warm",
                      "pytorch+compile, cold", "pytorch+compile, warm"]
    for job in service["jobs"]:
        assert job["status"] == "succeeded"
        assert job["submit_to_done_s"] >= job["timings"]["setup_s"] + job["timings"]["train_s"]
    assert service["compile_cache"]["first_compile_s"] > 0
    user = service["user_code"]  # the built-in pytorch MLP written as user code, through the sandbox
    assert [job["label"] for job in user["jobs"]] == ["user code, cold", "user code, pair 1"]
    assert [job["label"] for job in user["builtin_jobs"]] == ["built-in, pair 1"]
    assert all(job["status"] == "succeeded" for job in user["jobs"] + user["builtin_jobs"])
    assert user["ratio"] == pytest.approx(user["steady_epoch_s"] / user["builtin_steady_epoch_s"])
    assert "child_start_s" in user
    assert service["rss"]["jobs"] == results["config"]["rss_jobs"]
    assert service["rss"]["first_bytes"] > 0 and service["rss"]["last_bytes"] > 0
    # The load: every accepted job stored and queued exactly once, then cleaned up.
    assert api["post"]["accepted"] > 0
    assert api["integrity"]["exactly_once"], api["integrity"]
    assert api["get"]["statuses"] == {"200": api["get"]["requests"]}


@pytest.mark.e2e
def test_quick_run_uploads_and_reads_the_dataset_cache(quick, database_url):
    stdout, results = quick
    config, uploads = results["config"], results["datasets"]
    assert "skipped" not in uploads, uploads["skipped"]

    # The large body: streamed in full, then refused (it is in no format), beside cp of it.
    stream = uploads["stream"]
    assert stream["status"] == 422 and stream["bytes"] == config["upload_stream_bytes"]
    assert "validation not included" in stream["what"]
    assert len(stream["upload_s_by_round"]) == len(stream["cp_s_by_round"]) == config["upload_rounds"]
    assert stream["rate_mb_s"] > 0 and stream["cp_rate_mb_s"] > 0 and stream["vs_cp"] > 0
    assert stream["api_processes"] >= 1 and isinstance(stream["rss_growth_bytes"], int)
    # Streamed, not held: the API grew by well under the body it received.
    assert stream["rss_growth_bytes"] < stream["bytes"] / 2, stream["rss_growth_by_round"]
    # The valid CSV, end to end: stored with the shape it was written with.
    valid = uploads["valid"]
    assert valid["status"] == 201 and valid["bytes"] >= config["upload_csv_bytes"]
    assert valid["rate_mb_s"] > 0 and valid["vs_cp"] > 0
    assert valid["dataset"]["train_size"] == valid["rows"]
    assert valid["dataset"]["input_shape"] == [datasets.CSV_FEATURES]
    assert valid["dataset"]["num_classes"] == datasets.CSV_CLASSES
    # Two jobs on it: the first fetched it into the worker's cache, the second found it there.
    cache = uploads["data_cache"]
    assert cache["hits"] == [0.0, 1.0]
    assert [job["label"] for job in cache["jobs"]] == ["cold", "warm"]
    assert cache["cold_data_s"] > 0 and cache["warm_data_s"] >= 0 and cache["warm_vs_cold"] >= 0
    # The verdict on the API's memory and the rows are printed.
    rss = [c for c in results["criteria"] if c["name"].startswith("API RSS growth during a")]
    assert len(rss) == 1 and rss[0]["passed"] in (True, False)
    assert "body to disk + sha256" in stdout and "valid CSV, end to end" in stdout and "dataset cache" in stdout
    # The dataset is deleted afterwards (a later run's record of the same content would point
    # at this run's deleted artifact dir).
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            left = connection.execute(text("SELECT count(*) FROM datasets WHERE id = :i"),
                                      {"i": valid["dataset"]["id"]}).scalar_one()
    finally:
        engine.dispose()
    assert left == 0


def test_unreachable_services_are_named():
    why = check_reachable("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", "redis://127.0.0.1:1/0")
    assert why and "127.0.0.1:1" in why


def test_a_missing_bench_database_is_created():
    """`make bench` creates its `bench` database; here a throwaway one on the test server (the
    test database itself is left alone)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.conftest import DEFAULT_DATABASE_URL, _unavailable

    server = make_url(os.environ.get("TRAINHUB_TEST_DATABASE_URL", DEFAULT_DATABASE_URL))
    name = f"trainhub_bench_probe_{os.getpid()}"
    url = server.set(database=name).render_as_string(hide_password=False)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    except Exception as exc:
        admin.dispose()
        _unavailable("PostgreSQL", exc)
    try:
        assert ensure_database(url) is True
        assert ensure_database(url) is False  # there now
        assert check_reachable(url, "redis://127.0.0.1:1/0").startswith("Redis")  # the database answers
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    assert ensure_database("sqlite:///nowhere.db") is False


def test_bench_csv_is_a_valid_upload(tmp_path):
    from app.datasets.formats import UploadOptions, parse_upload

    csv = datasets.write_csv(tmp_path / "table.csv", 300_000, seed=1)
    assert csv["bytes"] >= 300_000
    data = parse_upload(tmp_path / "table.csv", UploadOptions(filename="table.csv"))
    assert data.task == "classification" and data.x_train.shape == (csv["rows"], datasets.CSV_FEATURES)
    assert set(np.unique(data.y_train)) == set(range(datasets.CSV_CLASSES))
    assert data.x_test is None  # no split column: jobs on it set validation_split


def test_stream_body_is_in_no_upload_format(tmp_path):
    from app.datasets.formats import DatasetRejected, UploadOptions, detect_format

    body = datasets.write_stream_body(tmp_path / "stream.bin", 3 * 2**20 + 5)
    assert body.stat().st_size == 3 * 2**20 + 5
    with pytest.raises(DatasetRejected) as refused:
        detect_format(body, UploadOptions(filename=None))
    assert refused.value.status == 422


def test_rss_sampler_sees_the_tree_and_its_growth():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while child.pid not in datasets.process_tree(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in datasets.process_tree(os.getpid())
        sampler = datasets.RssSampler(os.getpid()).start()
        held = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, every page touched
        sampler.stop()
        assert sampler.growth_bytes() >= 48 * 2**20
        assert sampler.to_dict()["processes"] >= 2
        del held
    finally:
        child.kill()
        child.wait()


def test_upload_rss_over_the_limit_is_flagged():
    stream = {"bytes": 2**30, "rounds": 2, "api_processes": 3, "what": datasets.STREAM_WHAT,
              "upload_s": 2.0, "rate_mb_s": 537.0, "cp_s": 1.0, "cp_rate_mb_s": 1074.0, "vs_cp": 0.5}
    held = {"datasets": {"stream": {**stream, "rss_growth_bytes": 150 * 10**6}}}
    streamed = {"datasets": {"stream": {**stream, "rss_growth_bytes": 2 * 10**6}}}

    assert report.upload_rss_criterion(held).passed is False
    assert report.upload_rss_criterion(streamed).passed is True
    assert any("(over the limit)" in line for line in report.datasets_table(held))
    assert not any("(over the limit)" in line for line in report.datasets_table(streamed))
    skipped = report.upload_rss_criterion({"datasets": {"skipped": "no database"}})
    assert skipped.passed is None and skipped.note == "no database"


def test_flops_follow_the_issue():
    flops = mlp_flops_per_epoch(60000)
    assert flops["macs_per_sample"] == 784 * 256 + 256 * 128 + 128 * 10
    assert flops["flops"] / 1e9 == pytest.approx(84.5, abs=0.1)  # "about 85 GFLOP per epoch"
    assert flops["flops_needed"] < flops["flops"]


def test_cnn_flops_count_each_conv_at_its_input_size():
    # conv 1->32 on 28x28, pool to 14x14, conv 32->64, pool to 7x7, dense 3136->128->10
    expected = 28 * 28 * 1 * 32 * 9 + 14 * 14 * 32 * 64 * 9 + 7 * 7 * 64 * 128 + 128 * 10
    assert cnn_macs_per_sample() == expected


def test_model_flops_come_from_the_model_plan():
    # resnet8's floor counts the preset's own FLOPs (model_plan), not a formula kept in the bench.
    spec = trainer_spec("torch_resnet8", 3, "fashion-mnist", 4096, None)
    flops = model_flops_per_epoch(spec, 4096)
    plan = model_plan(spec)
    assert flops["forward_flops_per_example"] == plan.flops == flops_per_example(spec)
    assert flops["parameters"] == plan.parameters
    assert flops["flops"] == 3 * plan.flops * 4096
    # Both frameworks train the same model, so the floor is the same whichever spec it is read from.
    assert model_flops_per_epoch(trainer_spec("jax_resnet8", 3, "fashion-mnist", 4096, None), 4096) == flops
    # Its convs dominate: 6 x their multiply-adds is within a few percent of the count.
    convs = (28 * 28 * 1 * 16 * 9 + 2 * 28 * 28 * 16 * 16 * 9
             + 14 * 14 * (16 * 32 + 32 * 32) * 9 + 7 * 7 * (32 * 64 + 64 * 64) * 9)
    assert 2 * convs <= plan.flops <= 1.1 * 2 * convs


def test_resnet8_loops_train_the_preset_in_both_frameworks():
    jax_spec, torch_spec = (trainer_spec(name, 2, "fashion-mnist", 256, 256) for name in RESNET_LOOPS)
    assert (jax_spec.framework, torch_spec.framework) == ("jax", "pytorch")
    assert jax_spec.model == torch_spec.model and jax_spec.model.name == "resnet8"
    assert jax_spec.batch_size == torch_spec.batch_size == 128
    # --quick keeps the rows a smoke test: a few hundred samples, one or two epochs.
    quick = Config.quick()
    assert quick.resnet_train_limit <= 512 and quick.resnet_epochs <= 2 and quick.resnet_rounds == 1


def test_resnet8_table_reports_floor_and_framework_ratios():
    loops = {"jax_resnet8": {"steady_s": 7.0, "first_epoch_s": 7.5, "test_accuracy": 0.8, "compile_s": 6.0,
                             "compilations": 1},
             "torch_resnet8": {"steady_s": 2.5, "first_epoch_s": 2.6, "test_accuracy": 0.8, "compile_s": 0.0,
                               "compilations": 0}}
    results = {"resnet8": {"model": "resnet8", "epochs": 3, "samples": 4096, "rounds": 2, "jax_over_pytorch": 2.8,
                           "loops": loops, "floor": {"forward_flops_per_example": 19_017_984, "parameters": 77658,
                                                     "flops": 3 * 19_017_984 * 4096, "floor_s": 0.5}}}
    lines = report.resnet_table(results)
    text = "\n".join(lines)
    assert "JAX/PyTorch 2.80 x" in text and "floor 0.500 s/epoch" in text and "4096 samples" in text
    jax_row = next(line for line in lines if line.startswith("trainhub JAX"))
    torch_row = next(line for line in lines if line.startswith("trainhub PyTorch"))
    assert jax_row.split()[-3:] == ["2.80", "14.00", "1"]   # x torch, x floor, compiles
    assert torch_row.split()[-3:] == ["1.00", "5.00", "0"]
    assert report.resnet_table({}) == []  # --skip-resnet: no rows


def test_steady_epoch_is_the_best_rounds_median():
    rounds = [{"epoch_times": [3.0, 1.0, 1.2], "test_accuracy": [0.5, 0.8, 0.85], "compile_s": None},
              {"epoch_times": [2.0, 0.9, 1.1], "test_accuracy": [0.5, 0.8, 0.85], "compile_s": None}]
    summary = summarize_loop(rounds)
    assert summary["steady_by_round"] == pytest.approx([1.1, 1.0])  # median of epochs 2..n
    assert summary["steady_s"] == pytest.approx(1.0)  # the best round
    assert summary["first_epoch_s"] == pytest.approx(2.0)
    assert summary["test_accuracy"] == 0.85


def _loop(steady_s, accuracy):
    return {"steady_s": steady_s, "test_accuracy": accuracy}


def test_verdicts_pass_fail_and_not_measured():
    results = {
        "config": {"api_post_s": 10},
        "floor": {"floor_s": 0.47},
        "loops": {"jax_seed": _loop(0.88, 0.88), "jax_trainer": _loop(0.50, 0.875),
                  "torch_seed": _loop(1.85, 0.88), "torch_trainer": _loop(1.70, 0.88),
                  "torch_compile": _loop(0.84, 0.86)},
        "linearity": {"jax": {"small_n": 1, "large_n": 4, "small_s": 1.0, "large_s": 4.2, "ratio": 4.2}},
        "service": {"skipped": "no database"},
        "api": {"skipped": "no database"},
    }
    verdicts = {c.name: c.passed for c in report.criteria(results)}

    assert verdicts["JAX trainer steady epoch vs seeds' JAX loop"] is True      # 0.57 x
    assert verdicts["JAX trainer (scan, AOT) steady epoch vs floor"] is True   # 1.06 x <= 1.10
    assert verdicts["PyTorch trainer, eager steady epoch vs floor"] is False    # 3.6 x > 2.0
    assert verdicts["PyTorch trainer, compile steady epoch vs floor"] is False  # 1.79 x > 1.4
    assert verdicts["PyTorch trainer with compile faster than eager"] is True   # 0.84 s < 1.70 s
    assert verdicts["JAX trainer CNN steady epoch vs the CNN's floor"] is None  # --skip-cnn
    assert verdicts["PyTorch trainer (eager) steady epoch vs seed"] is False    # 0.92 x
    assert verdicts["PyTorch trainer (compile) steady epoch vs seed"] is True   # 0.45 x
    assert verdicts["final test accuracy, PyTorch trainer, compile vs seed"] is False  # 0.02 apart
    assert verdicts["cost linear in samples, jax"] is True
    assert verdicts["service overhead, warm worker"] is None
    assert verdicts["user-code MLP's steady s/epoch, warm worker"] is None
    assert verdicts["POST /jobs accepted rate"] is None
    assert verdicts["API RSS growth during a large upload"] is None
    lines = report.criteria_lines(report.criteria(results))
    assert any(line.startswith("[SKIP] service overhead") for line in lines)
    assert any("no database" in line for line in lines)


def test_floor_verdicts_say_how_far_each_loop_is_from_its_frameworks_own_matmuls():
    results = {"floor": {"floor_s": 0.25, "samples": 60000},
               "machine": {"step_matmuls_ms": {"torch": 0.64, "jax": 0.8}},  # 0.3 s and 0.375 s an epoch
               "loops": {"jax_trainer": _loop(0.45, 0.88), "torch_trainer": _loop(0.75, 0.88)}}
    notes = {c.name: c.note for c in report.criteria(results)}

    assert notes["JAX trainer (scan, AOT) steady epoch vs floor"] == (
        "the step's matmuls alone take 0.374 s an epoch in jax (1.50 x floor): this loop is 1.20 x them")
    assert "in torch (1.20 x floor): this loop is 2.50 x them" in notes["PyTorch trainer, eager steady epoch vs floor"]
    assert notes["PyTorch trainer, compile steady epoch vs floor"] == ""  # not measured
    assert "torch 0.300 s/epoch = 1.20 x floor, jax 0.374 s/epoch = 1.50 x floor" in report.step_matmuls_line(results)

@pytest.mark.e2e
def test_quick_run_judges_the_small_jobs_and_cold_start_rows(quick):
    # Issue 23's rows (bench/small_jobs.py, bench/cold_start.py): measured and judged, PASS or FAIL.
    from bench.cold_start import KINDS, WARM_KINDS
    from bench.small_jobs import FRAMEWORKS, PARTS

    _, results = quick
    judged = [c for c in results["criteria"] if c["name"].startswith(("small-jobs: ", "cold-start: "))]

    assert len(judged) == len(FRAMEWORKS) + 3 * (len(KINDS) + len(WARM_KINDS))
    assert all(c["passed"] in (True, False) for c in judged), [c for c in judged if c["passed"] is None]
    for framework in FRAMEWORKS:
        row = results["small_jobs"]["frameworks"][framework]
        assert row["jobs"] == Config.quick().small_jobs and row["jobs_per_s"] > 0
        assert set(row["means"]) == set(PARTS)
    for label, framework, _ in (*KINDS, *WARM_KINDS):
        assert results["cold_start"]["kinds"][label]["online_s"] > 0


def test_linearity_is_the_median_of_each_rounds_ratio(monkeypatch):
    """A round's small and large runs share the machine's state; the best of each size apart would
    pair a lucky small run with an unlucky large one (the runs below: 7.4 x best against best)."""
    import bench.__main__ as bench_main

    small = iter([0.378, 0.710, 0.719])
    large = iter([2.807, 2.762, 2.397])

    def run_loops(names, _args, _env):
        (name,) = names
        times = next(large if name.endswith(":80000") else small)
        return {name: {"epoch_times": [9.0, times, times, times]}}  # the first epoch compiles

    monkeypatch.setattr(bench_main, "run_loops", run_loops)
    monkeypatch.setattr(bench_main, "LINEAR_LOOPS", {"torch_trainer": "pytorch"})
    config = Config(linear_n=20000, linear_rounds=3)
    lin = bench_main.measure_linearity(config, {})["pytorch"]
    assert lin["round_ratios"] == pytest.approx([2.807 / 0.378, 2.762 / 0.710, 2.397 / 0.719])
    assert lin["ratio"] == pytest.approx(2.762 / 0.710)  # 3.89 x: within 3.6..4.4
    assert (lin["small_s"], lin["large_s"]) == (0.378, 2.397)
