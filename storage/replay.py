"""Replay iteration: a seekable cursor over a session's steps and a pacer for their spacing."""

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from storage.queries import steps
from storage.store import Store


class StepCursor:
    """Pages through one session's steps in step order from `start`; `seek` moves it."""

    def __init__(
        self, store: Store, session_id: str, start: int = 0, every: int = 1, page: int = 256
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.every = every
        self.page = page
        self._buf: deque[dict[str, Any]] = deque()
        self.seek(start)

    def seek(self, step: int) -> None:
        self._pos = step
        self._buf.clear()
        self._done = False

    @property
    def needs_fill(self) -> bool:
        """True when the next `pop` would need a database read (`fill`) first."""
        return not self._buf and not self._done

    def fill(self) -> None:
        """Read the next page (blocking: run it off an event loop)."""
        rows = steps(
            self.store, self.session_id, start=self._pos, limit=self.page, every=self.every
        )
        self._buf.extend(rows)
        self._done = len(rows) < self.page
        if rows:
            self._pos = rows[-1]["step"] + 1

    def pop(self) -> dict[str, Any] | None:
        """The next step, or None at the end (after `fill` when `needs_fill`)."""
        return self._buf.popleft() if self._buf else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            if self.needs_fill:
                self.fill()
            record = self.pop()
            if record is None:
                return
            yield record


class Pacer:
    """Spacing of replayed steps: the recorded gaps divided by `speed` (0 = no waiting).

    The first step after a (re)start is due at once; later ones relative to it.
    """

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self._anchor: tuple[float, float] | None = None

    def rebase(self) -> None:
        self._anchor = None

    def set_speed(self, speed: float) -> None:
        self.speed = speed
        self.rebase()

    def delay(self, t: float, now: float) -> float:
        """Seconds to wait before sending the step recorded at `t` (wall clock `now`)."""
        if self.speed <= 0:
            return 0.0
        if self._anchor is None:
            self._anchor = (t, now)
            return 0.0
        t0, wall0 = self._anchor
        return max(0.0, wall0 + (t - t0) / self.speed - now)


def replay(
    store: Store,
    session_id: str,
    speed: float = 1.0,
    start: int = 0,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """The session's steps from `start`, each yielded when due at `speed` (blocking sleeps)."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    pacer = Pacer(speed)
    for record in StepCursor(store, session_id, start):
        wait = pacer.delay(record["t"], clock())
        if wait > 0:
            sleep(wait)
        yield record
