"""A webhook receiver on loopback, for tests: records every request it gets; the first `down`
requests fail (the first drops the connection unanswered, as a receiver that crashed, the
others are answered 503), the rest are answered 204."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int | None  # None: the connection was dropped

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Receiver:
    def __init__(self, down: int = 0, path: str = "/hooks/trainhub") -> None:
        self.down = down
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    failing = len(receiver.received) < receiver.down
                    first = not receiver.received
                    answer = None if failing and first else 503 if failing else 204
                    receiver.received.append(Received(dict(self.headers.items()), body, answer))
                if answer is None:
                    self.close_connection = True
                    return
                self.send_response(answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[Received]:
        """The requests it answered 2xx, in the order they came."""
        with self.lock:
            return [r for r in self.received if r.answered == 204]
