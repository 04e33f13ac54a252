"""The engine loop: one thread that steps the engine and talks to the rest through queues."""

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass
from typing import Any

from engine.bus import TelemetryBus
from engine.engine import LLMEngine
from engine.errors import InvalidInput
from engine.knobs import Knobs
from engine.outputs import RequestDelta, error_delta
from engine.queue_snapshot import QueueSnapshot, queue_snapshot
from engine.request import Request
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

OutputCallback = Callable[[RequestDelta], None]
THREAD_NAME = "moescope-engine"


@dataclass
class _Add:
    req: Request
    on_output: OutputCallback


@dataclass
class _Abort:
    request_id: str


@dataclass
class _KnobUpdate:
    changes: dict[str, Any]
    origin: str
    reason: str | None
    future: "Future[int]"


@dataclass
class _Rebalance:
    window: int
    replicas: int
    origin: str
    future: "Future[dict[str, Any]]"


@dataclass
class _Snapshot:
    since_version: int
    future: "Future[QueueSnapshot]"


Command = _Add | _Abort | _KnobUpdate | _Rebalance | _Snapshot


class EngineDead(RuntimeError):
    """The engine thread stopped with an error; no more requests are accepted."""


class EngineLoop:
    """Runs schedule -> forward -> sample -> publish on its own thread.

    Callers submit, abort and change knobs through a queue drained at each step boundary;
    each step's deltas go back through per-request callbacks (the last one with the whole
    output) and telemetry through the bus, so a slow consumer never stalls a step.
    `requests` is a second bus with one `RequestRecord` per request when it ends (finished,
    aborted or failed).
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
        self._streams: dict[str, OutputCallback] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._go: threading.Event | None = None  # set: a thread that built the engine may run
        self._ids = 0
        self._ids_lock = threading.Lock()

    # lifecycle

    @classmethod
    def built_on_its_thread(
        cls, make: Callable[[], LLMEngine], idle_wait_s: float = 0.05
    ) -> "EngineLoop":
        """A loop whose engine `make` builds on the engine thread itself (its errors raise
        here); the thread steps once `start` is called.

        libgomp cuts its spin-waiting once a second OpenMP team exists on no more cores than
        threads: an engine built on one thread (loading the weights starts a team) and
        stepped on another ran 1.3-1.5x slower on 2 cores."""
        made: Future[EngineLoop] = Future()
        go = threading.Event()

        def main() -> None:
            try:
                loop = cls(make(), idle_wait_s)
            except BaseException as exc:  # noqa: BLE001 - raised again by made.result()
                made.set_exception(exc)
                return
            loop._thread, loop._go = threading.current_thread(), go
            made.set_result(loop)
            go.wait()
            if not loop._stop.is_set():
                loop._run()

        threading.Thread(target=main, name=THREAD_NAME, daemon=True).start()
        return made.result()

    def start(self) -> None:
        """Start the engine thread (once; later calls do nothing)."""
        if self._stop.is_set() or self.error is not None or self._started:
            return
        self.started_t = time.time()
        if self._go is None:
            self._thread.start()
        else:
            self._go.set()

    @property
    def _started(self) -> bool:
        return self._go.is_set() if self._go is not None else self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread, then the engine's other expert-parallel ranks."""
        self._stop.set()
        if self._go is not None:
            self._go.set()  # a thread still waiting to start sees the stop and ends
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.engine.close()

    @property
    def alive(self) -> bool:
        return (
            self._started
            and self._thread.is_alive()
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
        stream_text: bool = False,
    ) -> str:
        """Validate now (InvalidInput naming the field), queue for the next step; returns the id.

        `on_output` is called on the engine thread with every step's `RequestDelta`; it must
        be quick. The last delta (`finished`) holds the whole `RequestOutput`. With
        `stream_text`, deltas carry text as it settles; else all of it comes at the end.
        """
        self._check_alive()
        req = self.engine.make_request(
            prompt, params, self._new_id(), time.time(), stream_text=stream_text
        )
        self._inbox.put(_Add(req, on_output))
        return req.request_id

    def abort(self, request_id: str) -> None:
        """Stop a request at the next step boundary and free its KV blocks; no more outputs."""
        self._inbox.put(_Abort(request_id))

    def update_knobs(
        self, changes: dict[str, Any], origin: str = "api", reason: str | None = None
    ) -> "Future[int]":
        """Validate a knob change on the engine thread; the future gives the new version.

        The future raises InvalidInput naming the field when the change is refused. An idle
        engine applies it at once with an empty step.
        """
        self._check_alive()
        future: Future[int] = Future()
        self._inbox.put(_KnobUpdate(dict(changes), origin, reason, future))
        return future

    def rebalance(
        self, window: int, replicas: int, origin: str = "api"
    ) -> "Future[dict[str, Any]]":
        """Re-place experts from the last `window` steps' loads, between two steps.

        The future gives the engine's summary, or raises InvalidInput (Refused when there is
        nothing to rebalance).
        """
        self._check_alive()
        future: Future[dict[str, Any]] = Future()
        self._inbox.put(_Rebalance(window, replicas, origin, future))
        return future

    def snapshot(self, since_version: int = 0) -> "Future[QueueSnapshot]":
        """The queues and knobs at the next step boundary (at once when idle), read on the
        engine thread; it changes nothing. Knob changes newer than `since_version` come too."""
        self._check_alive()
        future: Future[QueueSnapshot] = Future()
        self._inbox.put(_Snapshot(since_version, future))
        return future

    def knob_history(self) -> list[dict[str, Any]]:
        """The applied knob changes kept in memory, oldest first."""
        return [c.model_dump() for c in self.engine.knob_changes]

    def summary(self) -> dict[str, Any]:
        """Loop health, queue lengths, KV usage and knobs, readable from any thread."""
        eng, sch = self.engine, self.engine.scheduler
        kv = eng.blocks.stats()
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
            "kv": {**asdict(kv), "usage": kv.usage},
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
                self._drain_inbox(block=not self.engine.has_work())
                if self.engine.has_work():
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
            self._abort(item.request_id)
        elif isinstance(item, _KnobUpdate):
            self._update_knobs(item)
        elif isinstance(item, _Snapshot):
            try:
                _settle(item.future, queue_snapshot(self.engine, item.since_version))
            except InvalidInput as exc:  # a version older than the knob history kept
                _settle(item.future, error=exc)
        else:
            self._add(item)

    def _add(self, item: _Add) -> None:
        try:
            self.engine.add(item.req)
        except InvalidInput as exc:
            _call(item.on_output, error_delta(item.req.request_id, str(exc)))
            return
        self._streams[item.req.request_id] = item.on_output

    def _abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request (no more outputs) and publish its record."""
        self._streams.pop(request_id, None)
        record = self.engine.abort(request_id, reason)
        if record is not None:
            self.requests.publish(record.model_dump())

    def _update_knobs(self, item: _KnobUpdate) -> None:
        try:
            for name in ("origin", "reason"):
                if name in item.changes:
                    raise InvalidInput(f"{name}: not a knob (pass it separately)", name)
            version = self.engine.update_knobs(item.origin, item.reason, **item.changes)
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
            _settle(item.future, error=exc)
            return
        self.knobs = self.engine.latest_knobs
        _settle(item.future, version)

    def _rebalance(self, item: _Rebalance) -> None:
        try:
            summary = self.engine.rebalance(item.window, item.replicas, item.origin)
        except InvalidInput as exc:
            _settle(item.future, error=exc)
            return
        _settle(item.future, summary)

    def _step(self) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        result = self.engine.step()
        for delta in result.deltas:
            self._deliver(delta)
        for record in result.ended:
            self.requests.publish(record.model_dump())
        if self.bus.num_subscribers:
            self.bus.publish(result.telemetry.model_dump())
        self.steps += 1
        self.busy_s += time.perf_counter() - t0
        self.busy_cpu_s += time.thread_time() - c0
        self.last_step_t = time.time()

    def _deliver(self, delta: RequestDelta) -> None:
        on_output = self._streams.get(delta.request_id)
        if on_output is None:
            return
        if delta.finished:
            del self._streams[delta.request_id]
        if not _call(on_output, delta) and not delta.finished:
            self._abort(delta.request_id)

    def _fail_all(self, message: str) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _KnobUpdate | _Rebalance | _Snapshot):
                _settle(item.future, error=EngineDead(message))
            elif isinstance(item, _Add):
                _call(item.on_output, error_delta(item.req.request_id, message))
        for request_id, on_output in list(self._streams.items()):
            _call(on_output, error_delta(request_id, message))
            try:
                self._abort(request_id, "error")
            except Exception:  # a broken engine must not keep the other clients waiting
                log.exception("could not end %s", request_id)


def _call(callback: OutputCallback, delta: RequestDelta) -> bool:
    """Run a consumer's callback; a failing one is logged, never fatal to the engine."""
    try:
        callback(delta)
    except Exception:  # a broken consumer must not stop the engine
        log.exception("output callback for %s failed", delta.request_id)
        return False
    return True


def _settle(future: Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Answer a command's future, unless its waiter gave up on it: asyncio.wrap_future cancels
    a pending future when the awaiting task is cancelled (a client gone, the server stopping),
    and setting it then would raise on the engine thread."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:
        pass
