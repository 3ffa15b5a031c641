"""The HTTP contract, fuzzed: Schemathesis generates requests from the app's own OpenAPI schema
(valid ones and ones that break it) and sends them, with an API key, to the ASGI app on real
PostgreSQL and Redis. No answer may be a 5xx, and every answer must match the schema: a
documented status code, content type and headers, and a body of the documented shape.

Examples per operation: TRAINHUB_FUZZ_EXAMPLES (default 50, under a minute in all on a busy
two-core machine); raise it locally to dig deeper.
"""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402  (after the importorskip)
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("TRAINHUB_FUZZ_EXAMPLES", "50"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, ignored_auth]


def load_schema():
    """The app's schema, with the app to send requests to. The app is built without starting it
    (no migrations, no database): each request reads the settings and the engine then, which
    the `services_env` fixture points at this test's PostgreSQL and Redis."""
    from app.config import get_settings
    from app.main import create_app

    app = create_app()
    get_settings.cache_clear()  # built from the ambient environment; let the fixtures set it
    loaded = schemathesis.openapi.from_dict(app.openapi())
    loaded.app = app
    loaded.config.generation.update(modes=["positive", "negative"], max_examples=EXAMPLES, deterministic=True)
    return loaded


schema = load_schema()


@pytest.fixture
def fuzz_key(services_env, make_key) -> str:
    return make_key("fuzz")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_contract_holds_under_fuzzing(case, fuzz_key):
    # The event stream of a real job lasts until the job ends; generated ids never name one, so
    # every call is answered at once (401 or 404), and that answer is what is checked.
    case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_key}"}, checks=CHECKS)
