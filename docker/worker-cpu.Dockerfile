# A cpu worker: JAX (CPU) and PyTorch's CPU wheels (PyPI's default torch wheels carry gigabytes
# of CUDA libraries a cpu worker never loads). One container per worker; `--devices` pins it
# to cores (CPU affinity and thread counts). Build from the repository root:
#   docker build -f docker/worker-cpu.Dockerfile -t trainhub-worker-cpu .
# The base: python:3.11-slim-bookworm, or any Debian bookworm with Python 3.11 as `python` and
# `pip` (docker/local-base.sh makes one from the Debian mirror alone: TRAINHUB_BASE_IMAGE).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# Up to the `RUN pip install .` these are the API image's steps, word for word: built on one
# host, the two images share those layers (built once, stored once; `make deploy-test` relies
# on it to build both within CI's time). Keep them the same as docker/api.Dockerfile's.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/trainhub

COPY pyproject.toml README.md ./
COPY app ./app
COPY trainers ./trainers
COPY workers ./workers
RUN pip install . \
 && useradd --system --uid 10001 --home-dir /srv/trainhub trainhub \
 && mkdir -p /srv/trainhub/var /srv/trainhub/artifacts \
 && chown -R trainhub /srv/trainhub

# Fashion-MNIST as Debian packages it (IDX files under /usr/share/datasets/fashion-mnist).
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
# The frameworks. EXTRAS=jax builds a JAX-only worker (no torch, no PyTorch index; it serves
# cpu.jax alone). jax-cache exists, owned by trainhub, so that a volume mounted on it starts
# writable, as the compose file's jax-cache volume does: a missing mount point is made root's,
# and JAX then quietly keeps no compiled programs.
ARG EXTRAS=train
RUN case ",$EXTRAS," in *,train,*|*,pytorch,*) torch_index="https://download.pytorch.org/whl/cpu" ;; *) torch_index= ;; esac \
 && pip install ${torch_index:+--extra-index-url "$torch_index"} ".[$EXTRAS]" \
 && mkdir -p /srv/trainhub/var/jax-cache \
 && chown -R trainhub /srv/trainhub/var

USER trainhub
ENV TRAINHUB_VAR_DIR=/srv/trainhub/var \
    TRAINHUB_ARTIFACT_DIR=/srv/trainhub/artifacts
# Fresh while the worker's heartbeat row (written every TRAINHUB_HEARTBEAT_S) is younger than
# TRAINHUB_WORKER_TIMEOUT_S; imports neither jax nor torch.
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 CMD ["python", "-m", "workers.healthcheck"]
# SIGTERM: the running job stops at its next chunk and goes back to the queue.
STOPSIGNAL SIGTERM
CMD ["trainhub", "worker", "--hardware", "cpu"]
