"""Sweeps in the dashboard (a real browser against the real service: API, a cpu worker, PostgreSQL,
Redis): the sweeps list, a sweep's page followed live to its end (counts, budget, the best trial,
the trials best first with the pruned ones marked, the objective charted per trial and per epoch),
a trial's job page linking back to its sweep and saying why it was pruned, a cancel from the
page, and another key's sweep not found.

Screenshots go to `test-output/dashboard/` beside test_dashboard.py's.
"""

from __future__ import annotations

from tests.e2e.test_dashboard import browser, page, shots, sign_in  # noqa: F401  (fixtures)

EPOCHS, TRIALS = 3, 6
SPEC = {
    "name": "lr-search",
    "base": {"framework": "jax", "dataset": {"name": "digits"}, "epochs": EPOCHS},
    "space": {"optimizer.learning_rate": {"log_uniform": [1e-5, 0.3]}},
    "objective": {"metric": "test_accuracy", "direction": "max"},
    "method": "random", "max_trials": TRIALS, "parallelism": 2, "seed": 1,
    "early_stopping": {"method": "asha", "min_epochs": 1, "reduction_factor": 2},
}
LR = "optimizer.learning_rate"


def best_first(trials: list[dict]) -> list[int]:
    """The order the page promises: completed trials by objective, then pruned ones (those that
    got further first, then by objective)."""
    assert {t["status"] for t in trials} <= {"succeeded", "pruned"}, trials
    done = sorted((t for t in trials if t["status"] == "succeeded"), key=lambda t: (-t["objective"], t["number"]))
    pruned = sorted((t for t in trials if t["status"] == "pruned"),
                    key=lambda t: (-t["epochs"], -t["objective"], t["number"]))
    return [t["number"] for t in done + pruned]


def test_a_sweep_followed_live_to_its_best_trial_with_the_pruned_ones_marked(service, page, shots):  # noqa: F811
    from playwright.sync_api import expect

    key = service.new_key("sweeps-browser")
    with service.client(key) as client:
        sweep = client.sweep(SPEC)
        sweep_id = sweep["id"]

        # the list, from the nav, while it runs
        sign_in(page, service.url, key)
        expect(page.locator("#who")).to_be_visible()  # signed in: the key is kept for the next page
        page.click("nav >> text=Sweeps")
        expect(page).to_have_url(f"{service.url}/ui/sweeps")
        expect(page.locator("nav a.active")).to_have_text("Sweeps")
        row = page.locator(f'#sweeps-body tr[data-sweep-id="{sweep_id}"]')
        expect(row).to_contain_text("lr-search")
        expect(row).to_contain_text("digits")
        expect(row).to_contain_text("random")
        expect(row).to_contain_text("asha")

        # the sweep's page fills in while the trials run: no reload needed
        row.locator("a.sweep-link").click()
        expect(page).to_have_url(f"{service.url}/ui/sweeps/{sweep_id}")
        expect(page.locator("#sweep-name")).to_have_text("lr-search")
        expect(page.locator("#sweep-summary")).to_contain_text("random search over optimizer.learning_rate")
        expect(page.locator("#sweep-summary")).to_contain_text("early stopping asha from epoch 1")
        expect(page.locator("#sweep-space")).to_contain_text("log_uniform [1.00e-5, 0.3]")
        expect(page.locator("#trials-body tr").first).to_be_visible(timeout=120_000)
        expect(page.locator(f'#trials-head th[data-param="{LR}"]')).to_be_visible()
        if client.get_sweep(sweep_id)["status"] == "running":
            expect(page.locator("#cancel-sweep")).to_be_visible()
            page.screenshot(path=shots / "21-sweep-running.png", full_page=True)

        done = client.wait_sweep(sweep_id, timeout_s=600)
        trials = client.trials(sweep_id)
        jobs = {t["number"]: client.get(t["job_id"]) for t in trials}
    assert done["status"] == "succeeded" and len(trials) == TRIALS and done["trials"]["pruned"] >= 1, done
    pruned = [t for t in trials if t["status"] == "pruned"]
    best = done["best"]

    # the page reaches the end by itself: status, counts, budget, the best trial and its values
    expect(page.locator("#sweep-status")).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#cancel-sweep")).to_be_hidden()
    for status, count in done["trials"].items():
        expect(page.locator(f"#count-{status}")).to_have_text(str(count))
    expect(page.locator("#sweep-trials")).to_contain_text(f"{TRIALS}/{TRIALS}")
    expect(page.locator("#sweep-budget")).to_contain_text(f"{TRIALS} of {TRIALS}")
    expect(page.locator("#best-objective")).to_have_text(f"{100 * best['objective']:.2f}%")
    expect(page.locator("#best-trial-link")).to_have_text(f"trial {best['number']}")
    expect(page.locator("#best-trial-link")).to_have_attribute("href", f"/ui/jobs/{best['job_id']}")
    expect(page.locator("#sweep-best")).to_contain_text(LR)

    # the trials table: every trial, best first, the pruned ones marked and where they stopped
    rows = page.locator("#trials-body tr")
    expect(rows).to_have_count(TRIALS)
    assert [int(r.get_attribute("data-trial")) for r in rows.all()] == best_first(trials)
    expect(rows.first.locator(".badge.best")).to_have_text("best")
    expect(page.locator("#trials-body .badge.best")).to_have_count(1)
    expect(page.locator('#trials-body tr[data-status="pruned"] .badge.pruned')).to_have_count(len(pruned))
    for trial in trials:
        line = page.locator(f'#trials-body tr[data-trial="{trial["number"]}"]')
        expect(line.locator(".badge").first).to_have_text(trial["status"])
        expect(line.locator("td.objective")).to_have_text(f"{100 * trial['objective']:.2f}%")
        expect(line.locator("td.epochs")).to_have_text(f"{trial['epochs']}/{EPOCHS}")
        expect(line.locator(f'td[data-param="{LR}"]')).not_to_have_text("–")
        expect(line.locator("a.job-link")).to_have_attribute("href", f"/ui/jobs/{trial['job_id']}")
        if trial["status"] == "pruned":
            assert trial["epochs"] == trial["pruned_at_epoch"] < EPOCHS
            expect(line).to_contain_text(f"after epoch {trial['pruned_at_epoch']}")

    # the objective per trial: one point each, the best, the pruned and the others told apart
    expect(page.locator("#trials-chart")).to_have_attribute("data-trials", str(TRIALS))
    expect(page.locator("#trials-chart circle")).to_have_count(TRIALS)
    expect(page.locator('#trials-chart g[data-outcome="best"] circle')).to_have_count(1)
    expect(page.locator('#trials-chart g[data-outcome="pruned"] circle')).to_have_count(len(pruned))
    expect(page.locator(f'#trials-chart g[data-outcome="best"] circle[data-trial="{best["number"]}"]')).to_have_count(1)
    expect(page.locator("#trials-chart .legend")).to_contain_text("pruned")

    # the objective per epoch: one line per trial, the pruned ones dashed and ending early
    expect(page.locator("#epochs-chart g.series")).to_have_count(TRIALS)
    for trial in trials:
        series = page.locator(f'#epochs-chart g.series[data-trial="{trial["number"]}"]')
        expect(series).to_have_attribute("data-status", trial["status"])
        expect(series.locator("circle")).to_have_count(trial["epochs"])
        dashed = series.locator("path[stroke-dasharray]")
        expect(dashed).to_have_count(1 if trial["status"] == "pruned" else 0)
        last = jobs[trial["number"]]["metrics"][-1]
        expect(series.locator(f'circle[data-epoch="{trial["epochs"]}"] title')).to_have_text(
            f"trial {trial['number']}, epoch {trial['epochs']}: {last['test_accuracy']:.4g}")
    expect(page.locator("#epochs-chart .legend")).to_contain_text("(pruned)")
    assert "NaN" not in page.locator("#content").inner_text() and "null" not in page.locator("#content").inner_text()
    page.screenshot(path=shots / "22-sweep.png", full_page=True)

    # a pruned trial's job page: where and why it stopped, and its sweep linked
    victim = pruned[0]
    page.locator(f'#trials-body tr[data-trial="{victim["number"]}"] a.job-link').click()
    expect(page).to_have_url(f"{service.url}/ui/jobs/{victim['job_id']}")
    expect(page.locator("#job-status")).to_have_text("pruned")
    expect(page.locator("#job-status .badge")).to_have_class("badge pruned")
    reason = jobs[victim["number"]]["pruned"]["reason"]
    expect(page.locator("#job-pruned")).to_contain_text(f"Pruned after epoch {victim['pruned_at_epoch']}")
    expect(page.locator("#job-pruned")).to_contain_text(reason)
    expect(page.locator("#job-error")).to_be_hidden()
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#job-trial")).to_contain_text(f"Trial {victim['number']} of sweep lr-search")
    expect(page.locator("#job-trial")).to_contain_text(LR)
    expect(page.locator("#loss-chart")).to_have_attribute("data-points", str(victim["pruned_at_epoch"]))
    page.screenshot(path=shots / "23-pruned-trial.png", full_page=True)
    page.click("#job-sweep-link")
    expect(page).to_have_url(f"{service.url}/ui/sweeps/{sweep_id}")
    expect(page.locator("#trials-body tr")).to_have_count(TRIALS)

    # the best trial's job page: succeeded, nothing pruned, and its sweep linked too
    page.goto(f"{service.url}/ui/jobs/{best['job_id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#job-pruned")).to_be_hidden()
    expect(page.locator("#job-sweep-link")).to_have_attribute("href", f"/ui/sweeps/{sweep_id}")

    # the job list shows the pruned trial as ended, with its reason
    page.goto(f"{service.url}/")
    expect(page.locator(f'tr[data-job-id="{victim["job_id"]}"] .badge')).to_have_text("pruned")
    expect(page.locator(f'tr[data-job-id="{victim["job_id"]}"]')).to_contain_text("pruned by asha")

    # a second sweep, cancelled from its page (two clicks, as for a job)
    with service.client(key) as client:
        other = client.sweep({**SPEC, "name": "to-cancel", "max_trials": 4, "parallelism": 1, "early_stopping": None})
    page.goto(f"{service.url}/ui/sweeps/{other['id']}")
    expect(page.locator("#cancel-sweep")).to_be_visible()
    page.click("#cancel-sweep")
    expect(page.locator("#cancel-sweep")).to_have_text("Click again to cancel")
    page.click("#cancel-sweep")
    expect(page.locator("#sweep-status")).to_have_text("cancelled", timeout=60_000)
    expect(page.locator("#cancel-sweep")).to_be_hidden()
    expect(page.locator("#sweep-summary")).to_contain_text("no early stopping")

    # the list: both, the finished one with its best objective
    page.click("nav >> text=Sweeps")
    expect(page.locator("#sweeps-body tr")).to_have_count(2)
    finished = page.locator(f'#sweeps-body tr[data-sweep-id="{sweep_id}"]')
    expect(finished.locator(".badge")).to_have_text("succeeded")
    expect(finished.locator("td.trials")).to_have_text(f"{TRIALS}/{TRIALS}")
    expect(finished.locator("td.best")).to_contain_text(f"{100 * best['objective']:.2f}%")
    cancelled = page.locator(f'#sweeps-body tr[data-sweep-id="{other["id"]}"]')
    expect(cancelled.locator(".badge")).to_have_text("cancelled")
    expect(cancelled.locator("td.trials")).to_contain_text("/4")  # stopped short of its max_trials
    page.screenshot(path=shots / "24-sweeps.png", full_page=True)

    # another key sees neither
    page.click("#sign-out")
    sign_in(page, service.url, service.new_key("someone-else"))
    expect(page.locator("#who")).to_be_visible()
    page.goto(f"{service.url}/ui/sweeps")
    expect(page.locator("#sweeps-empty")).to_be_visible()
    page.goto(f"{service.url}/ui/sweeps/{sweep_id}")
    expect(page.locator("#content h1")).to_have_text("Sweep not found")
