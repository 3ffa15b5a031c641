"""The dashboard: server-rendered pages (Jinja2) whose scripts call the JSON API.

Pages carry no data of their own and need no key to load: the browser asks for an API key
once, keeps it in sessionStorage (or localStorage when asked to remember it) and sends it as
`Authorization: Bearer ...` with every API call, so a user only ever sees their own jobs.
Everything the pages use lies in app/dashboard/static (no CDN: the dashboard works offline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app.lifecycle import JobStatus
from trainers.spec import FRAMEWORKS, HARDWARE

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
templates = Jinja2Templates(directory=DASHBOARD_DIR / "templates")
static_files = StaticFiles(directory=DASHBOARD_DIR / "static")

# Scripts and styles come only from this server; nothing inline, nothing from elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)

Id = Annotated[str, PathParam(max_length=100)]


def page(request: Request, template: str, **context: object) -> HTMLResponse:
    return templates.TemplateResponse(request, template, context, headers=SECURITY_HEADERS)


CHOICES = {"status": [status.value for status in JobStatus], "framework": list(FRAMEWORKS), "hardware": list(HARDWARE)}
Filter = Annotated[str | None, Query(max_length=20)]


@router.get("/", response_class=HTMLResponse)
def jobs_page(
    request: Request, status: Filter = None, framework: Filter = None, hardware: Filter = None
) -> HTMLResponse:
    """The job list, its filters set from the query string (a value it does not know is ignored)."""
    given = {"status": status, "framework": framework, "hardware": hardware}
    filters = {name: value if value in CHOICES[name] else "" for name, value in given.items()}
    return page(request, "jobs.html", active="jobs", filters=filters, choices=CHOICES)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: Id) -> HTMLResponse:
    """One job: spec, timings, live curves, artifacts, cancel."""
    return page(request, "job.html", active="jobs", job_id=job_id)


@router.get("/ui/comparisons", response_class=HTMLResponse)
def comparisons_page(request: Request) -> HTMLResponse:
    return page(request, "comparisons.html", active="comparisons")


@router.get("/ui/comparisons/{comparison_id}", response_class=HTMLResponse)
def comparison_page(request: Request, comparison_id: Id) -> HTMLResponse:
    """A comparison: the side-by-side table and both frameworks' curves overlaid."""
    return page(request, "comparison.html", active="comparisons", comparison_id=comparison_id)


@router.get("/ui/sweeps", response_class=HTMLResponse)
def sweeps_page(request: Request) -> HTMLResponse:
    """The key's sweeps: status, trials done, the best objective."""
    return page(request, "sweeps.html", active="sweeps")


@router.get("/ui/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, sweep_id: Id) -> HTMLResponse:
    """A sweep: its counts, budget and best trial, the trials best first, and the objective per
    trial and per epoch (pruned trials marked), refreshed while it runs."""
    return page(request, "sweep.html", active="sweeps", sweep_id=sweep_id)


@router.get("/ui/datasets", response_class=HTMLResponse)
def datasets_page(request: Request) -> HTMLResponse:
    """The built-in datasets and the key's uploaded ones."""
    return page(request, "datasets.html", active="datasets")


@router.get("/ui/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(request: Request, dataset_id: Id) -> HTMLResponse:
    """One dataset, by its id (uploaded) or its name (built-in): shapes, classes, sizes, the jobs
    that trained on it, delete."""
    return page(request, "dataset.html", active="datasets", dataset_id=dataset_id)


@router.get("/ui/workers", response_class=HTMLResponse)
def workers_page(request: Request) -> HTMLResponse:
    """Who is online, what each serves, and the queue depths."""
    return page(request, "workers.html", active="workers")
