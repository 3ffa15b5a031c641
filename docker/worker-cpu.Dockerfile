# A cpu worker: JAX (CPU) and PyTorch's CPU wheels (PyPI's default torch wheels carry gigabytes
# of CUDA libraries a cpu worker never loads). One container per worker; `--devices` pins it
# to cores (CPU affinity and thread counts). Build from the repository root:
#   docker build -f docker/worker-cpu.Dockerfile -t trainhub-worker-cpu .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Fashion-MNIST as Debian packages it (IDX files under /usr/share/datasets/fashion-mnist).
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/trainhub

COPY pyproject.toml README.md ./
COPY app ./app
COPY trainers ./trainers
COPY workers ./workers
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[train]" \
 && useradd --system --uid 10001 --home-dir /srv/trainhub trainhub \
 && mkdir -p /srv/trainhub/var /srv/trainhub/artifacts \
 && chown -R trainhub /srv/trainhub

USER trainhub
ENV TRAINHUB_VAR_DIR=/srv/trainhub/var \
    TRAINHUB_ARTIFACT_DIR=/srv/trainhub/artifacts
# Fresh while the worker's heartbeat row (written every TRAINHUB_HEARTBEAT_S) is younger than
# TRAINHUB_WORKER_TIMEOUT_S; imports neither jax nor torch.
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 CMD ["python", "-m", "workers.healthcheck"]
# SIGTERM: the running job stops at its next chunk and goes back to the queue.
STOPSIGNAL SIGTERM
CMD ["trainhub", "worker", "--hardware", "cpu"]
