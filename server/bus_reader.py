"""Reading the engine loop's step bus and request bus together, on the event loop."""

import asyncio
from typing import Any

from engine.bus import Subscription
from engine.loop import EngineLoop

STEP_BUFFER = 8192  # step records held between two drains
REQUEST_BUFFER = 65536  # ended requests held between two drains


class BusReader:
    """Subscribes to both buses; `drain` (a subclass's) folds in what they hold, every
    interval while `run` runs, and whenever a caller needs it up to date."""

    def __init__(self, engine_loop: EngineLoop) -> None:
        self.engine_loop = engine_loop
        self._subs: tuple[Subscription, Subscription] | None = None

    def subscribe(self) -> None:
        loop = self.engine_loop
        self._subs = (loop.bus.subscribe(STEP_BUFFER), loop.requests.subscribe(REQUEST_BUFFER))

    def take(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """Steps and ended requests since the last call, and how many records were dropped."""
        if self._subs is None:
            return [], [], 0
        steps, dropped = self._subs[0].drain()
        ended, lost = self._subs[1].drain()
        return steps, ended, dropped + lost

    def drain(self) -> None:
        raise NotImplementedError

    async def run(self, interval_s: float) -> None:
        """Drain every `interval_s` seconds until cancelled, then stop listening."""
        if self._subs is None:
            self.subscribe()
        try:
            while True:
                await asyncio.sleep(interval_s)
                self.drain()
        finally:
            if self._subs is not None:
                self.engine_loop.bus.unsubscribe(self._subs[0])
                self.engine_loop.requests.unsubscribe(self._subs[1])
                self._subs = None
