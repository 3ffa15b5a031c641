"""The dashboard in a real browser (Playwright driving Debian's Chromium) against the real service.

Screenshots go to `test-output/dashboard/` (or `$TRAINHUB_TEST_OUTPUT_DIR/dashboard/`), with the
artifact the browser downloaded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import damaged_dataset_job

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DIGITS = {"dataset": {"name": "digits"}, "batch_size": 64}


def _missing(what: str) -> None:
    if os.environ.get("TRAINHUB_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} (.ci/run installs it)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install -e '.[test]'")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        _missing("chromium is not installed: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots(repo_root) -> Path:
    folder = Path(os.environ.get("TRAINHUB_TEST_OUTPUT_DIR", repo_root / "test-output")) / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def sign_in(page, url: str, key: str, accepted: bool = True) -> None:
    page.goto(f"{url}/")
    page.fill("#api-key", key)
    page.click("#signin-form button[type=submit]")
    # the key is stored once the server accepted it (a fetch): going elsewhere sooner signs out
    page.locator("#who-key" if accepted else "#signin-error").wait_for(state="visible")


def points(page, chart: str) -> int:
    return int(page.get_attribute(chart, "data-points"))


def wait_for_points(page, chart: str, more_than: int, timeout_s: float = 60.0) -> int:
    """Poll the chart's point count from Python: the page's CSP forbids the eval behind
    Playwright's wait_for_function, as it should."""
    deadline = time.monotonic() + timeout_s
    while (count := points(page, chart)) <= more_than:
        assert time.monotonic() < deadline, f"{chart} stayed at {count} points"
        page.wait_for_timeout(100)
    return count


def test_watch_training_compare_and_download_in_the_browser(service, page, shots, tmp_path):
    from playwright.sync_api import expect

    key = service.new_key("browser")
    with service.client(key) as client:
        done = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 2, "name": "finished-one"})["id"],
                           timeout_s=120)
        assert done["status"] == "succeeded", done["error"]
        broken = damaged_dataset_job(service, client, tmp_path, epochs=1, name="no-data")
        # failed before the long one is sent: the worker takes its queues in turn, not in order
        assert client.wait(broken["id"], timeout_s=120)["status"] == "failed"
        # long enough to be watched and cancelled (a tiny step runs on one thread, ~10 ms an epoch)
        running = client.submit({**DIGITS, "framework": "pytorch", "epochs": 1000, "batch_size": 16,
                                 "name": "long-one"})

    # sign in: a wrong key is refused, the right one shows the list
    sign_in(page, service.url, "th_not-a-key", accepted=False)
    expect(page.locator("#signin-error")).to_contain_text("refused")
    sign_in(page, service.url, key)
    rows = page.locator("#jobs-body tr")
    expect(rows).to_have_count(3)
    finished_row = page.locator(f'tr[data-job-id="{done["id"]}"]')
    expect(finished_row.locator(".badge")).to_have_text("succeeded")
    expect(finished_row).to_contain_text("finished-one")
    expect(finished_row).to_contain_text("jax")
    expect(finished_row).to_contain_text("2/2")
    expect(finished_row).to_contain_text(f"{100 * done['result']['test_accuracy']:.2f}%")
    # the list updates live: the long job is seen starting without a reload
    expect(page.locator(f'tr[data-job-id="{running["id"]}"] .badge')).to_have_text("running", timeout=90_000)
    expect(page.locator(f'tr[data-job-id="{broken["id"]}"]')).to_contain_text("data_error (dataset_corrupt)")
    page.select_option("#filter-status", "succeeded")
    expect(rows).to_have_count(1)
    expect(page).to_have_url(re.compile(r"/\?status=succeeded$"))
    page.screenshot(path=shots / "01-jobs-filtered.png", full_page=True)
    page.select_option("#filter-status", "")
    expect(rows).to_have_count(3)
    page.screenshot(path=shots / "02-jobs.png", full_page=True)

    # a running job: its loss chart gains points as epochs end, then the cancel button stops it
    page.click(f'tr[data-job-id="{running["id"]}"] a.job-link')
    expect(page).to_have_url(f"{service.url}/ui/jobs/{running['id']}")
    expect(page.locator("#job-spec")).to_contain_text("pytorch")
    before = wait_for_points(page, "#loss-chart", 0)
    after = wait_for_points(page, "#loss-chart", before)
    assert page.locator('#loss-chart g.series[data-series="train loss"] circle').count() >= after
    expect(page.locator("#job-live")).to_contain_text("live")
    page.screenshot(path=shots / "03-running-job.png", full_page=True)
    page.click("#cancel")
    expect(page.locator("#cancel")).to_have_text("Click again to cancel")
    page.click("#cancel")
    expect(page.locator("#job-status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel")).to_be_hidden()

    # a failed job says why, plainly
    page.goto(f"{service.url}/ui/jobs/{broken['id']}")
    expect(page.locator("#job-error")).to_contain_text("Failed: data_error (dataset_corrupt)")
    expect(page.locator("#job-error")).to_contain_text("upload the dataset again")
    page.screenshot(path=shots / "04-failed-job.png", full_page=True)

    # a comparison: found in the list, the side-by-side table and both loss curves overlaid
    with service.client(key) as client:
        comparison = client.compare({**DIGITS, "epochs": 2, "name": "side-by-side"})
    page.goto(f"{service.url}/ui/comparisons")
    page.click(f'tr[data-comparison-id="{comparison["id"]}"] a')
    expect(page).to_have_url(f"{service.url}/ui/comparisons/{comparison['id']}")
    expect(page.locator('#side-by-side-body tr[data-metric="test_accuracy"]')).to_be_visible(timeout=180_000)
    expect(page.locator("#comparison-status")).to_have_text("succeeded")
    expect(page.locator("#side-by-side thead")).to_contain_text("JAX / PyTorch")
    for framework in ("JAX", "PyTorch"):
        for chart in ("#train-loss-chart", "#test-loss-chart"):
            expect(page.locator(f'{chart} g.series[data-series="{framework}"] circle')).to_have_count(2)
    page.screenshot(path=shots / "05-comparison.png", full_page=True)

    # download an artifact of the finished job
    page.goto(f"{service.url}/ui/jobs/{done['id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#loss-chart")).to_have_attribute("data-points", "2")
    with page.expect_download() as downloading:
        page.click('button[data-artifact="weights.safetensors"]')
    saved = shots / "weights.safetensors"
    downloading.value.save_as(saved)
    listed = {a["name"]: a for a in done["artifacts"]}["weights.safetensors"]
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == listed["sha256"]
    page.screenshot(path=shots / "06-finished-job.png", full_page=True)

    # workers and queues
    page.click("nav >> text=Workers")
    expect(page.locator('#workers-body tr[data-online="true"]').first).to_contain_text("cpu.jax, cpu.pytorch")
    expect(page.locator('#queues-body tr[data-queue="cpu.pytorch"]')).to_be_visible()
    page.screenshot(path=shots / "07-workers.png", full_page=True)


def test_a_user_sees_only_their_own_jobs(service, page):
    from playwright.sync_api import expect

    with service.client(service.new_key("alice")) as alice:
        job = alice.submit({**DIGITS, "framework": "jax", "hardware": "tpu"})  # waits: no tpu worker
        alice.cancel(job["id"])
    sign_in(page, service.url, service.new_key("bob"))
    expect(page.locator("#jobs-empty")).to_be_visible()
    expect(page.locator("#jobs-body tr")).to_have_count(0)
    page.goto(f"{service.url}/ui/jobs/{job['id']}")
    expect(page.locator("#content h1")).to_have_text("Job not found")
    # signing out forgets the key
    page.click("#sign-out")
    expect(page.locator("#signin")).to_be_visible()


def test_each_list_pages_back_to_the_oldest_and_forward_again(service, page):
    """Jobs (filtered), comparisons and sweeps a page at a time (?limit=2 of three each): Older
    follows the API's cursor, the URL keeps the page (reload, Back), Newest returns to the first."""
    from playwright.sync_api import expect

    key = service.new_key("pages")
    with service.client(key) as client:  # no gpu or tpu worker here: everything stays queued
        jobs = [client.submit({**DIGITS, "framework": "pytorch", "hardware": "gpu", "name": f"job-{i}"})
                for i in range(3)]
        comparisons = [client.compare({**DIGITS, "hardware": "tpu", "name": f"cmp-{i}"}) for i in range(3)]
        sweeps = [client.sweep({"base": {**DIGITS, "framework": "jax", "hardware": "tpu"}, "name": f"sweep-{i}",
                                "max_trials": 1, "space": {"batch_size": {"choice": [32, 64]}}}) for i in range(3)]
    sign_in(page, service.url, key)
    lists = [("/?hardware=gpu&limit=2", "#jobs-body a.job-link", "job"),  # the comparisons' jobs are tpu's
             ("/ui/comparisons?limit=2", "#comparisons-body td:first-child a", "cmp"),
             ("/ui/sweeps?limit=2", "#sweeps-body a.sweep-link", "sweep")]
    for path, links, name in lists:
        page.goto(f"{service.url}{path}")
        shown = page.locator(links)
        expect(shown).to_have_text([f"{name}-2", f"{name}-1"])
        expect(page.locator("#newest")).to_be_hidden()
        page.click("#older")
        expect(shown).to_have_text([f"{name}-0"])
        expect(page.locator("#older")).to_be_hidden()
        expect(page).to_have_url(re.compile(r"limit=2.*cursor=|cursor=.*limit=2"))
        page.reload()  # the page is in the URL
        expect(shown).to_have_text([f"{name}-0"])
        page.go_back()
        expect(shown).to_have_text([f"{name}-2", f"{name}-1"])
        page.go_forward()
        expect(shown).to_have_text([f"{name}-0"])
        page.click("#newest")
        expect(shown).to_have_text([f"{name}-2", f"{name}-1"])
        expect(page.locator("#newest")).to_be_hidden()
    # Back undoes a filter, and the form follows the URL
    page.goto(f"{service.url}/?hardware=gpu&limit=2")
    page.click("#older")
    expect(page.locator("#jobs-body a.job-link")).to_have_text(["job-0"])
    page.select_option("#filter-hardware", "tpu")
    expect(page.locator("#jobs-body a.job-link")).to_have_count(2)
    expect(page).not_to_have_url(re.compile("cursor="))
    page.go_back()
    expect(page.locator("#filter-hardware")).to_have_value("gpu")
    expect(page.locator("#jobs-body a.job-link")).to_have_text(["job-0"])
    # a cursor the API never handed out: the field's error, and Newest gets back
    page.goto(f"{service.url}/ui/comparisons?limit=2&cursor=not-a-cursor")
    expect(page.locator("#banner")).to_contain_text("click Newest")
    page.click("#newest")
    expect(page.locator("#comparisons-body td:first-child a")).to_have_text(["cmp-2", "cmp-1"])
    expect(page.locator("#banner")).to_be_hidden()
    with service.client(key) as client:
        for sweep in sweeps:
            client.cancel_sweep(sweep["id"])
        for job in jobs + [job for comparison in comparisons for job in comparison["jobs"].values()]:
            client.cancel(job["id"])


def test_the_api_docs_render_offline_under_their_csp(service, page, shots):
    """Issue 16, item 7: Swagger UI from this server's own files, nothing refused by the CSP."""
    from playwright.sync_api import expect

    refused = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text else None)
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{service.url}/docs")
    expect(page.locator("#swagger-ui .info .title")).to_contain_text("trainhub", timeout=30_000)
    expect(page.locator("#swagger-ui").get_by_text("/jobs/{job_id}/events").first).to_be_visible()
    page.screenshot(path=str(shots / "api-docs.png"))
    assert refused == []
    assert requests and all(url.startswith(service.url) or url.startswith("data:") for url in requests)
