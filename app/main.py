"""The FastAPI application."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api import (
    artifacts,
    code,
    comparisons,
    dashboard,
    datasets,
    docs,
    events,
    health,
    jobs,
    metrics,
    models,
    sweeps,
    webhooks,
    workers,
)
from app.config import get_settings
from app.db import migrate
from app.errors import (
    database_busy,
    database_unavailable,
    not_found,
    quota_exceeded,
    spec_over_limit,
    validation_error,
)
from app.limits import QuotaExceeded, SpecOverLimit
from app.middleware import RequestLimits, SecurityHeaders
from app.webhooks import dispatcher


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    migrate()  # apply Alembic migrations on start
    # The heap the imports built (~180k objects) lives as long as the process: frozen, the
    # collector's full passes skip it, and the request that triggers one waits a few ms, not ~100.
    # No gc.collect() first: it finds a few hundred objects here, and costs a test ~0.1 s.
    gc.freeze()
    try:
        async with dispatcher.running():  # sends the webhooks' due deliveries (app/webhooks/dispatcher.py)
            yield
    finally:
        gc.unfreeze()  # an app run inside another program (the tests): its heap collectable again


def create_app() -> FastAPI:
    app = FastAPI(
        title="trainhub",
        version="0.1.0",
        description="Training as a service for JAX and PyTorch.",
        lifespan=lifespan,
        # /docs is served from this server's own files (app/api/docs.py); no CDN page, no ReDoc.
        docs_url=None,
        redoc_url=None,
    )
    # Starlette types a handler's exception as Exception; each of these takes its own subclass.
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(SpecOverLimit, spec_over_limit)  # type: ignore[arg-type]
    app.add_exception_handler(QuotaExceeded, quota_exceeded)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, not_found)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, database_unavailable)
    app.add_exception_handler(InterfaceError, database_unavailable)
    app.add_exception_handler(PoolTimeout, database_busy)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(comparisons.router)
    app.include_router(sweeps.router)
    app.include_router(datasets.router)
    app.include_router(code.router)
    app.include_router(models.router)
    app.include_router(events.router)
    app.include_router(webhooks.router)
    app.include_router(workers.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    app.include_router(docs.router)
    app.mount("/static", dashboard.static_files, name="static")
    app.mount("/docs/start", docs.own_files, name="docs-start")
    # The last added runs first: CORS answers preflights, security headers go on every answer
    # (a 413 too), and bodies are checked before any route reads them.
    app.add_middleware(RequestLimits)
    app.add_middleware(SecurityHeaders)
    if origins := get_settings().cors_origins:
        # Only the listed origins; without any, browsers keep other sites from reading answers.
        # Keys travel in the Authorization header, never cookies, so no credentials mode.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "HEAD", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "Range"],
            expose_headers=["Location", "Retry-After", "Content-Range", "Content-Disposition"],
            max_age=600,
        )
    return app


app = create_app()
