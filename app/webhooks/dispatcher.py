"""Sends the due webhook deliveries: an asyncio task in each API process (started by app/main.py's
lifespan, with TRAINHUB_WEBHOOK_DISPATCH on).

Why there: deliveries must never run in an API request (a slow receiver would hold it) nor in a
worker's training loop (a slow receiver would slow training, and a worker busy for a week would
leave its jobs' changes unsent). The API process is the one that is always up where the outbox
is, in every deployment (the embedded stack is one API process and one worker), and it already
runs an event loop, where many slow receivers cost sockets, not threads. Several API processes
share the work safely: each claims rows with `FOR UPDATE SKIP LOCKED` and a lease
(app/webhooks/outbox.py), so no delivery is sent twice while its sender lives. The database calls
(short, and sync like the rest of the app) run in a thread each.

Each pass claims as many due deliveries as there is room for (webhook_concurrency in flight) and
sends each on its own task; when nothing is due it sleeps webhook_poll_s. A request: the host's
addresses checked again (app/webhooks/urls.py) and the checked one connected to, a timeout of
webhook_timeout_s for each of connect, write and read, redirects never followed, the answer's
body not read. Any 2xx answer delivers it; anything else is tried again later (outbox.record)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import httpx

from app.config import Settings, get_settings
from app.db import session_scope
from app.webhooks import outbox, signing, urls
from app.webhooks.schemas import DeliveryStatus

log = logging.getLogger(__name__)

USER_AGENT = "trainhub-webhooks/1"


def _claim(room: int, settings: Settings) -> list[outbox.Claimed]:
    with session_scope() as session:
        return outbox.claim(session, room, settings)


def _record(claimed: outbox.Claimed, response_status: int | None, error: str | None, settings: Settings) -> None:
    with session_scope() as session:
        status = outbox.record(session, claimed, response_status, error, settings)
    if status == DeliveryStatus.FAILED:
        log.warning("webhook delivery %s to %s failed for good: %s", claimed.id, claimed.url, error)


def headers(claimed: outbox.Claimed, secret: str) -> dict[str, str]:
    """The headers of an attempt of `claimed`, signed now with `secret`."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Trainhub-Event": claimed.event,
        "Trainhub-Delivery": claimed.id,
        signing.HEADER: signing.header(secret, claimed.body),
    }


async def attempt(
    client: httpx.AsyncClient, claimed: outbox.Claimed, settings: Settings
) -> tuple[int | None, str | None]:
    """POST `claimed` once; (the answer's status or None, why it failed or None when delivered)."""
    if claimed.secret is None:
        return None, "the key has no webhook signing secret (POST /webhooks/secret makes one)"
    try:
        target = await asyncio.to_thread(urls.check, claimed.url, settings.webhook_allow_private)
        url, host, extensions = target.pinned()
        signed = {**headers(claimed, claimed.secret), **host}
        async with client.stream("POST", url, content=claimed.body, headers=signed, extensions=extensions) as response:
            code = response.status_code
    except urls.RefusedUrl as exc:
        return None, str(exc)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}".rstrip(": ")
    if 200 <= code < 300:
        return code, None
    if 300 <= code < 400:
        return code, f"answered {code}: redirects are not followed; give the final URL"
    return code, f"answered {code}"


async def _deliver(client: httpx.AsyncClient, claimed: outbox.Claimed, settings: Settings) -> None:
    try:
        response_status, error = await attempt(client, claimed, settings)
    except Exception:  # a bug must not stop the other deliveries; the attempt counts as failed
        log.exception("webhook delivery %s: unexpected error", claimed.id)
        response_status, error = None, "internal error while sending; it is tried again"
    try:
        await asyncio.to_thread(_record, claimed, response_status, error, settings)
    except Exception:  # e.g. the database is away: the lease runs out and it is sent again
        log.warning("webhook delivery %s: outcome not recorded; it is sent again", claimed.id, exc_info=True)


def client(settings: Settings) -> httpx.AsyncClient:
    """The HTTP client of deliveries: timeouts on every phase, no redirects, no proxy from the
    environment (a request goes straight to the address that was checked)."""
    timeout = httpx.Timeout(settings.webhook_timeout_s)
    limits = httpx.Limits(max_connections=settings.webhook_concurrency, max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False)


async def run(settings: Settings) -> None:
    """Send due deliveries until cancelled (the module docstring says how)."""
    in_flight: set[asyncio.Task] = set()
    async with client(settings) as http:
        try:
            while True:
                claimed: list[outbox.Claimed] = []
                if room := settings.webhook_concurrency - len(in_flight):
                    try:
                        claimed = await asyncio.to_thread(_claim, room, settings)
                    except Exception:  # the database is away: try again at the next pass
                        log.warning("webhooks: could not read the outbox", exc_info=True)
                for one in claimed:
                    task = asyncio.create_task(_deliver(http, one, settings))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                if in_flight:
                    await asyncio.wait(in_flight, timeout=settings.webhook_poll_s, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(settings.webhook_poll_s)
        finally:
            for task in in_flight:
                task.cancel()  # their leases run out; they are sent again
            with suppress(asyncio.CancelledError):
                await asyncio.gather(*in_flight, return_exceptions=True)


@asynccontextmanager
async def running(settings: Settings | None = None) -> AsyncIterator[None]:
    """Run the dispatcher in the background for the body of the `async with` (not at all with
    webhook_dispatch off)."""
    s = settings or get_settings()
    if not s.webhook_dispatch:
        yield
        return
    task = asyncio.create_task(run(s), name="webhooks")
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
