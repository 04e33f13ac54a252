"""A step from its plan to its record (`Launched`), the thread its device work runs on with
overlap (`ComputeThread`), and its durations: how much host time it had and how much of that
ran behind a forward pass."""

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from engine.ep.placement import Placement
from engine.request import Request
from engine.scheduler import SchedulerOutput
from engine.step_records import Executed, StepPlan
from engine.step_telemetry import durations
from engine.telemetry import Durations, KnobChange


@dataclass
class Launched:
    """A step from its plan to its record: what was scheduled, the requests that sample in it,
    the knob changes it applied, and its device work (`job`: a future while it runs on the
    compute thread)."""

    sched: SchedulerOutput
    plan: StepPlan | None
    sampling: list[Request]
    applied: list[KnobChange]
    knobs_version: int
    arrived: int
    during: "Launched | None"  # the step that ran while this one was planned
    placement: Placement
    t0: float  # perf_counter: planning began
    t1: float  # scheduled
    planned: float
    job: "Future[Executed] | Executed | None" = None
    launched_at: float | None = None

    def wait(self) -> Executed | None:
        if isinstance(self.job, Future):
            self.job = self.job.result()
        return self.job


class ComputeThread:
    """The one thread that runs steps' device work with overlap, started by the first
    overlapped step (torch ops release the GIL, so the engine thread plans meanwhile)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def submit(
        self,
        execute: Callable[[StepPlan, torch.Tensor | None], Executed],
        plan: StepPlan,
        previous: torch.Tensor | None,
    ) -> "Future[Executed]":
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="moescope-compute")
        threads = torch.get_num_threads()  # this thread's, as the governor set it
        return self._pool.submit(self._execute, execute, plan, previous, threads)

    @staticmethod
    def _execute(
        execute: Callable[[StepPlan, torch.Tensor | None], Executed],
        plan: StepPlan,
        previous: torch.Tensor | None,
        threads: int,
    ) -> Executed:
        """The compute thread's part of a step, with the engine thread's torch thread count
        (OpenMP's count is per thread: a new thread would use every core)."""
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return execute(plan, previous)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def step_durations(
    launched: Launched, executed: Executed | None, after: Launched | None, t3: float, t4: float
) -> Durations:
    """The step's times; host work counts as hidden where a forward pass ran meanwhile:
    its plan during the step before, its update (`t3` to `t4`) during the step after
    (`after`, launched before this one's update)."""
    forward = executed.seconds if executed is not None else 0.0
    host = (launched.planned - launched.t0) + (t4 - t3)
    hidden = 0.0
    before = launched.during
    if before is not None and isinstance(before.job, Executed):
        hidden += _overlap(launched.t0, launched.planned, before.job.started, before.job.ended)
    if after is not None and after.job is not None:
        job = after.job
        if isinstance(job, Executed):
            hidden += _overlap(t3, t4, job.started, job.ended)
        elif after.launched_at is not None:  # still running
            hidden += _overlap(t3, t4, after.launched_at, t4)
    seconds = [
        launched.t1 - launched.t0,
        launched.planned - launched.t1,
        forward,
        t4 - t3,
        time.perf_counter() - launched.t0,
    ]
    moe = executed.result.moe_seconds if executed and executed.result else 0.0
    return durations(seconds, moe, host, hidden)
