"""The background recorder: drains the telemetry and request buses, writes batches on its thread.

The engine only ever appends to bounded bus buffers. This thread drains them every
`flush_interval_s` into its own bounded pending queues and writes them in transactions of at
most `batch_size` steps, over one connection that it keeps (few calls, so few hand-offs of
the GIL between it and the engine thread). When the database is slow or gone, records wait
in the queues; past `max_pending` the oldest are dropped and counted, and writing resumes
once a retry succeeds. A batch that the database refuses (an integrity error, such as steps
of a session deleted under the recorder) is dropped and counted, not retried. Either way `ok`
is False, with `last_error`, until a batch is written again. `close()` flushes what is
pending.

Each record goes to the session whose time segment holds it (a step by its `t`, a request
by its arrival): the server's own session, or a rerun session between `begin_session` and
`end_session`.
"""

import bisect
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from engine.bus import Subscription, TelemetryBus
from storage.models import REQUEST_FIELDS, KnobChangeRow, RequestRow, SessionRow, StepRow
from storage.store import Store, _first_line

log = logging.getLogger(__name__)


class Recorder:
    """Records one server's telemetry, knob changes and requests into a Store."""

    def __init__(
        self,
        store: Store,
        steps: TelemetryBus,
        requests: TelemetryBus,
        *,
        max_pending: int = 2048,
        batch_size: int = 256,
        flush_interval_s: float = 0.2,
        retry_interval_s: float = 0.5,
    ) -> None:
        if max_pending < 1 or batch_size < 1:
            raise ValueError("max_pending and batch_size must be at least 1")
        self.store = store
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retry_interval_s = retry_interval_s
        self._buses = (steps, requests)
        self._subs: tuple[Subscription, Subscription] | None = None
        self._steps: deque[dict[str, Any]] = deque()
        self._requests: deque[dict[str, Any]] = deque()
        self._knobs: deque[dict[str, Any]] = deque()
        self._meta: dict[str, dict[str, Any]] = {}
        self._dropped_by_session: dict[str, int] = {}
        self._starts: list[float] = []
        self._owners: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moescope-recorder", daemon=True)
        self.main_session: str | None = None
        self._tags: dict[str, str | None] = {}
        self.ok = True
        self.last_error: str | None = None
        self.written_steps = 0
        self.written_requests = 0
        self.dropped_steps = 0
        self.dropped_requests = 0
        self.failures = 0
        self.batches = 0
        self.cpu_s = 0.0
        self._retry_at = 0.0
        self._busy = False
        self._conn: Connection | None = None

    # sessions

    def start(
        self,
        session_id: str,
        *,
        replica: str | None = None,
        fleet_run: str | None = None,
        **meta: Any,
    ) -> str:
        """Subscribe, open the main session (`meta`: SessionRow fields) and start writing.

        `replica` and `fleet_run` tag the sessions of one replica of a `moescope fleet` run
        (this one and those begun later), so the session list can pick them out."""
        if self._subs is not None:
            raise RuntimeError("recorder already started")
        self._tags = {"replica": replica, "fleet_run": fleet_run}
        self._open(session_id, "server", time.time(), meta)
        self.main_session = session_id
        steps, requests = self._buses
        self._subs = (steps.subscribe(self.max_pending), requests.subscribe(self.max_pending))
        self._thread.start()
        return session_id

    def begin_session(self, kind: str = "rerun", **meta: Any) -> str:
        """A new session that takes every record from now until `end_session`; it has the
        main session's `replica` and `fleet_run` unless `meta` names others."""
        session_id = uuid.uuid4().hex[:12]
        self._open(session_id, kind, time.time(), meta)
        return session_id

    def end_session(self, session_id: str) -> None:
        """Close a session begun with `begin_session`; records go to the main session again."""
        now = time.time()
        with self._lock:
            self._meta.setdefault(session_id, {})["ended_t"] = now
            if self.main_session is not None and self.current_session != self.main_session:
                self._segment(now, self.main_session)

    @property
    def current_session(self) -> str | None:
        return self._owners[-1] if self._owners else None

    def session_at(self, t: float) -> str | None:
        """The session that a request arriving at `t` is recorded in (None before `start`)."""
        with self._lock:
            return self._owner(t) if self._owners else None

    def _open(self, session_id: str, kind: str, now: float, meta: dict[str, Any]) -> None:
        row = {
            "id": session_id,
            "kind": kind,
            "started_t": now,
            "ended_t": None,
            "dropped": 0,
            "label": None,
            "parent_id": None,
            "knobs_version": 1,
            **self._tags,
            **meta,
        }
        with self._lock:
            self._meta[session_id] = row
            self._segment(now, session_id)

    def _segment(self, start: float, session_id: str) -> None:
        self._starts.append(start)
        self._owners.append(session_id)

    def _owner(self, t: float) -> str:
        i = bisect.bisect_right(self._starts, t) - 1
        return self._owners[max(i, 0)]

    # state

    @property
    def pending(self) -> int:
        return len(self._steps)

    def stats(self) -> dict[str, Any]:
        """Counters for /api/status: written, dropped, pending, database health, thread CPU."""
        return {
            "recording": self._thread.is_alive(),
            "db": self.store.display_url,
            "session": self.current_session,
            "main_session": self.main_session,
            "ok": self.ok,
            "last_error": self.last_error,
            "written_steps": self.written_steps,
            "written_requests": self.written_requests,
            "dropped_steps": self.dropped_steps,
            "dropped_requests": self.dropped_requests,
            "pending_steps": self.pending,
            "batches": self.batches,
            "failures": self.failures,
            "cpu_s": round(self.cpu_s, 4),
        }

    def brief(self) -> dict[str, Any]:
        """The short form carried by each telemetry websocket message."""
        return {"ok": self.ok, "dropped": self.dropped_steps, "pending": self.pending}

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything published so far is written; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._retry_at = 0.0
            self._wake.set()
            time.sleep(0.01)
            # In this order: a record no longer in a bus buffer was taken by a cycle that
            # was busy from before it took it; once no cycle runs, the record is written
            # or still in the queues.
            if (
                not any(s.buffer for s in self._subs or ())
                and not self._busy
                and not self._has_work()
            ):
                return True
        return False

    def close(self, timeout: float = 10.0) -> None:
        """Stop, write what is pending (one try if the database is down), end the session."""
        if self._subs is None:
            return
        now = time.time()
        with self._lock:
            for sid in (self.main_session, self.current_session):
                if sid is not None:
                    self._meta.setdefault(sid, {})["ended_t"] = now
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        for bus, sub in zip(self._buses, self._subs, strict=True):
            bus.unsubscribe(sub)

    # the recorder thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._cycle(final=False)
        self._retry_at = 0.0
        self._cycle(final=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _cycle(self, final: bool) -> None:
        self._busy = True
        cpu0 = time.thread_time()
        try:
            self._collect()
            while time.monotonic() >= self._retry_at and self._has_work():
                if not self._write_batch():
                    self._retry_at = time.monotonic() + self.retry_interval_s
                    break
                if not final and self._stop.is_set():
                    break
        finally:
            self.cpu_s += time.thread_time() - cpu0
            self._busy = False

    def _has_work(self) -> bool:
        return bool(self._steps or self._requests or self._knobs or self._meta)

    def _collect(self) -> None:
        assert self._subs is not None
        steps, lost_steps = self._subs[0].drain()
        requests, lost_requests = self._subs[1].drain()
        with self._lock:
            if lost_steps:
                self._drop_steps(self.current_session or "", lost_steps)
            self.dropped_requests += lost_requests
            for rec in steps:
                session = self._owner(rec["t"])
                for change in rec.get("knob_changes") or ():
                    self._knobs.append({"session_id": session, "step": rec["step"], **change})
                self._steps.append({**rec, "session": session})
            for rec in requests:
                self._requests.append({"session_id": self._owner(rec["arrival"]), **rec})
            while len(self._steps) > self.max_pending:
                self._drop_steps(self._steps.popleft()["session"], 1)
            while len(self._requests) > self.max_pending:
                self._requests.popleft()
                self.dropped_requests += 1
            while len(self._knobs) > self.max_pending:
                self._knobs.popleft()

    def _drop_steps(self, session: str, n: int) -> None:
        self.dropped_steps += n
        self._dropped_by_session[session] = self._dropped_by_session.get(session, 0) + n

    def _write_batch(self) -> bool:
        """One transaction: session rows, up to batch_size steps, knob changes, requests."""
        steps = list(itertools.islice(self._steps, self.batch_size))
        requests = list(itertools.islice(self._requests, self.batch_size))
        knobs = list(itertools.islice(self._knobs, self.batch_size))
        with self._lock:
            meta, self._meta = self._meta, {}
            dropped, self._dropped_by_session = self._dropped_by_session, {}
        try:
            conn = self._conn or self.store.engine.connect()
            self._conn = conn
            with conn.begin():
                self._write_sessions(conn, meta, dropped)
                if steps:
                    conn.execute(insert(StepRow), [_step_row(r) for r in steps])
                if knobs:
                    conn.execute(insert(KnobChangeRow), [_knob_row(r) for r in knobs])
                if requests:
                    conn.execute(insert(RequestRow), [_request_row(r) for r in requests])
        except IntegrityError as exc:
            if self.ok:
                log.error(
                    "recorder: %s refuses a batch (%s); dropping refused batches",
                    self.store.display_url,
                    _first_line(exc),
                )
            self.ok, self.last_error = False, _first_line(exc)
            self._pop(len(steps), len(requests), len(knobs))
            self.dropped_steps += len(steps)
            self.dropped_requests += len(requests)
            return True
        except SQLAlchemyError as exc:
            self._disconnect()
            with self._lock:
                for sid, fields in meta.items():
                    self._meta[sid] = {**fields, **self._meta.get(sid, {})}
                for sid, n in dropped.items():
                    self._dropped_by_session[sid] = self._dropped_by_session.get(sid, 0) + n
            self.failures += 1
            if self.ok:
                log.warning(
                    "recorder: writing to %s failed (%s); buffering up to %d steps",
                    self.store.display_url,
                    _first_line(exc),
                    self.max_pending,
                )
            self.ok, self.last_error = False, _first_line(exc)
            return False
        self._pop(len(steps), len(requests), len(knobs))
        self.written_steps += len(steps)
        self.written_requests += len(requests)
        self.batches += 1
        if not self.ok:
            log.warning("recorder: %s takes writes again", self.store.display_url)
        self.ok = True
        return True

    def _disconnect(self) -> None:
        """Drop the writer's connection (after a failure, or at the end); the next opens anew."""
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except SQLAlchemyError:
                pass
            self._conn = None

    def _pop(self, steps: int, requests: int, knobs: int) -> None:
        for queue, n in ((self._steps, steps), (self._requests, requests), (self._knobs, knobs)):
            for _ in range(n):
                queue.popleft()

    def _write_sessions(
        self, conn: Connection, meta: dict[str, dict[str, Any]], dropped: dict[str, int]
    ) -> None:
        """Insert new session rows, update written ones; skip updates to rows deleted since."""
        for sid, fields in meta.items():
            exists = conn.execute(select(SessionRow.id).where(SessionRow.id == sid)).first()
            if exists:
                conn.execute(
                    update(SessionRow)
                    .where(SessionRow.id == sid)
                    .values(**{k: v for k, v in fields.items() if k != "id"})
                )
            elif "id" in fields:
                conn.execute(insert(SessionRow).values(**fields))
        for sid, n in dropped.items():
            if sid:
                conn.execute(
                    update(SessionRow)
                    .where(SessionRow.id == sid)
                    .values(dropped=SessionRow.dropped + n)
                )


def _step_row(r: dict[str, Any]) -> dict[str, Any]:
    batch = r["batch"]
    return {
        "session_id": r["session"],
        "step": r["step"],
        "t": r["t"],
        "knobs_version": r["knobs_version"],
        "dur_ms": r["dur_ms"]["total"],
        "running": r["queue"]["running"],
        "waiting": r["queue"]["waiting"],
        "num_tokens": batch["num_prefill_tokens"] + batch["num_decode_tokens"],
        "kv_used": r["kv"]["used"],
        "data": r,
    }


def _knob_row(r: dict[str, Any]) -> dict[str, Any]:
    row = {k: r[k] for k in ("session_id", "step", "version", "t", "origin", "changes")}
    return {**row, "reason": r.get("reason")}


def _request_row(r: dict[str, Any]) -> dict[str, Any]:
    row = {k: r[k] for k in ("session_id", *REQUEST_FIELDS)}
    return {**row, "prompt_token_ids": r.get("prompt_token_ids")}  # kept when the engine has
