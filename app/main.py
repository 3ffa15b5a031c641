"""The FastAPI application."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from app.api import artifacts, comparisons, health, jobs
from app.db import migrate
from app.errors import validation_error


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
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(comparisons.router)
    return app


app = create_app()
