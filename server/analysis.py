"""A child process for the server's simulations, so that they never hold the server's GIL.

The engine thread lets the GIL go at every torch operation and must take it back after;
while another thread of the same process runs Python, each of those takes waits out the
switch interval (5 ms). A decode step that took 22 ms took 2.9 s beside a busy Python
thread (`benchmarks/speed/gil.py`). A simulation (a what-if, the scorecard's prediction, the
autopilot's twin) is such a thread for seconds at a time, so they run here instead, at low
priority, in a process started on first use.
"""

import importlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

from engine.gc_heap import freeze_heap

T = TypeVar("T")
NICE = 10  # as the autopilot's thread was: the engine first, but not starved
PARENT_CHECK_S = 1.0


def _exit_with(parent: int) -> None:
    """End this worker once `parent` is gone: a pool's worker waits on a pipe it holds both
    ends of, so a server killed outright left it running forever."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _start(preload: tuple[str, ...]) -> None:
    """Import at normal priority, then lower it: at nice 10 the imports (torch among them)
    took 40 s and more while the engine and another process kept both cores busy."""
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    for module in preload:
        importlib.import_module(module)
    # what the imports made lives as long as the worker: a full collection walked it (0.1 s)
    # every few simulations, a tenth of the autopilot's CPU in replays
    freeze_heap()
    os.nice(NICE)


class Analysis:
    """One worker process, started on the first `submit` (spawned: forking a process that
    runs threads and OpenMP is unsafe), with the `preload` modules (those of the functions
    it will run) imported first."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self.preload = preload
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> "Future[T]":
        """`fn(*args)` in the worker; `fn` and the arguments must pickle."""
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                1, mp_context=spawn, initializer=_start, initargs=(self.preload,)
            )
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        """Drop what has not started, end the worker whatever it is running, and wait for the
        pool to see it end (without the wait, the interpreter's exit wrote a traceback from
        the pool's closed pipe). A simulation in flight has no reader once the server stops:
        waiting for it held a server's stop for 2-10 s."""
        if self._pool is not None:
            # ProcessPoolExecutor has no public way to end a busy worker before Python 3.14
            for worker in list(self._pool._processes.values()):
                worker.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
