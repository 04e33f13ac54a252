"""A background thread that asks the server for something every few seconds and keeps the
latest answer, so a page reads it without waiting on the server."""

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Poller(Generic[T]):
    """Calls `fetch` at once and then every `every_s` seconds; `read()` gives its last answer
    (None before the first). It stops by itself once unread for `idle_s` (a closed browser
    tab must not keep the server busy), and `alive` turns False."""

    def __init__(
        self, fetch: Callable[[], T], every_s: float, idle_s: float, name: str = "poller"
    ) -> None:
        self.fetch = fetch
        self.every_s = every_s
        self.idle_s = idle_s
        self.answers = 0
        self._latest: T | None = None
        self._read_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Poller[T]":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def read(self) -> T | None:
        self._read_at = time.monotonic()
        return self._latest

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() - self._read_at < self.idle_s:
            self._latest = self.fetch()
            self.answers += 1
            self._stop.wait(self.every_s)
