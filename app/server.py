"""How the API is served: uvicorn, with bounds on what a client may hold before the app answers.

uvicorn alone bounds nothing of this: httptools takes headers of any size and number, and the
keep-alive timer is reset by every byte, so a client sending one header line every few seconds,
or declaring a body it never sends, holds its connection (and its buffers) forever. Here the
API runs on uvicorn's h11 protocol, extended with (settings of app/config.py):

- a request head (request line and headers) of more than `max_header_bytes` bytes or more than
  `max_headers` header lines is answered 431 and the connection closed; an unfinished head is
  refused as soon as it passes `max_header_bytes`, so it holds at most that plus one read;
- a head not whole `header_timeout_s` after the connection opened, or after its previous
  response ended, has its connection closed;
- a body not whole `body_timeout_s` after its head is answered 408 (or, once the answer has
  begun, its connection closed); an upload (POST /datasets, up to GBs) instead gets
  `body_timeout_s` between two reads. Time the app is not reading does not count;
- a process keeps at most `max_connections` open connections: one more is answered 503 and closed.

These hold for `trainhub serve` (and so `trainhub up` and the compose file), not for a bare
`uvicorn app.main:app`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol
from uvicorn.server import ServerState

from app.config import get_settings
from app.middleware import is_upload


class BoundedConnection(h11.Connection):
    """h11's server side, refusing (RemoteProtocolError with error_status_hint 431) a request head
    over `max_header_bytes` or with more than `max_headers` header lines. h11 itself bounds only
    what it buffers of an unfinished head; a whole one that came in a single read passes it.
    `refusal` keeps the last error raised, so the protocol can answer its status."""

    def __init__(self, max_header_bytes: int, max_headers: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        too_large = (
            f"request head larger than this server's limit of {self.max_header_bytes:,} bytes "
            "(max_header_bytes, set by TRAINHUB_MAX_HEADER_BYTES)"
        )
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            # 431 is h11's "Receive buffer too long": an unfinished head past the limit
            self.refusal = h11.RemoteProtocolError(too_large, 431) if exc.error_status_hint == 431 else exc
            raise
        if isinstance(event, h11.Request):
            head = len(event.method) + len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if len(event.headers) > self.max_headers:
                self.refusal = h11.RemoteProtocolError(
                    f"{len(event.headers):,} header lines, more than this server's limit of {self.max_headers} "
                    "(max_headers, set by TRAINHUB_MAX_HEADERS)",
                    431,
                )
                raise self.refusal
            if head > self.max_header_bytes:
                self.refusal = h11.RemoteProtocolError(too_large, 431)
                raise self.refusal
        return event


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of this module's docstring. A connection owes,
    at any time, either its request head (h11 says their state is IDLE) or its body (SEND_BODY),
    or nothing while the app answers; one timer watches what it owes."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = get_settings()
        self.conn: BoundedConnection = BoundedConnection(settings.max_header_bytes, settings.max_headers)
        self.max_connections = settings.max_connections
        self.timeouts = {"head": settings.header_timeout_s, "body": settings.body_timeout_s}
        self.owed: str | None = None  # "head", "body" or None
        self.upload = False  # whether the body owed is an upload's (then its deadline is per read)
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.logger.warning("Refused a connection: %d open (TRAINHUB_MAX_CONNECTIONS)", len(self.connections) - 1)
            self.refuse(503, "this server has as many open connections as it takes; retry shortly")
            return
        self.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.watch()  # (the transport is closing: cancels the timer)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.watch(received=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.watch()  # a kept-alive connection now owes its next head

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to any h11 RemoteProtocolError: answer that error's own status and text
        error = self.conn.refusal
        if error is None:
            self.refuse(400, msg)
        else:
            self.refuse(error.error_status_hint, str(error))

    def watch(self, received: bool = False) -> None:
        """(Re)start the timer when what the client owes changes, and for an upload's body at
        each read (`received`); stop it when the client owes nothing or the connection closes."""
        state = self.conn.their_state
        owed = None if self.transport.is_closing() else {h11.IDLE: "head", h11.SEND_BODY: "body"}.get(state)
        # (an upload's body already answered, e.g. 401, gets no more time per read: only what is left)
        per_read = self.upload and not self.cycle.response_complete
        if owed == self.owed and not (owed == "body" and received and per_read):
            return
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if owed == "body" and owed != self.owed:
            self.upload = is_upload(self.scope)
        self.owed = owed
        if owed is not None:
            self.deadline = self.loop.call_later(self.timeouts[owed], self.expired)

    def expired(self) -> None:
        """The client did not send what it owes in time: close (408 first for a body, when no
        answer has begun)."""
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.owed == "head":
            self.transport.close()
            return
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            # the app has not asked for more of the body yet: the client is not late
            self.deadline = self.loop.call_later(self.timeouts["body"], self.expired)
            return
        if self.cycle.response_started:
            self.transport.close()
        else:
            self.refuse(408, f"request body not received within {self.timeouts['body']:g} s (TRAINHUB_BODY_TIMEOUT_S)")
        # the app's receive() now says the client left, and anything it sends is dropped
        self.cycle.response_complete = self.cycle.disconnected = True
        self.cycle.message_event.set()

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` with `message` as text/plain, then close the connection."""
        body = message.encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-content-type-options", b"nosniff"),
        ]
        response = h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status])
        try:
            for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass  # an answer had already begun: closing is all that is left
        self.transport.close()


def run(host: str, port: int, workers: int = 1) -> None:
    """Serve app.main:app on host:port with `workers` processes, each under this module's bounds."""
    settings = get_settings()
    uvicorn.run(
        "app.main:app",
        host=host,
        port=port,
        workers=workers,
        http=BoundedH11Protocol,
        ws="none",  # the API has no WebSocket route, and an upgraded connection would escape the bounds
        # Open event streams and downloads would hold a graceful shutdown forever: they get
        # shutdown_timeout_s to end, then are cancelled (a client resumes with Last-Event-ID or Range).
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )
