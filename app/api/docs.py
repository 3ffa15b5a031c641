"""The API's documentation page (Swagger UI) from this server's own files.

FastAPI's default /docs and /redoc load Swagger UI and ReDoc from a CDN, without integrity
checks, on the page where users paste their key, and show nothing offline. Here Swagger UI
(5.x: it reads FastAPI's OpenAPI 3.1) comes from the files of the `swagger-ui-py` package and a
small start-up script of ours, under a CSP that allows only this origin. The schema itself is
`/openapi.json`.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

# Only the package's static files are used (found without importing it: it would import its
# adapters for other web frameworks).
_SPEC = find_spec("swagger_ui")
assert _SPEC is not None and _SPEC.submodule_search_locations, "swagger-ui-py is not installed"
SWAGGER_UI_DIR = Path(list(_SPEC.submodule_search_locations)[0]) / "static"
OWN_DIR = Path(__file__).resolve().parent.parent / "docs_static"

# Only this server's scripts and styles; Swagger UI sets style attributes and uses data: icons.
CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>trainhub API</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
  <link rel="icon" href="/docs/assets/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/swagger-ui-standalone-preset.js"></script>
  <script src="/docs/start/docs.js"></script>
</body>
</html>
"""

router = APIRouter(include_in_schema=False)
swagger_files = StaticFiles(directory=SWAGGER_UI_DIR)
own_files = StaticFiles(directory=OWN_DIR)


@router.get("/docs")
def docs() -> HTMLResponse:
    """Swagger UI for /openapi.json, every asset served from here."""
    return HTMLResponse(PAGE, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})
