"""The live cost model's training rows over the engine's whole life, in bounded memory: the
newest RECENT rows, and of the shapes that have left those, the newest PER_SHAPE rows each.
Recent steps alone forget within seconds what a shape costs (on a fast machine 512 steps
are 3 s), so the first long prompts after a phase of short ones were predicted from a fit
that had never seen a long chunk's attention, and under-predicted 2.5x."""

from collections import deque
from typing import Any

import numpy as np

from tuning.twin.cost_model import knobs_after, shape_key, training_row

RECENT = 4096  # rows of the latest steps, each a few hundred bytes
PER_SHAPE = 16  # rows kept of each older shape
MAX_SHAPES = 512  # older shapes kept, the least recently seen dropped first


class FitRows:
    """Fed every step in order (`add`); `rows` gives what `cost_model.fit_rows` fits, stacked."""

    LIMIT = RECENT + PER_SHAPE * MAX_SHAPES  # rows kept at most

    def __init__(self, knobs: dict[str, Any]) -> None:
        self.knobs = dict(knobs)  # in force at the last step added
        self.prev: dict[str, Any] | None = None
        self.recent: deque[np.ndarray] = deque()
        self.older: dict[tuple[int, ...], deque[np.ndarray]] = {}

    def add(self, step: dict[str, Any]) -> None:
        self.knobs = knobs_after(self.knobs, step)
        row = None if self.prev is None else training_row(self.prev, step, self.knobs)
        self.prev = step
        if row is not None:
            self._keep(row)

    def seed(self, rows: list[np.ndarray]) -> None:
        """Take `rows` (another FitRows' `rows()`: an earlier run of this engine) as if they were
        this one's first, so that its own steps supersede them as they come."""
        for row in rows:
            self._keep(row)

    def _keep(self, row: np.ndarray) -> None:
        self.recent.append(row)
        if len(self.recent) > RECENT:
            self._keep_older(self.recent.popleft())

    def _keep_older(self, row: np.ndarray) -> None:
        shape = shape_key(row)
        kept = self.older.pop(shape, None) or deque(maxlen=PER_SHAPE)
        kept.append(row)
        self.older[shape] = kept  # dicts keep insertion order: the least recently seen first
        if len(self.older) > MAX_SHAPES:
            del self.older[next(iter(self.older))]

    def __len__(self) -> int:
        return len(self.recent) + sum(len(kept) for kept in self.older.values())

    def rows(self) -> list[np.ndarray]:
        """The older shapes' rows, then the recent ones: a copy cheap enough for the event
        loop; `cost_model.stack` makes them Rows."""
        return [row for kept in self.older.values() for row in kept] + list(self.recent)
