# The API: FastAPI under uvicorn. No jax, no torch (app/ never imports them), so it stays small
# and starts fast. Build from the repository root:
#   docker build -f docker/api.Dockerfile -t trainhub-api .
# The base: python:3.11-slim-bookworm, or any Debian bookworm with Python 3.11 as `python` and
# `pip` (docker/local-base.sh makes one from the Debian mirror alone: TRAINHUB_BASE_IMAGE).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/trainhub

COPY pyproject.toml README.md ./
COPY app ./app
COPY trainers ./trainers
COPY workers ./workers
# The base dependencies only: the `train` extra (jax, torch) is for worker images.
# docker/worker-cpu.Dockerfile repeats these steps word for word (shared layers): change both.
RUN pip install . \
 && useradd --system --uid 10001 --home-dir /srv/trainhub trainhub \
 && mkdir -p /srv/trainhub/var /srv/trainhub/artifacts \
 && chown -R trainhub /srv/trainhub

USER trainhub
ENV TRAINHUB_VAR_DIR=/srv/trainhub/var \
    TRAINHUB_ARTIFACT_DIR=/srv/trainhub/artifacts
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status != 200)"]
# Applies the database migrations on start (compose also runs them once, before anything else).
CMD ["trainhub", "serve", "--host", "0.0.0.0", "--port", "8000"]
