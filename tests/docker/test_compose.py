"""docker-compose.yml and the images, checked without docker: the file is valid Compose (the
Compose Specification's schema, vendored here), and its services, ports and environment agree
with app.config.Settings, the CLI and the Dockerfiles."""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).with_name("compose-spec.json")
WORKERS = ("worker-cpu", "worker-gpu", "worker-tpu")
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value):
    """Compose's `${NAME:-default}` with nothing set in the environment: the defaults."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # YAML merge keys (<<) applied


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    return interpolate(raw)


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def test_valid_against_the_compose_specification(raw, compose):
    schema = json.loads(SCHEMA.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    for document in (raw, compose):  # as written, and as compose reads it with no variables set
        errors = sorted(validator_class(schema).iter_errors(document), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_services(services):
    assert {"postgres", "redis", "migrate", "api", *WORKERS} <= set(services)
    assert "profiles" not in services["worker-cpu"]
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    assert services["worker-tpu"]["profiles"] == ["tpu"]
    for name, service in services.items():
        if name != "migrate":  # a one-off step: it has no health, it exits 0
            assert "test" in service.get("healthcheck", {}), f"{name} has no healthcheck"


def test_every_trainhub_variable_is_a_setting_and_parses(services, monkeypatch):
    from app.config import Settings

    fields = {f"TRAINHUB_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        env = environment(service)
        unknown = {k for k in env if k.startswith("TRAINHUB_")} - fields
        assert not unknown, f"{name}: {unknown} are not Settings fields"
        for key in [k for k in os.environ if k.startswith("TRAINHUB_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        if any(k.startswith("TRAINHUB_") for k in env):
            Settings()  # raises on a value Settings refuses


def test_database_and_broker_urls_name_the_services(services):
    postgres = environment(services["postgres"])
    for name in ("migrate", "api", *WORKERS):
        env = environment(services[name])
        database = urlsplit(env["TRAINHUB_DATABASE_URL"])
        assert database.scheme == "postgresql+psycopg" and database.hostname == "postgres" and database.port == 5432
        assert database.username == postgres["POSTGRES_USER"] and database.password == postgres["POSTGRES_PASSWORD"]
        assert database.path == f"/{postgres['POSTGRES_DB']}"
        broker = urlsplit(env["TRAINHUB_BROKER_URL"])
        assert broker.scheme == "redis" and broker.hostname == "redis"
        depends = services[name]["depends_on"]
        if name == "migrate":
            assert depends["postgres"]["condition"] == "service_healthy"
        else:
            assert depends["migrate"]["condition"] == "service_completed_successfully"
            assert depends["redis"]["condition"] == "service_healthy"


def test_the_api_port_matches_its_command_healthcheck_and_the_cli_default(services):
    from app.config import Settings

    api = services["api"]
    command = api["command"]
    port = int(command[command.index("--port") + 1])
    assert command[:2] == ["trainhub", "serve"] and command[command.index("--host") + 1] == "0.0.0.0"
    (published,) = api["ports"]
    host_port, container_port = published.rsplit(":", 1)
    assert int(container_port) == port
    assert f"127.0.0.1:{port}/readyz" in " ".join(api["healthcheck"]["test"])
    # the CLI on the docker host reaches it with no TRAINHUB_API_URL set
    assert urlsplit(Settings().api_url).port == int(host_port)


def test_workers_share_the_apis_artifact_volume_and_serve_their_hardware(services):
    from workers.__main__ import parse_args

    def artifact_volume(service: dict) -> str:
        target = environment(service)["TRAINHUB_ARTIFACT_DIR"]
        return next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == target)

    volume = artifact_volume(services["api"])
    for name in WORKERS:
        service = services[name]
        assert artifact_volume(service) == volume, name
        assert service["command"][:2] == ["trainhub", "worker"]
        args = parse_args(service["command"][2:])
        assert args.hardware == name.removeprefix("worker-")
        assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "workers.healthcheck"]
        assert int(service["stop_grace_period"].rstrip("s")) >= 30  # time to hand a job back
    gpu = services["worker-gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert parse_args(gpu["command"][2:]).devices == [int(i) for i in device["device_ids"]]
    assert environment(gpu)["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert parse_args(services["worker-tpu"]["command"][2:]).frameworks == ["jax"]


def test_the_migration_step_is_a_cli_command(services):
    from app.cli import cli

    assert services["migrate"]["command"] == ["trainhub", "migrate"]
    assert "migrate" in {c.name or c.callback.__name__ for c in cli.registered_commands}


def dockerfile(services: dict, name: str) -> str:
    build = services[name]["build"]
    assert build["context"] == "."
    return (ROOT / build["dockerfile"]).read_text()


def test_the_api_image_has_neither_jax_nor_torch(services):
    for name in ("api", "migrate"):
        text = dockerfile(services, name)
        install = text.split("RUN pip install", 1)[1].split("\n")[0]
        assert "[train]" not in text and not re.search(r"\b(jax|torch)\b", install)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if re.match(r"(jax|jaxlib|torch|flax|optax)\b", d)]


@pytest.mark.parametrize("name,extra", [("worker-cpu", "download.pytorch.org/whl/cpu"), ("worker-gpu", "jax[cuda12]"),
                                        ("worker-tpu", "jax[tpu]")])
def test_worker_images_install_the_frameworks_for_their_hardware(services, name, extra):
    text = dockerfile(services, name)
    # the cpu worker's extras are a build argument (EXTRAS=jax: a JAX-only image), train by default
    assert ('".[train]"' in text or ('".[$EXTRAS]"' in text and "ARG EXTRAS=train\n" in text)) and extra in text
    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert command == services[name]["command"]  # the image alone starts the same worker


def test_dockerfiles_copy_only_what_exists():
    for path in (ROOT / "docker").glob("*.Dockerfile"):
        for line in path.read_text().splitlines():
            if line.startswith("COPY "):
                for source in shlex.split(line)[1:-1]:
                    assert (ROOT / source).exists(), f"{path.name}: {source}"


def test_the_images_default_to_the_public_ones_and_take_a_base(raw, services):
    """Unset, the variables give the public images (postgres:16, redis:7, python:3.11-slim); each
    trainhub Dockerfile builds FROM its BASE argument, whose default is the compose file's."""
    assert services["postgres"]["image"] == "postgres:16" and services["redis"]["image"] == "redis:7"
    assert raw["services"]["postgres"]["image"] == "${TRAINHUB_POSTGRES_IMAGE:-postgres:16}"
    assert raw["services"]["redis"]["image"] == "${TRAINHUB_REDIS_IMAGE:-redis:7}"
    for name in ("migrate", "api", *WORKERS):
        text = dockerfile(services, name)
        assert services[name]["build"]["args"]["BASE"] == "python:3.11-slim-bookworm", name
        assert "ARG BASE=python:3.11-slim-bookworm\nFROM ${BASE}\n" in text, name
    assert services["worker-cpu"]["build"]["args"]["EXTRAS"] == "train"


def test_the_deploy_test_starts_services_in_depends_on_order(services):
    from bench.deploy_test import start_order

    default = {name: s for name, s in services.items() if not s.get("profiles")}
    assert start_order(default) == [["postgres", "redis"], ["migrate"], ["api", "worker-cpu"]]


@pytest.mark.parametrize("name", ["worker-cpu", "worker-gpu", "worker-tpu"])
def test_worker_images_own_the_mount_points_of_their_volumes(services, name):
    """A volume mounted where the image has no directory starts root's (docker): the worker,
    running as trainhub, could write neither its artifacts nor its compile cache."""
    text = dockerfile(services, name)
    for volume in services[name]["volumes"]:
        target = volume.split(":")[1]
        assert re.search(rf"mkdir -p [^\n]*{re.escape(target)}\b", text), f"{name}: {target}"


def instructions(text: str) -> list[str]:
    """A Dockerfile's instructions, continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [" ".join(i.split()) for i in "\n".join(lines).replace("\\\n", " ").split("\n") if i.strip()]


def test_the_cpu_worker_image_starts_with_the_api_images_layers(services):
    """Word for word up to the API's `RUN pip install .`, so one host builds and stores those
    layers once for both (make deploy-test builds both within CI's time on that)."""
    api = instructions(dockerfile(services, "api"))
    shared = api[: next(i for i, step in enumerate(api) if step.startswith("RUN pip install .")) + 1]
    assert instructions(dockerfile(services, "worker-cpu"))[: len(shared)] == shared
