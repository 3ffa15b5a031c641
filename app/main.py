"""The FastAPI application."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import InterfaceError, OperationalError

from app.api import artifacts, comparisons, dashboard, events, health, jobs, metrics, workers
from app.db import migrate
from app.errors import database_unavailable, validation_error


@asynccontextmanager
async def lifespan(_app: FastAPI):
    migrate()  # apply Alembic migrations on start
    yield


def create_app() -> FastAPI:
    app = FastAPI(
        title="trainhub",
        version="0.1.0",
        description="Training as a service for JAX and PyTorch.",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(OperationalError, database_unavailable)
    app.add_exception_handler(InterfaceError, database_unavailable)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(comparisons.router)
    app.include_router(events.router)
    app.include_router(workers.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    app.mount("/static", dashboard.static_files, name="static")
    return app


app = create_app()
