"""The retry policy through real processes: a worker started with TRAINHUB_RETRY_POLICY sends a
failure of a type it names back to the queue, then ends the job failed with it once the count is
spent; the job's JSON, its events and the dashboard's job page say so."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import damaged_dataset_job, running_service
from tests.e2e.test_dashboard import browser, page, sign_in  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def retrying_service(database_url, redis_url, tmp_path_factory):
    with running_service(database_url, redis_url, tmp_path_factory.mktemp("retries"), retry_policy="data_error=1") as svc:
        yield svc


def retried_job(service, tmp_path) -> tuple[str, dict, list]:
    """A job on a damaged dataset (data_error, dataset_corrupt) run to its end: its key, the
    job and its events."""
    key = service.new_key("retries")
    with service.client(key) as client:
        job = client.wait(damaged_dataset_job(service, client, tmp_path, epochs=1)["id"], timeout_s=180)
        return key, job, list(client.events(job["id"]))


def test_a_retried_failure_ends_failed_after_the_policy_and_says_so(retrying_service, tmp_path):
    _, job, events = retried_job(retrying_service, tmp_path)
    assert job["status"] == "failed", job
    assert (job["error"]["type"], job["error"]["reason"]) == ("data_error", "dataset_corrupt")
    assert job["retries"] == 1 and job["attempts"] == 2  # the policy's one retry, then failed
    assert (job["last_error"]["type"], job["last_error"]["reason"]) == ("data_error", "dataset_corrupt")
    final = events[-1]
    assert final.data["status"] == "failed" and final.data["error"]["type"] == "data_error"
    assert final.data["retries"] == 1


def test_the_dashboard_shows_the_failure_and_the_retry(retrying_service, page, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    key, job, _ = retried_job(retrying_service, tmp_path)
    sign_in(page, retrying_service.url, key)
    page.goto(f"{retrying_service.url}/ui/jobs/{job['id']}")
    expect(page.locator("#job-error")).to_contain_text("Failed: data_error (dataset_corrupt)")
    expect(page.locator("#job-error")).to_contain_text("upload the dataset again")
    expect(page.locator("#job-retried")).to_contain_text("Retried 1 time; last after data_error (dataset_corrupt)")
