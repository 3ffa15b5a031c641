"""Issue 23's small-jobs and cold-start rows: judged in quick mode (PASS or FAIL, never left
out), skipped with the reason when PostgreSQL or Redis is away. No wall-clock time is asserted."""

from __future__ import annotations

from bench import report
from bench.__main__ import Config, measure_part9
from bench.cold_start import KINDS, WARM_KINDS
from bench.small_jobs import FRAMEWORKS, PARTS


def verdicts(results: dict) -> dict[str, report.Criterion]:
    return {c.name: c for c in report.small_jobs_criteria(results)}


def small_row(jobs_per_s: float) -> dict:
    means = {part: 0.001 for part in PARTS}
    per_job = 1 / jobs_per_s
    return {"jobs": 100, "span_s": 100 * per_job, "jobs_per_s": jobs_per_s, "per_job_s": per_job,
            "overhead_s": per_job - means["train_s"], "means": means, "other_s": per_job - sum(means.values())}


def cold_row(online_s: float, beyond_s: float, other_loaded: bool = False) -> dict:
    return {"online_s": online_s, "first_epoch_s": beyond_s + 0.05, "epoch_time_s": 0.05, "eval_time_s": 0.01,
            "beyond_train_s": beyond_s, "timings": {"queue_wait_s": 0.1}, "other_framework_loaded": other_loaded,
            "own_framework_loaded": True}


def test_each_target_of_the_rows_is_judged():
    results = {"small_jobs": {"frameworks": {"jax": small_row(14.0), "pytorch": small_row(6.0)}},
               "cold_start": {"kinds": {label: cold_row(1.0, 1.5) for label, _, _ in (*KINDS, *WARM_KINDS)}}}
    results["cold_start"]["kinds"]["pytorch"] = cold_row(3.5, 4.0, other_loaded=True)
    judged = verdicts(results)

    assert judged["small-jobs: one-epoch digits jax jobs a second, one cpu worker"].passed is True
    assert judged["small-jobs: one-epoch digits pytorch jobs a second, one cpu worker"].passed is False
    pytorch = [c for name, c in judged.items() if name.startswith("cold-start") and " pytorch job" in name]
    assert [c.passed for c in pytorch] == [False, False, False]  # online, first epoch, the other framework
    jax = [c for name, c in judged.items() if name.startswith("cold-start") and " jax job" in name]
    assert [c.passed for c in jax] == [True, True, True]
    assert len(judged) == len(FRAMEWORKS) + 3 * (len(KINDS) + len(WARM_KINDS))
    assert report.small_jobs_table(results)  # the printed rows


def test_unreachable_services_leave_the_rows_unmeasured_saying_why(tmp_path):
    url, redis_url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere", "redis://127.0.0.1:1/0"
    results = {"small_jobs": measure_part9("small-jobs", Config.quick(), url, redis_url, tmp_path),
               "cold_start": measure_part9("cold-start", Config.quick(), url, redis_url, tmp_path)}

    for criterion in verdicts(results).values():
        assert criterion.passed is None and "not reachable" in criterion.note, criterion.name
