# A CUDA worker: JAX with its CUDA 12 plugin and PyTorch's CUDA wheels (both bring their own CUDA
# libraries as pip packages; the host needs only the NVIDIA driver and the NVIDIA Container
# Toolkit). One container per GPU, pinned with `--devices`. Build from the repository root:
#   docker build -f docker/worker-gpu.Dockerfile -t trainhub-worker-gpu .
# The base: python:3.11-slim-bookworm, or any Debian bookworm with Python 3.11 as `python` and
# `pip` (docker/local-base.sh makes one from the Debian mirror alone: TRAINHUB_BASE_IMAGE).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/trainhub

COPY pyproject.toml README.md ./
COPY app ./app
COPY trainers ./trainers
COPY workers ./workers
# PyPI's Linux torch wheels are the CUDA builds; jax[cuda12] adds the jax-cuda12 plugin.
RUN pip install ".[train]" "jax[cuda12]" \
 && useradd --system --uid 10001 --home-dir /srv/trainhub trainhub \
 && mkdir -p /srv/trainhub/var/jax-cache /srv/trainhub/artifacts \
 && chown -R trainhub /srv/trainhub

# jax-cache exists (owned by trainhub) so that a volume mounted on it starts writable, as the
# compose file's jax-cache volume does: a missing mount point is made root's, and JAX then
# quietly keeps no compiled programs.
USER trainhub
# The NVIDIA runtime mounts the driver for these; XLA allocates on demand so that several
# processes can share a card (the worker sets it too, before jax is imported).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    XLA_PYTHON_CLIENT_PREALLOCATE=false \
    TRAINHUB_VAR_DIR=/srv/trainhub/var \
    TRAINHUB_ARTIFACT_DIR=/srv/trainhub/artifacts
HEALTHCHECK --interval=15s --timeout=10s --start-period=120s --retries=3 CMD ["python", "-m", "workers.healthcheck"]
STOPSIGNAL SIGTERM
# Exits with code 2, naming what is missing, when neither framework sees a GPU.
CMD ["trainhub", "worker", "--hardware", "gpu", "--devices", "0"]
