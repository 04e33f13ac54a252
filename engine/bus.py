"""Telemetry bus: fans each step's record out to subscribers without ever blocking the engine."""

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Subscription:
    """A bounded per-subscriber buffer; when full, the oldest record is dropped and counted.

    `every` keeps only records whose step is a multiple of it (decimation before buffering,
    so drops count only records the subscriber wanted). `notify` is called when the buffer
    goes from empty to non-empty, so a consumer that drains everything needs one wake-up.
    """

    def __init__(
        self, maxlen: int, notify: Callable[[], object] | None = None, every: int = 1
    ) -> None:
        if maxlen < 1 or every < 1:
            raise ValueError("maxlen and every must be at least 1")
        self.buffer: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.dropped = 0
        self.total_dropped = 0
        self.notify = notify
        self.every = every
        self._lock = threading.Lock()

    def put(self, record: dict[str, Any]) -> None:
        if self.every > 1 and record.get("step", 0) % self.every:
            return
        with self._lock:
            was_empty = not self.buffer
            if len(self.buffer) == self.buffer.maxlen:
                self.dropped += 1
                self.total_dropped += 1
            self.buffer.append(record)
        if was_empty and self.notify is not None:
            self.notify()

    def drain(self) -> tuple[list[dict[str, Any]], int]:
        """Everything buffered so far and how many records were dropped since the last drain."""
        with self._lock:
            records, dropped = list(self.buffer), self.dropped
            self.buffer.clear()
            self.dropped = 0
        return records, dropped


class TelemetryBus:
    """Publishes each record to every subscription; a failing subscriber is removed."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()

    def subscribe(
        self, maxlen: int = 256, notify: Callable[[], object] | None = None, every: int = 1
    ) -> Subscription:
        sub = Subscription(maxlen, notify, every)
        with self._lock:
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def num_subscribers(self) -> int:
        return len(self._subs)

    def publish(self, record: dict[str, Any]) -> None:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            try:
                sub.put(record)
            except Exception:  # a broken consumer must not stop the engine
                log.exception("telemetry subscriber failed; unsubscribing it")
                self.unsubscribe(sub)
