"""Uploaded datasets in the dashboard (a real browser against the real service): the datasets page
lists the built-in ones and the key's, a dataset's page shows its fields and classes, and every
job and comparison names its dataset, an uploaded one linked to its page; regression jobs chart
and tabulate R² and RMSE where classification shows accuracy.

Screenshots go to `test-output/dashboard/` beside test_dashboard.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.e2e.test_dashboard import browser, page, shots, sign_in  # noqa: F401  (fixtures)

ROWS, FEATURES = 240, 4


def small_csv(path: Path, regression: bool) -> Path:
    """ROWS examples of FEATURES features: labelled "cat"/"dog" by a linear rule, or a noisy
    linear target (column `target`)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).round(4)
    score = x @ np.array([1.5, -2.0, 0.5, 1.0])
    header = ",".join([f"f{i}" for i in range(FEATURES)] + ["target" if regression else "label"])
    if regression:
        labels = [f"{v:.4f}" for v in 3 * score + 10 + rng.normal(scale=0.1, size=ROWS)]
    else:
        labels = ["dog" if v > 0 else "cat" for v in score]
    lines = [header] + [",".join([*map(str, row), label]) for row, label in zip(x, labels)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_datasets_page_and_jobs_linked_to_their_dataset(service, page, shots, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    key = service.new_key("datasets-browser")
    with service.client(key) as client:
        def trained(spec: dict) -> dict:
            job = client.wait(client.submit({"batch_size": 16, **spec})["id"], timeout_s=180)
            assert job["status"] == "succeeded", job["error"]
            return job

        pets = client.upload_dataset(small_csv(tmp_path / "pets.csv", regression=False))
        line = client.upload_dataset(small_csv(tmp_path / "line.csv", regression=True), label_column="target",
                                     task="regression")
        assert (pets["task"], pets["class_names"], line["task"]) == ("classification", ["cat", "dog"], "regression")
        on_line = {"dataset": {"id": line["id"], "validation_split": 0.2}, "optimizer": {"learning_rate": 0.01}}
        job = trained({"framework": "jax", "dataset": {"id": pets["id"], "validation_split": 0.2}, "epochs": 1,
                       "name": "on-pets"})
        fit = trained({**on_line, "framework": "pytorch", "epochs": 3, "name": "on-line"})
        built_in = trained({"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1, "batch_size": 64})
        comparison = client.compare({**on_line, "epochs": 2, "batch_size": 16, "name": "line-both-ways"})

    # the datasets page, from the nav: the built-in ones and the key's two uploads
    sign_in(page, service.url, key)
    expect(page.locator(f'tr[data-job-id="{job["id"]}"]')).to_be_visible()
    page.click("nav >> text=Datasets")
    expect(page).to_have_url(f"{service.url}/ui/datasets")
    expect(page.locator('#built-in-body tr[data-dataset="digits"]')).to_contain_text("8×8×1")
    uploaded = page.locator("#datasets-body tr")
    expect(uploaded).to_have_count(2)
    pets_row = page.locator(f'#datasets-body tr[data-dataset-id="{pets["id"]}"]')
    for text in ("pets", pets["id"][:11], "csv", "classification", str(FEATURES), str(pets["train_size"])):
        expect(pets_row).to_contain_text(text)
    expect(page.locator(f'#datasets-body tr[data-dataset-id="{line["id"]}"]')).to_contain_text("regression")
    page.screenshot(path=shots / "11-datasets.png", full_page=True)

    # a dataset's page: its fields, class names, and the jobs on it
    pets_row.locator("a.dataset-link").click()
    expect(page).to_have_url(f"{service.url}/ui/datasets/{pets['id']}")
    expect(page.locator("#dataset-name")).to_have_text("pets")
    expect(page.locator("#dataset-kind")).to_have_text("uploaded")
    for text in (pets["id"], pets["sha256"], "classification", str(pets["train_size"]), "none: jobs set"):
        expect(page.locator("#dataset-fields")).to_contain_text(text)
    expect(page.locator("#dataset-classes li")).to_have_text(["cat", "dog"])
    expect(page.locator("#dataset-jobs-body tr")).to_have_count(1)
    expect(page.locator(f'#dataset-jobs-body tr[data-job-id="{job["id"]}"]')).to_contain_text("on-pets")
    expect(page.locator("#delete")).to_be_visible()
    page.screenshot(path=shots / "12-dataset.png", full_page=True)

    # the job list names each job's dataset; the job page links the uploaded one
    page.goto(f"{service.url}/")
    job_row = page.locator(f'tr[data-job-id="{job["id"]}"]')
    expect(job_row.locator("a.dataset-link")).to_have_text("pets")
    expect(job_row.locator("a.dataset-link")).to_have_attribute("href", f"/ui/datasets/{pets['id']}")
    expect(page.locator(f'tr[data-job-id="{built_in["id"]}"] a.dataset-link')).to_have_text("digits")
    expect(page.locator(f'tr[data-job-id="{fit["id"]}"] td.score')).to_contain_text("RMSE")
    expect(page.locator(f'tr[data-job-id="{fit["id"]}"] td.score')).to_contain_text("R²")
    expect(job_row.locator("td.score")).to_contain_text("%")
    page.goto(f"{service.url}/ui/jobs/{job['id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded")
    link = page.locator(f'#job-dataset a[href="/ui/datasets/{pets["id"]}"]')
    expect(link).to_have_text("pets")
    expect(page.locator("#job-dataset")).to_contain_text("validation split 0.2")
    expect(page.locator("#job-spec")).to_contain_text(f"classification, input {FEATURES}, 2 classes")
    expect(page.locator("#accuracy-chart figcaption")).to_have_text("Accuracy per epoch")
    expect(page.locator("#accuracy-chart")).to_have_attribute("data-points", "1")
    link.click()
    expect(page).to_have_url(f"{service.url}/ui/datasets/{pets['id']}")

    # a regression job: R² charted, RMSE/MAE/R² tabulated where accuracy would be
    page.goto(f"{service.url}/ui/jobs/{fit['id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#job-dataset a.dataset-link")).to_have_text("line")
    expect(page.locator("#accuracy-chart figcaption")).to_have_text("Test R² per epoch")
    expect(page.locator("#accuracy-chart")).to_have_attribute("data-points", "3")
    expect(page.locator('#accuracy-chart g.series[data-series="test R²"] circle')).to_have_count(3)
    expect(page.locator("#epochs thead")).to_contain_text("test RMSE")
    expect(page.locator("#epochs thead")).not_to_contain_text("accuracy")
    last = fit["metrics"][-1]
    r2 = page.locator('#epochs-body tr[data-epoch="3"] td[data-metric="test_r2"]')
    assert abs(float(r2.text_content()) - last["test_r2"]) <= 5e-3 * max(1.0, abs(last["test_r2"]))
    expect(page.locator("#job-timings")).to_contain_text("test R²")
    assert "null" not in page.locator("#content").inner_text() and "NaN" not in page.locator("#content").inner_text()
    page.screenshot(path=shots / "13-regression-job.png", full_page=True)

    # a comparison on the uploaded dataset names it, links it, and shows its regression scores
    page.goto(f"{service.url}/ui/comparisons")
    row = page.locator(f'tr[data-comparison-id="{comparison["id"]}"]')
    expect(row.locator("a.dataset-link")).to_have_attribute("href", f"/ui/datasets/{line['id']}")
    row.locator("a").first.click()
    expect(page.locator('#side-by-side-body tr[data-metric="test_r2"]')).to_be_visible(timeout=180_000)
    expect(page.locator('#side-by-side-body tr[data-metric="test_accuracy"]')).to_have_count(0)
    expect(page.locator("#comparison-spec a.dataset-link")).to_have_text("line")
    expect(page.locator("#comparison-spec")).to_contain_text("MLP [256,128]")
    expect(page.locator("#side-jax .score")).to_contain_text("RMSE")
    page.screenshot(path=shots / "14-regression-comparison.png", full_page=True)

    # a built-in dataset's page: numbered classes, nothing to delete
    page.goto(f"{service.url}/ui/datasets/digits")
    expect(page.locator("#dataset-kind")).to_have_text("built in")
    expect(page.locator("#dataset-classes li")).to_have_count(10)
    expect(page.locator("#delete")).to_be_hidden()

    # deleting a dataset: two clicks, back to the list without it; its job still links its id
    page.goto(f"{service.url}/ui/datasets/{pets['id']}")
    page.click("#delete")
    expect(page.locator("#delete")).to_have_text("Click again to delete")
    page.click("#delete")
    expect(page).to_have_url(f"{service.url}/ui/datasets")
    expect(uploaded).to_have_count(1)
    page.goto(f"{service.url}/ui/jobs/{job['id']}")
    expect(page.locator("#job-dataset a.dataset-link")).to_have_text(pets["id"][:11])
    page.click("#job-dataset a.dataset-link")
    expect(page.locator("#content h1")).to_have_text("Dataset not found")


def test_another_key_sees_none_of_the_datasets(service, page, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    with service.client(service.new_key("owner")) as owner:
        mine = owner.upload_dataset(small_csv(tmp_path / "mine.csv", regression=False))
    sign_in(page, service.url, service.new_key("other"))
    expect(page.locator("#jobs-empty")).to_be_visible()
    page.goto(f"{service.url}/ui/datasets")
    expect(page.locator("#datasets-empty")).to_be_visible()
    expect(page.locator("#built-in-body tr").first).to_be_visible()
    page.goto(f"{service.url}/ui/datasets/{mine['id']}")
    expect(page.locator("#content h1")).to_have_text("Dataset not found")


def test_the_datasets_page_lists_every_upload_past_the_first_page(service, page, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    key = service.new_key("many-datasets")
    with service.client(key) as client:
        for i in range(203):  # GET /datasets gives 200 a page
            path = tmp_path / f"d{i}.csv"
            path.write_text("a,label\n" + "".join(f"{i}.{j},{j % 2}\n" for j in range(8)))  # each its own content
            client.upload_dataset(path)
        assert len([d for d in client.datasets() if not d["built_in"]]) == 203

    sign_in(page, service.url, key)
    page.goto(f"{service.url}/ui/datasets")
    expect(page.locator("#datasets-body tr")).to_have_count(203)
    expect(page.locator('#built-in-body tr[data-dataset="digits"]')).to_have_count(1)  # once, from the first page
