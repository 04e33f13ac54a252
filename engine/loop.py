"""The engine loop: one thread that steps the engine and talks to the rest through queues."""

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from engine.bus import TelemetryBus
from engine.config import Knobs
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

OutputCallback = Callable[[RequestOutput], None]


@dataclass
class _Add:
    token_ids: list[int]
    params: SamplingParams
    request_id: str
    arrival: float
    on_output: OutputCallback
    stop: tuple[str, ...]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _KnobUpdate:
    changes: dict[str, Any]
    origin: str
    future: "Future[int]"


@dataclass
class _Rebalance:
    window: int
    replicas: int
    origin: str
    future: "Future[dict[str, Any]]"


Command = _Add | _Abort | _KnobUpdate | _Rebalance


@dataclass
class _Stream:
    """Delivery state of one request: its callback, stop strings and how much text is settled.

    It also keeps what the request's lifecycle record needs (arrival, lengths, TTFT).
    """

    on_output: OutputCallback
    stop: tuple[str, ...]
    arrival: float
    prompt_len: int
    max_tokens: int
    settled: int = 0
    output_len: int = 0
    ttft_s: float | None = None
    preemptions: int = 0


class EngineDead(RuntimeError):
    """The engine thread stopped with an error; no more requests are accepted."""


class EngineLoop:
    """Runs schedule -> forward -> sample -> publish on its own thread.

    Callers submit, abort and change knobs through a queue drained at each step boundary;
    outputs go back through per-request callbacks and telemetry through the bus, so a slow
    consumer never stalls a step. `requests` is a second bus with one record per request when
    it ends (finished, aborted or failed): id, arrival, prompt/output lengths, max_tokens,
    TTFT, finish reason, preemptions. The text of a delivered output only ever grows: text that
    may still change (an incomplete UTF-8 sequence, a possible start of a stop string) is
    held back until the request finishes.
    """

    def __init__(self, engine: LLMEngine, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.bus = TelemetryBus()
        self.requests = TelemetryBus()
        self.idle_wait_s = idle_wait_s
        self.error: str | None = None
        self.knobs: Knobs = engine.knobs
        self.steps = 0
        self.busy_s = 0.0
        self.busy_cpu_s = 0.0
        self.last_step_t = 0.0
        self.started_t = 0.0
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._step_now = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moescope-engine", daemon=True)
        self._ids = 0
        self._ids_lock = threading.Lock()

    # lifecycle

    def start(self) -> None:
        """Start the engine thread (once; later calls do nothing)."""
        if not self._thread.is_alive() and not self._stop.is_set() and self.error is None:
            self.started_t = time.time()
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread, then the engine's other expert-parallel ranks."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.engine.close()

    @property
    def alive(self) -> bool:
        return (
            self._thread.is_alive()
            and self.error is None
            and not self._stop.is_set()
            and self.engine.failure is None
        )

    def _check_alive(self) -> None:
        if not self.alive:
            raise EngineDead(self.error or self.engine.failure or "engine loop is not running")

    # calls from other threads

    def _new_id(self) -> str:
        with self._ids_lock:
            self._ids += 1
            return f"cmpl-{self.engine.session}-{self._ids}"

    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        stop: Sequence[str] = (),
    ) -> str:
        """Validate now (ValueError on bad input), queue for the next step; returns the id.

        `on_output` is called on the engine thread with every new output; it must be quick.
        `stop` strings end the request (finish_reason "stop") with the text cut before them.
        """
        self._check_alive()
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        token_ids = self.engine.check_request(prompt, params)
        request_id = self._new_id()
        self._inbox.put(_Add(token_ids, params, request_id, time.time(), on_output, tuple(stop)))
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request at the next step boundary and free its KV blocks; no more outputs."""
        self._inbox.put(_Abort(request_id))

    def update_knobs(self, changes: dict[str, Any], origin: str = "api") -> "Future[int]":
        """Validate a knob change on the engine thread; the future gives the new version.

        The future raises pydantic.ValidationError (a ValueError) naming the field when the
        change is refused. An idle engine applies it at once with an empty step.
        """
        self._check_alive()
        future: Future[int] = Future()
        self._inbox.put(_KnobUpdate(dict(changes), origin, future))
        return future

    def rebalance(
        self, window: int, replicas: int, origin: str = "api"
    ) -> "Future[dict[str, Any]]":
        """Re-place experts from the last `window` steps' loads, between two steps.

        The future gives the engine's summary, or raises ValueError when there is nothing to
        rebalance.
        """
        self._check_alive()
        future: Future[dict[str, Any]] = Future()
        self._inbox.put(_Rebalance(window, replicas, origin, future))
        return future

    def knob_history(self) -> list[dict[str, Any]]:
        """Every applied knob change, oldest first."""
        return [c.model_dump() for c in list(self.engine.knob_changes)]

    def summary(self) -> dict[str, Any]:
        """Loop health, queue lengths, KV usage and knobs, readable from any thread."""
        eng, sch, blocks = self.engine, self.engine.scheduler, self.engine.blocks
        host_total = eng.config.cache.num_host_blocks
        usable = blocks.usable
        return {
            "loop": {
                "alive": self.alive,
                "error": self.error or self.engine.failure,
                "steps": self.steps,
                "busy_s": round(self.busy_s, 6),
                "busy_cpu_s": round(self.busy_cpu_s, 6),
                "mean_step_ms": round(1000 * self.busy_s / self.steps, 4) if self.steps else 0.0,
                "last_step_t": self.last_step_t,
                "started_t": self.started_t,
                "subscribers": self.bus.num_subscribers,
                "streams": len(self._streams),
            },
            "queue": {
                "waiting": len(sch.waiting),
                "running": len(sch.running),
                "swapped": len(sch.swapped),
            },
            "kv": {
                "block_size": blocks.block_size,
                "total": blocks.total,
                "usable": usable,
                "used": blocks.num_used,
                "cached": blocks.num_cached,
                "free": blocks.num_free,
                "usage": round(blocks.num_used / usable, 4) if usable else 0.0,
                "host_total": host_total,
                "host_used": host_total - len(blocks.host_free),
                "prefix_queries": blocks.prefix_queries,
                "prefix_hits": blocks.prefix_hits,
            },
            "parallel": {
                "ep_size": eng.placement.ep_size,
                "mode": eng.a2a_mode,
                "placement_version": eng.placement.version,
                "failure": eng.failure,
            },
            "knobs": self.knobs.model_dump(),
            "knobs_version": eng.knobs_version,
            "applied_knobs_version": eng.applied_knobs_version,
        }

    # the engine thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.engine.failure is not None:
                    raise RuntimeError(self.engine.failure)
                busy = self.engine.has_unfinished() or self._step_now
                self._drain_inbox(block=not busy)
                if self.engine.has_unfinished() or self._step_now:
                    self._step_now = False
                    self._step()
        except Exception as exc:  # reported to every waiting client
            cause = self.engine.wait_failure(1.0) or f"{type(exc).__name__}: {exc}"
            self.error = f"engine loop failed: {cause}"
            log.exception("engine loop failed")
            self._fail_all(self.error)
            return
        self._fail_all("engine loop stopped")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: Command) -> None:
        if isinstance(item, _Rebalance):
            self._rebalance(item)
        elif isinstance(item, _Abort):
            stream = self._streams.pop(item.request_id, None)
            self.engine.abort(item.request_id)
            if stream is not None:
                self._ended(item.request_id, stream, "abort")
        elif isinstance(item, _KnobUpdate):
            self._update_knobs(item)
        else:
            try:
                self.engine.add_request(item.token_ids, item.params, item.request_id, item.arrival)
            except ValueError as exc:
                _call(item.on_output, _error_output(item.request_id, item.token_ids, str(exc)))
                return
            self._streams[item.request_id] = _Stream(
                item.on_output, item.stop, item.arrival, len(item.token_ids), item.params.max_tokens
            )

    def _update_knobs(self, item: _KnobUpdate) -> None:
        try:
            if "origin" in item.changes:
                raise ValueError("origin: not a knob (pass the origin separately)")
            version = self.engine.update_knobs(origin=item.origin, **item.changes)
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
            item.future.set_exception(exc)
            return
        self.knobs = self.engine.latest_knobs
        self._step_now = True
        item.future.set_result(version)

    def _rebalance(self, item: _Rebalance) -> None:
        try:
            summary = self.engine.rebalance(item.window, item.replicas, item.origin)
        except ValueError as exc:
            item.future.set_exception(exc)
            return
        self._step_now = True
        item.future.set_result(summary)

    def _step(self) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        result = self.engine.step()
        for out in result.outputs:
            self._deliver(out)
        if self.bus.num_subscribers:
            self.bus.publish(result.telemetry.model_dump())
        self.steps += 1
        self.busy_s += time.perf_counter() - t0
        self.busy_cpu_s += time.thread_time() - c0
        self.last_step_t = time.time()

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        out = self._settle(out, stream)
        stream.output_len, stream.ttft_s = len(out.token_ids), out.ttft_s
        stream.preemptions = out.num_preemptions
        if out.finished:
            del self._streams[out.request_id]
            self._ended(out.request_id, stream, out.finish_reason or "stop")
        if not _call(stream.on_output, out) and not out.finished:
            self._streams.pop(out.request_id, None)
            self.engine.abort(out.request_id)
            self._ended(out.request_id, stream, "abort")

    def _ended(self, request_id: str, stream: _Stream, reason: str) -> None:
        """Publish the request's lifecycle record on `requests` (only when someone listens)."""
        if not self.requests.num_subscribers:
            return
        now = time.time()
        ttft = None if stream.ttft_s is None else round(stream.ttft_s * 1000, 3)
        self.requests.publish(
            {
                "req": request_id,
                "arrival": stream.arrival,
                "finished_t": now,
                "prompt_len": stream.prompt_len,
                "output_len": stream.output_len,
                "max_tokens": stream.max_tokens,
                "ttft_ms": ttft,
                "finish_reason": reason,
                "preemptions": stream.preemptions,
                "e2e_ms": round((now - stream.arrival) * 1000, 3),
            }
        )

    def _settle(self, out: RequestOutput, stream: _Stream) -> RequestOutput:
        """Apply stop strings; hold back text that a later token could still change."""
        text = out.text
        longest = max(map(len, stream.stop), default=0)
        if stream.stop:
            start = max(0, stream.settled - longest)
            hits = [i for s in stream.stop if (i := text.find(s, start)) >= 0]
            if hits:
                if not out.finished:
                    self.engine.finish(out.request_id)
                    self._step_now = True  # a step reports it even if nothing else runs
                return replace(out, text=text[: min(hits)], finished=True, finish_reason="stop")
        if out.finished:
            return out
        end = min(len(text.rstrip("\ufffd")), len(text) - max(0, longest - 1))
        stream.settled = max(stream.settled, end)
        return replace(out, text=text[: stream.settled])

    def _fail_all(self, message: str) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _KnobUpdate | _Rebalance):
                item.future.set_exception(EngineDead(message))
            elif isinstance(item, _Add):
                _call(item.on_output, _error_output(item.request_id, item.token_ids, message))
        for request_id, stream in list(self._streams.items()):
            _call(stream.on_output, _error_output(request_id, [], message))
            self._ended(request_id, stream, "error")
        self._streams.clear()


def _call(callback: OutputCallback, out: RequestOutput) -> bool:
    """Run a consumer's callback; a failing one is logged, never fatal to the engine."""
    try:
        callback(out)
    except Exception:  # a broken consumer must not stop the engine
        log.exception("output callback for %s failed", out.request_id)
        return False
    return True


def _error_output(request_id: str, token_ids: list[int], message: str) -> RequestOutput:
    return RequestOutput(request_id, token_ids, [], "", True, "error", None, error=message)
