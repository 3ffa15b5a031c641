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

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse, HTMLResponse
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

# The only files of the package the page uses (it also holds Swagger Editor, source maps and a
# start-up script that points at a public demo schema, which are not served).
ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "favicon-32x32.png")
MEDIA_TYPES = {".css": "text/css", ".js": "text/javascript", ".png": "image/png"}

router = APIRouter(include_in_schema=False)
own_files = StaticFiles(directory=OWN_DIR)


@router.get("/docs/assets/{name}")
def asset(name: str) -> FileResponse:
    """One of Swagger UI's ASSETS; any other name is 404 (never a path)."""
    if name not in ASSETS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no such file: {name[:60]}")
    return FileResponse(
        SWAGGER_UI_DIR / name,
        media_type=MEDIA_TYPES[Path(name).suffix],
        headers={"Cache-Control": "public, max-age=3600"},
    )


@router.get("/docs")
def docs() -> HTMLResponse:
    """Swagger UI for /openapi.json, every asset served from here."""
    return HTMLResponse(PAGE, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})
