# trainhub: `make demo` runs the main job, `make test` the tests. Both install into .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The stamp names pyproject.toml's content: an edit reinstalls, a fresh clone of the same file
# (newer mtimes) does not.
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
# Debian's package puts Fashion-MNIST here (MNIST's IDX format); the demo trains on it.
FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: install data demo test test-fast lint bench gpu-check deploy-test deploy-images clean

# A venv made for another checkout (VENV outside the clone: .ci/run keeps one per pyproject.toml)
# has this project installed from there: it is installed again from here (editable, no deps).
# Then our modules' bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the build machines)
# every process (a worker starting, the CLI, a test's subprocess) compiled them again (~50 ms).
install: $(STAMP)
	@$(PY) -I -c 'import app, sys; sys.exit(app.__file__ != "$(CURDIR)/app/__init__.py")' 2>/dev/null \
		|| $(PY) -m pip install --quiet --no-deps -e .
	@$(PY) -m compileall -q -j 0 app workers trainers bench >/dev/null

# torch 2.14.1 and torchvision 0.29.1 install from the build machines' local disk with pip.
$(STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-cache-dir -e '.[train,test]'
	rm -f $(VENV)/.installed*
	touch $(STAMP)

data:
	@if [ -d "$(FASHION_MNIST)" ] || [ -n "$$TRAINHUB_DATA_DIR" ]; then exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q dataset-fashion-mnist >/dev/null || \
		{ apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; }; \
	else echo "Fashion-MNIST not found: run 'sudo apt-get install dataset-fashion-mnist' or set TRAINHUB_DATA_DIR to a folder with its IDX files"; exit 1; fi

demo: install data
	$(VENV)/bin/trainhub demo --epochs 5

# Two pytest-xdist workers, each test file on one of them (its module fixtures run once), each
# worker on its own database and Redis db (tests/conftest.py): half of a lone run's time the CPU
# waits (processes starting, jobs polled). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
test: install data
	$(PYTEST)

test-fast: install
	$(PYTEST) -m "not e2e"

# Style and types of the three packages (ruff: lint and format; mypy: types). CI runs it first.
lint: install
	$(VENV)/bin/ruff check app workers trainers
	$(VENV)/bin/ruff format --check app workers trainers
	$(VENV)/bin/mypy

bench: install data
	$(PY) -m bench

# The service end to end on one NVIDIA GPU (bench/gpu_check.py: embedded stack, a worker pinned to
# device 0, JAX and PyTorch jobs in fp32 and bf16, a comparison, a large MLP's TFLOP/s against the
# card's peaks) into bench/gpu_check.json. `make gpu-check HARDWARE=cpu` runs the same checks on the
# CPU (bf16 skipped) into bench/gpu_check-cpu.json; GPU_CHECK_ARGS=--quick shrinks every part.
gpu-check: HARDWARE ?= gpu
gpu-check: install data
	$(PY) -m bench.gpu_check --hardware $(HARDWARE) $(GPU_CHECK_ARGS)

# docker-compose.yml run for real with podman (bench/deploy_test.py): the api and a JAX-only cpu
# worker image built, the stack up and healthy, a key, a job through the published port, its
# weights downloaded, the worker restarted mid-job (the job resumes), everything down again.
# --local-images (the default here) first makes the Debian base, PostgreSQL and Redis images from
# the Debian mirror (docker/local-base.sh, as root); DEPLOY_TEST_ARGS= uses the public images.
deploy-test: DEPLOY_TEST_ARGS ?= --local-images
deploy-test: install
	$(PY) -m bench.deploy_test $(DEPLOY_TEST_ARGS)

# Step 1 of deploy-test alone (the images); CI runs it beside the tests.
deploy-images: DEPLOY_TEST_ARGS ?= --local-images
deploy-images: install
	$(PY) -m bench.deploy_test $(DEPLOY_TEST_ARGS) --build-only

clean:
	rm -rf var .pytest_cache
