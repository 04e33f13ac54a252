"""A snapshot of the engine's queues and knobs, taken on the engine thread (the what-if twin
starts its simulation from it)."""

import time
from dataclasses import dataclass

from engine.engine import LLMEngine
from engine.knobs import Knobs
from engine.request import Request
from engine.telemetry import KnobChange


@dataclass(frozen=True)
class QueuedRequest:
    """A request still in the engine: where it is, when it arrived, how long it is."""

    state: str  # waiting | running | swapped
    arrival: float
    prompt_len: int
    generated: int  # output tokens so far
    max_tokens: int
    priority: int


@dataclass(frozen=True)
class QueueSnapshot:
    """The queues at one step boundary, the knobs in force then and the applied knob changes
    newer than the version asked for."""

    t: float
    knobs: Knobs
    knobs_version: int  # the applied version
    knob_changes: list[KnobChange]
    requests: list[QueuedRequest]
    cpu_s: float = 0.0  # the engine thread's CPU time spent reading it, for its reader's bill

    def arrivals(self, started: bool) -> list[float]:
        """The arrival times of the requests with a first token (`started`) or without one."""
        return [q.arrival for q in self.requests if bool(q.generated) == started]


def queue_snapshot(engine: LLMEngine, since_version: int = 0) -> QueueSnapshot:
    """Read the engine's state; call it on the engine thread only (it changes nothing)."""
    cpu0 = time.thread_time()
    sch = engine.scheduler
    queued = [
        _queued(state, req)
        for state, reqs in (
            ("running", sch.running),
            ("swapped", sch.swapped),
            ("waiting", sch.waiting),
        )
        for req in reqs
    ]
    return QueueSnapshot(
        t=time.time(),
        knobs=engine.knobs,
        knobs_version=engine.applied_knobs_version,
        knob_changes=engine.knob_versions.since(since_version),
        requests=queued,
        cpu_s=time.thread_time() - cpu0,
    )


def _queued(state: str, req: Request) -> QueuedRequest:
    return QueuedRequest(
        state,
        req.arrival,
        req.num_prompt_tokens,
        len(req.output_token_ids),
        req.params.max_tokens,
        req.params.priority,
    )
