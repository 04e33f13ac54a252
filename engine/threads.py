"""The engine thread's intra-op thread count: left alone, fixed, or adapted to the free cores.

OpenMP threads wait on each other at every parallel region, so one thread that has to share
its core with another process slows the whole step (a grouped GEMM took 190 ms at 2 threads
with the second core taken, 14 ms at 1). `auto` measures, once a second, how much CPU other
processes used (/proc/stat's busy time less this process's own) and runs on the cores left.
"""

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Threads = int | Literal["auto"] | None  # None: torch's setting as the caller left it
INTERVAL_S = 1.0
# others' use (in cores) that gives up a thread, and the lower use that takes one back:
# the gap keeps a steady neighbour from flipping the count every interval
DOWN_AT, UP_AT = 0.4, 0.25


def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0))


def busy_seconds() -> float | None:
    """CPU seconds every core has spent busy since boot (None without /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    wall: float
    busy: float
    own: float


def threads_for(others: float, current: int, cores: int) -> int:
    """The thread count for `others` cores' worth of other processes' load."""
    down = cores - max(0, math.ceil(others - DOWN_AT))
    up = cores - max(0, math.ceil(others - UP_AT))
    if down < current:
        return max(1, down)
    return max(current, min(up, cores))


class ThreadGovernor:
    """Sets the calling thread's torch thread count; call `tick` from the engine thread each
    step (OpenMP's count is per thread)."""

    def __init__(
        self,
        threads: Threads,
        cores: int | None = None,
        busy: Callable[[], float | None] = busy_seconds,
        clock: Callable[[], float] = time.monotonic,
        own: Callable[[], float] = time.process_time,
    ) -> None:
        self.mode = threads
        self.cores = cores or usable_cores()
        self._busy, self._clock, self._own = busy, clock, own
        self.current = threads if isinstance(threads, int) else self.cores
        self._last: Sample | None = None

    def tick(self) -> int | None:
        """Apply the count for now; returns it (None when left to the caller)."""
        if self.mode is None:
            return None
        if self.mode == "auto":
            self._adapt()
        if torch.get_num_threads() != self.current:
            torch.set_num_threads(self.current)
        return self.current

    def _adapt(self) -> None:
        now = self._clock()
        if self._last is not None and now - self._last.wall < INTERVAL_S:
            return
        busy = self._busy()
        if busy is None:
            return
        sample = Sample(now, busy, self._own())
        if self._last is not None:
            last = self._last
            others = ((busy - last.busy) - (sample.own - last.own)) / (now - last.wall)
            self.current = threads_for(others, self.current, self.cores)
        self._last = sample
