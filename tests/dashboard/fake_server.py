"""A small HTTP server with canned JSON answers, for the dashboard's routes that the test
server does not have; it records the requests it was asked."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class FakeServer:
    """`routes` maps a path to (status, JSON body); `asked` holds (path, query) per GET."""

    routes: dict[str, tuple[int, Any]]
    asked: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    url: str = ""

    def queries(self, path: str) -> list[dict[str, list[str]]]:
        return [query for asked, query in self.asked if asked == path]


def _handler(fake: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            parts = urlsplit(self.path)
            fake.asked.append((parts.path, parse_qs(parts.query)))
            status, body = fake.routes.get(parts.path, (404, {"detail": "Not Found"}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
            pass  # quiet test output

    return Handler


@contextmanager
def fake_server(routes: dict[str, tuple[int, Any]]) -> Iterator[FakeServer]:
    fake = FakeServer(routes)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
