"""A small typed client of the trainhub HTTP API (httpx); the CLI uses it, scripts can too.

    client = TrainhubClient("http://127.0.0.1:8000", api_key)
    job = client.submit({"framework": "jax", "dataset": {"name": "digits"}, "epochs": 3})
    for event in client.events(job["id"]):          # status and per-epoch metrics, live
        print(event.event, event.data)
    job = client.wait(job["id"])
    client.download(job["id"], "weights.safetensors", Path("out"))

Errors: `ApiError` for an HTTP error status (`status_code`, `detail`); httpx.TransportError
when the server cannot be reached.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from app.status import FINISHED as _FINISHED

FINISHED = tuple(status.value for status in _FINISHED)


def _segment(value: str) -> str:
    """`value` as one path segment: an id such as "a/../b" or "x?y" names no other route."""
    return quote(value, safe="")


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


@dataclass(frozen=True)
class Event:
    """A server-sent event of `GET /jobs/{id}/events`: `event` is "status", "metrics" or
    "waiting"; `id` the sequence number to resume after (None for "waiting" hints)."""

    id: str | None
    event: str
    data: dict

    @property
    def is_final(self) -> bool:
        """The job's last event: its final status."""
        return self.event == "status" and self.data.get("status") in FINISHED


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    """Events from the lines of a text/event-stream (the WHATWG format: `field: value` lines,
    a blank line ends an event, `:` starts a comment)."""
    event_id, name, data = None, "message", list[str]()
    for line in lines:
        if line == "":
            if data:
                yield Event(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            event_id = value
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)


class TrainhubClient:
    """The HTTP API as methods returning its JSON (dicts shaped as in the OpenAPI page)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> TrainhubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        _raise_for_status(response)
        return response.json()

    def _every(self, path: str, most: int | None = None, page_size: int = 200) -> builtins.list[dict]:
        """Every item of a paged list (GET `path`), following next_cursor page after page; the
        first `most` of them when given."""
        items: builtins.list[dict] = []
        params: dict[str, object] = {"limit": page_size if most is None else min(page_size, most)}
        while True:
            page = self._request("GET", path, params=params)
            items.extend(page["items"])
            if not page.get("next_cursor") or (most is not None and len(items) >= most):
                return items[:most]
            params = {**params, "cursor": page["next_cursor"]}

    def submit(self, spec: dict, idempotency_key: str | None = None) -> dict:
        """POST /jobs; the created Job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._request("POST", "/jobs", json=spec, headers=headers)

    def get(self, job_id: str) -> dict:
        """GET /jobs/{id}."""
        return self._request("GET", f"/jobs/{_segment(job_id)}")

    def list(self, **filters: object) -> dict:
        """GET /jobs with filters status, framework, hardware, limit, cursor."""
        return self._request("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})

    def cancel(self, job_id: str) -> dict:
        return self._request("POST", f"/jobs/{_segment(job_id)}/cancel")

    def wait(
        self,
        job_id: str,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the job ends; the final Job. Raises TimeoutError after `timeout_s` seconds."""
        return self._poll(lambda: self.get(job_id), f"job {job_id}", poll_s, timeout_s, on_update)

    def compare(self, spec: dict) -> dict:
        """POST /comparisons: the spec (no framework) trained in JAX and in PyTorch."""
        return self._request("POST", "/comparisons", json=spec)

    def comparisons(self, limit: int = 20) -> builtins.list[dict]:
        """GET /comparisons: the caller's `limit` latest comparisons, newest first (as many pages
        as that takes)."""
        return self._every("/comparisons", most=limit, page_size=100)

    def get_comparison(self, comparison_id: str) -> dict:
        return self._request("GET", f"/comparisons/{_segment(comparison_id)}")

    def wait_comparison(
        self,
        comparison_id: str,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the comparison ends (both jobs and the parity check); the final Comparison."""
        return self._poll(
            lambda: self.get_comparison(comparison_id), f"comparison {comparison_id}", poll_s, timeout_s, on_update
        )

    def sweep(self, spec: dict) -> dict:
        """POST /sweeps: a hyperparameter search over `spec["space"]` of `spec["base"]`."""
        return self._request("POST", "/sweeps", json=spec)

    def sweeps(self, limit: int = 20) -> builtins.list[dict]:
        """GET /sweeps: the caller's `limit` newest sweeps, newest first (as many pages as it takes)."""
        return self._every("/sweeps", most=limit, page_size=100)

    def get_sweep(self, sweep_id: str) -> dict:
        return self._request("GET", f"/sweeps/{_segment(sweep_id)}")

    def trials(self, sweep_id: str) -> builtins.list[dict]:
        """GET /sweeps/{id}/trials: every trial with its parameters, job, status and objective."""
        return self._request("GET", f"/sweeps/{_segment(sweep_id)}/trials")["items"]

    def cancel_sweep(self, sweep_id: str) -> dict:
        return self._request("POST", f"/sweeps/{_segment(sweep_id)}/cancel")

    def wait_sweep(
        self,
        sweep_id: str,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the sweep ends (every trial ended); the final Sweep."""
        return self._poll(lambda: self.get_sweep(sweep_id), f"sweep {sweep_id}", poll_s, timeout_s, on_update)

    @staticmethod
    def _poll(
        fetch: Callable[[], dict],
        what: str,
        poll_s: float,
        timeout_s: float | None,
        on_update: Callable[[dict], None] | None,
    ) -> dict:
        """`fetch()` every `poll_s` seconds until its status is finished; TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            current = fetch()
            if on_update:
                on_update(current)
            if current["status"] in FINISHED:
                return current
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"{what} still {current['status']} after {timeout_s} s")
            time.sleep(poll_s)

    def events(self, job_id: str, last_event_id: str | None = None, *, retries: int = 5) -> Iterator[Event]:
        """The job's server-sent events until its final status (see `Event`).

        A dropped connection is resumed with Last-Event-ID, so no status or epoch is missed or
        repeated; after `retries` failed reconnects in a row the transport error is raised.
        Raises ApiError (e.g. 404) when the server refuses the stream."""
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = last_event_id
            try:
                # The server writes at least every 15 s (a keepalive comment) while the job lives.
                timeout = httpx.Timeout(self.timeout_s, read=max(self.timeout_s, 60.0))
                url = f"/jobs/{_segment(job_id)}/events"
                with self.http.stream("GET", url, headers=headers, timeout=timeout) as response:
                    _raise_for_status(response)
                    for event in parse_sse(response.iter_lines()):
                        failures = 0
                        if event.id is not None:
                            last_event_id = event.id
                        yield event
                        if event.is_final:
                            return
                raise httpx.RemoteProtocolError("the event stream ended before the job did")
            except httpx.TransportError:
                failures += 1
                if failures > retries:
                    raise
                time.sleep(min(0.25 * 2**failures, 5.0))

    def webhooks(self) -> dict:
        """GET /webhooks: the key's default webhook URL and signing secret's prefix."""
        return self._request("GET", "/webhooks")

    def webhook_secret(self) -> dict:
        """POST /webhooks/secret: a new signing secret ({"secret", "prefix", "created_at"}), shown once."""
        return self._request("POST", "/webhooks/secret")

    def set_webhook_url(self, url: str | None) -> dict:
        """POST /webhooks/url (DELETE with None): the key's default webhook URL."""
        if url is None:
            return self._request("DELETE", "/webhooks/url")
        return self._request("POST", "/webhooks/url", json={"url": url})

    def deliveries(self, job_id: str, limit: int = 50) -> builtins.list[dict]:
        """GET /jobs/{id}/deliveries: the job's webhook deliveries, newest first (one page)."""
        return self._request("GET", f"/jobs/{_segment(job_id)}/deliveries", params={"limit": limit})["items"]

    def workers(self) -> dict:
        """GET /workers: the workers (online or not, what each serves) and the queue depths."""
        return self._request("GET", "/workers")

    def metrics(self) -> str:
        """GET /metrics: the Prometheus text format."""
        response = self.http.get("/metrics")
        _raise_for_status(response)
        return response.text

    def upload_code(self, path: Path, *, name: str | None = None, entrypoints: Iterable[str] = ()) -> dict:
        """POST /code: the .py file or .zip at `path` as the body; `entrypoints` (module:function)
        that must be in it. The code's record (201 new, 200 when this key uploaded the same before)."""
        params: list[tuple[str, str]] = [("filename", Path(path).name), *(("entrypoint", e) for e in entrypoints)]
        if name:
            params.append(("name", name))
        return self._request(
            "POST",
            "/code",
            params=params,
            content=Path(path).read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )

    def code(self) -> builtins.list[dict]:
        """GET /code: the key's uploaded code, newest first (every page)."""
        return self._every("/code")

    def get_code(self, code_id: str) -> dict:
        """GET /code/{id}: one of the key's code records (its id, or `code_` and 8+ of its digits)."""
        return self._request("GET", f"/code/{_segment(code_id)}")

    def delete_code(self, code_id: str) -> None:
        response = self.http.delete(f"/code/{_segment(code_id)}")
        _raise_for_status(response)

    def upload_dataset(
        self,
        path: Path,
        *,
        name: str | None = None,
        label_column: str | None = None,
        image_size: str | None = None,
        task: str | None = None,
        format: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> dict:
        """POST /datasets: stream the file at `path` as the body (its name gives the format);
        `on_progress(bytes_sent, total_bytes)` as it goes. The Dataset (201 new, 200 when this
        key uploaded the same content before)."""
        options = {"name": name or Path(path).stem, "label_column": label_column, "image_size": image_size}
        options |= {"task": task, "format": format or _format_of(Path(path).name)}
        total = Path(path).stat().st_size

        def chunks() -> Iterator[bytes]:
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sent += len(chunk)
                    if on_progress:
                        on_progress(sent, total)
                    yield chunk

        return self._request(
            "POST",
            "/datasets",
            params={k: v for k, v in options.items() if v is not None},
            content=chunks(),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(total)},
            timeout=None,
        )

    def datasets(self) -> builtins.list[dict]:
        """GET /datasets: the built-in datasets this deployment has, then the key's own, newest
        first (every page)."""
        return self._every("/datasets")

    def get_dataset(self, dataset_id: str) -> dict:
        return self._request("GET", f"/datasets/{_segment(dataset_id)}")

    def delete_dataset(self, dataset_id: str) -> None:
        response = self.http.delete(f"/datasets/{_segment(dataset_id)}")
        _raise_for_status(response)

    def artifacts(self, job_id: str) -> builtins.list[dict]:
        return self._request("GET", f"/jobs/{_segment(job_id)}/artifacts")

    def download_all(
        self, job_id: str, dest_dir: Path, on_progress: Callable[[str, int, int], None] | None = None
    ) -> builtins.list[Path]:
        """Save every artifact of the job into `dest_dir` (each sha256-checked, as `download`);
        `on_progress(name, bytes_so_far, total_bytes)`. Returns the files, in the listing's order."""
        files = []
        for artifact in self.artifacts(job_id):
            name: str = artifact["name"]

            def progress(done: int, total: int, name: str = name) -> None:
                if on_progress is not None:
                    on_progress(name, done, total)

            files.append(self.download(job_id, name, dest_dir, on_progress=progress))
        return files

    def download(
        self,
        job_id: str,
        name: str,
        dest_dir: Path,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Save one artifact into `dest_dir` and check its sha256 against the listing;
        `on_progress(bytes_so_far, total_bytes)` is called as chunks arrive. The file appears
        only once complete and checked (it is written to `<name>.part` first).

        Raises ApiError for an unknown name and ValueError when the checksum differs."""
        listed = {a["name"]: a for a in self.artifacts(job_id)}
        if name not in listed:
            raise ApiError(404, f"job {job_id} has no artifact named {name!r}; it has {', '.join(listed) or 'none'}")
        dest_dir.mkdir(parents=True, exist_ok=True)
        path = dest_dir / Path(name).name
        partial = path.with_name(path.name + ".part")
        digest, done, total = hashlib.sha256(), 0, listed[name]["size_bytes"]
        try:
            with self.http.stream("GET", f"/jobs/{_segment(job_id)}/artifacts/{_segment(name)}") as response:
                _raise_for_status(response)
                with open(partial, "wb") as f:
                    for chunk in response.iter_bytes(1 << 20):
                        f.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if on_progress:
                            on_progress(done, total)
            if digest.hexdigest() != listed[name]["sha256"]:
                raise ValueError(
                    f"{name}: sha256 {digest.hexdigest()} differs from the listed {listed[name]['sha256']}"
                )
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return path


def _format_of(filename: str) -> str | None:
    """The upload format a file name says (".csv", ".tar.gz", ...), None to let the server detect it."""
    lowered = filename.lower()
    for suffix, name in ((".csv", "csv"), (".parquet", "parquet"), (".pq", "parquet"), (".npz", "npz")):
        if lowered.endswith(suffix):
            return name
    if lowered.endswith((".tar.gz", ".tgz", ".tar")):
        return "idx"
    return None


def _raise_for_status(response: httpx.Response) -> None:
    """ApiError with the API's `detail` for a 4xx or 5xx response (streamed or not)."""
    if response.status_code < 400:
        return
    response.read()
    try:
        body = response.json()
        detail = body.get("detail", response.text) if isinstance(body, dict) else body
    except ValueError:
        detail = response.text
    raise ApiError(response.status_code, detail)
