"""Rolling statistics updated one step at a time (each update costs O(window), not O(steps))."""

import bisect
import math
from collections import deque

import numpy as np

from stats import ranked_percentile


class RollingPercentiles:
    """p50 and p99 (`stats.percentile`) of the last `window` values, kept sorted as values come
    and go."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque()
        self.window = window
        self.ranked: list[float] = []

    def add(self, values: list[float]) -> tuple[float, float]:
        """Take this step's values; the percentiles after it (NaN before any value)."""
        for v in values:
            self.values.append(v)
            bisect.insort(self.ranked, v)
            if len(self.values) > self.window:
                del self.ranked[bisect.bisect_left(self.ranked, self.values.popleft())]
        if not self.ranked:
            return math.nan, math.nan
        return ranked_percentile(self.ranked, 50), ranked_percentile(self.ranked, 99)


class RollingRate:
    """Per-second rates of some counts over the last `window` steps (by their end times)."""

    def __init__(self, window: int, width: int) -> None:
        self.entries: deque[tuple[float, np.ndarray]] = deque()
        self.window = window
        self.total = np.zeros(width)

    def add(self, t: float, counts: np.ndarray) -> np.ndarray:
        """This step's time and counts; the counts of the steps after the window's first,
        divided by the time since it (NaN while that span is 0)."""
        self.entries.append((t, counts))
        self.total = self.total + counts
        if len(self.entries) > self.window + 1:
            self.total = self.total - self.entries.popleft()[1]
        t0, first = self.entries[0]
        span = t - t0
        if span <= 0:
            return np.full(len(counts), math.nan)
        return (self.total - first) / span
