"""What Live pages ask of the server, without a browser: each page's telemetry websocket read
as fast as it comes, and its reports polled at their intervals (the same URLs and intervals
as the page: dashboard/reports.py). The dashboard benchmark runs it beside the real pages,
to tell the server's cost of serving them from the browser's cost of drawing them on the
same cores."""

from __future__ import annotations

import threading
import time

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from dashboard import reports
from dashboard.client import ws_url

RECV_TIMEOUT_S = 0.5  # how often a reader looks whether to stop


class PageTraffic:
    """`pages` pages' traffic to the server at `url`, from `with` to its end."""

    def __init__(self, url: str, pages: int) -> None:
        self.url = url
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=target, daemon=True)
            for _ in range(pages)
            for target in (self._telemetry, self._reports)
        ]
        self.frames = 0
        self.answers = 0

    def __enter__(self) -> PageTraffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _telemetry(self) -> None:
        with connect(ws_url(self.url), max_size=None) as ws:
            while not self.stop.is_set():
                try:
                    ws.recv(timeout=RECV_TIMEOUT_S)
                except TimeoutError:
                    continue
                except ConnectionClosed:
                    return
                self.frames += 1

    def _reports(self) -> None:
        specs = [reports.why_slow_live(self.url), reports.autopilot(self.url)]
        due = [time.monotonic()] * len(specs)
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                now = time.monotonic()
                for i, spec in enumerate(specs):
                    if now >= due[i]:
                        http.get(spec["url"]).raise_for_status()
                        self.answers += 1
                        due[i] = now + spec["every_s"]
                self.stop.wait(max(0.0, min(due) - time.monotonic()))
