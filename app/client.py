"""A small typed client of the trainhub HTTP API (httpx); the CLI uses it, scripts can too.

    client = TrainhubClient("http://127.0.0.1:8000", api_key)
    job = client.submit({"framework": "jax", "dataset": {"name": "digits"}, "epochs": 3})
    job = client.wait(job["id"])
    client.download(job["id"], "weights.safetensors", Path("out"))
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

FINISHED = ("succeeded", "failed", "cancelled")


class ApiError(Exception):
    """The API answered with an error status; `detail` is its message (or 422 list)."""

    def __init__(self, status_code: int, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"HTTP {status_code}: {format_detail(detail)}")


def format_detail(detail: Any) -> str:
    """FastAPI's 422 list as 'field.path: message' lines; other details as they are."""
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', []) if p != 'body')}: {item.get('msg')}" for item in detail
        )
    return str(detail)


class TrainhubClient:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "TrainhubClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response.json()

    def submit(self, spec: dict, idempotency_key: str | None = None) -> dict:
        """POST /jobs; the created Job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._request("POST", "/jobs", json=spec, headers=headers)

    def get(self, job_id: str) -> dict:
        """GET /jobs/{id}."""
        return self._request("GET", f"/jobs/{job_id}")

    def list(self, **filters) -> dict:
        """GET /jobs with filters status, framework, hardware, limit, cursor."""
        return self._request("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})

    def cancel(self, job_id: str) -> dict:
        return self._request("POST", f"/jobs/{job_id}/cancel")

    def wait(
        self, job_id: str, poll_s: float = 0.5, timeout_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the job ends; the final Job. Raises TimeoutError after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            job = self.get(job_id)
            if on_update:
                on_update(job)
            if job["status"] in FINISHED:
                return job
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s} s")
            time.sleep(poll_s)

    def compare(self, spec: dict) -> dict:
        """POST /comparisons: the spec (no framework) trained in JAX and in PyTorch."""
        return self._request("POST", "/comparisons", json=spec)

    def get_comparison(self, comparison_id: str) -> dict:
        return self._request("GET", f"/comparisons/{comparison_id}")

    def wait_comparison(
        self, comparison_id: str, poll_s: float = 0.5, timeout_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the comparison ends (both jobs and the parity check); the final Comparison."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            comparison = self.get_comparison(comparison_id)
            if on_update:
                on_update(comparison)
            if comparison["status"] in FINISHED:
                return comparison
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"comparison {comparison_id} still {comparison['status']} after {timeout_s} s")
            time.sleep(poll_s)

    def artifacts(self, job_id: str) -> list[dict]:
        return self._request("GET", f"/jobs/{job_id}/artifacts")

    def download(self, job_id: str, name: str, dest_dir: Path) -> Path:
        """Save one artifact into `dest_dir` and check its sha256 against the listing.

        Raises ApiError for an unknown name and ValueError when the checksum differs."""
        listed = {a["name"]: a for a in self.artifacts(job_id)}
        if name not in listed:
            raise ApiError(404, f"job {job_id} has no artifact named {name!r}; it has {', '.join(listed) or 'none'}")
        dest_dir.mkdir(parents=True, exist_ok=True)
        path = dest_dir / Path(name).name
        digest = hashlib.sha256()
        with self.http.stream("GET", f"/jobs/{job_id}/artifacts/{name}") as response:
            if response.status_code >= 400:
                raise ApiError(response.status_code, response.read().decode(errors="replace"))
            with open(path, "wb") as f:
                for chunk in response.iter_bytes():
                    f.write(chunk)
                    digest.update(chunk)
        if digest.hexdigest() != listed[name]["sha256"]:
            raise ValueError(f"{name}: sha256 {digest.hexdigest()} differs from the listed {listed[name]['sha256']}")
        return path
