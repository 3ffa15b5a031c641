"""The dashboard's pages and assets: served by the app itself, nothing from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "app" / "dashboard"


@pytest.mark.parametrize("path, page", [
    ("/", "jobs"), ("/ui/jobs/some-id", "job"), ("/ui/comparisons", "comparisons"),
    ("/ui/comparisons/some-id", "comparison"), ("/ui/workers", "workers"), ("/ui/datasets", "datasets"),
    ("/ui/datasets/ds_0123456789abcdef0123456789abcdef", "dataset"), ("/ui/datasets/digits", "dataset"),
    ("/ui/sweeps", "sweeps"), ("/ui/sweeps/some-id", "sweep"),
])
def test_pages_render_without_a_key(api, path, page):
    response = api.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert f'data-page="{page}"' in response.text
    assert 'id="signin-form"' in response.text
    assert "default-src 'self'" in response.headers["content-security-policy"]


def test_filters_come_from_the_query_string_and_unknown_values_are_ignored(api):
    html = api.get("/", params={"status": "running", "framework": "bogus"}).text
    assert '<option value="running" selected>' in html
    assert "selected" not in html.split('id="filter-framework"')[1].split("</select>")[0]


def test_ids_in_pages_are_escaped(api):
    for page in ("jobs", "comparisons", "datasets", "sweeps"):
        html = api.get(f'/ui/{page}/"><script>alert(1)</script>').text
        assert "<script>alert(1)" not in html, page


def test_every_page_is_in_the_nav(api):
    html = api.get("/ui/datasets").text
    nav = html.split("<nav>")[1].split("</nav>")[0]
    for href in ("/", "/ui/comparisons", "/ui/sweeps", "/ui/datasets", "/ui/workers"):
        assert f'href="{href}"' in nav, href
    assert '<a href="/ui/datasets" class="active">Datasets</a>' in nav
    assert 'data-dataset-id="ds_1"' in api.get("/ui/datasets/ds_1").text


def test_assets_are_served_and_nothing_comes_from_another_host(api):
    for name in ("dashboard.js", "linechart.js", "dashboard.css"):
        response = api.get(f"/static/{name}")
        assert response.status_code == 200, name
    for path in STATIC.rglob("*"):
        if path.is_file():
            text = path.read_text()
            # the only absolute URL allowed is the SVG namespace, which is a name, not a fetch
            assert not [u for u in re.findall(r"https?://[^\s\"'`)]+", text) if u != "http://www.w3.org/2000/svg"], path
