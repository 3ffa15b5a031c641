# A TPU worker (on a Cloud TPU VM): JAX with libtpu. It serves tpu.jax only; PyTorch on TPU
# would need torch_xla, which this image does not install (the worker checks and says so).
# Build from the repository root:
#   docker build -f docker/worker-tpu.Dockerfile -t trainhub-worker-tpu .
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
# torch comes with the `train` extra; its CPU wheels keep the image small (it is not used here).
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[train]" "jax[tpu]" \
 && mkdir -p /srv/trainhub/var/jax-cache /srv/trainhub/artifacts

# Runs as root: libtpu opens /dev/accel* and /dev/vfio, which a privileged container exposes to
# root only. Files it writes to the shared artifact volume stay readable by the API's user.
ENV TRAINHUB_VAR_DIR=/srv/trainhub/var \
    TRAINHUB_ARTIFACT_DIR=/srv/trainhub/artifacts
HEALTHCHECK --interval=15s --timeout=10s --start-period=120s --retries=3 CMD ["python", "-m", "workers.healthcheck"]
STOPSIGNAL SIGTERM
CMD ["trainhub", "worker", "--hardware", "tpu", "--frameworks", "jax"]
