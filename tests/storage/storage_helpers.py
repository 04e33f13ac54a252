"""Helpers for the storage tests: synthetic records, a recorder on bare buses, DB locks."""

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import schema_v1
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from engine import SamplingParams
from engine.bus import TelemetryBus
from engine.loop import EngineLoop
from engine.outputs import RequestDelta
from engine.telemetry import RequestRecord, StepTelemetry
from storage import Recorder, Store
from storage.models import Base


def step_record(
    step: int,
    t: float,
    session: str = "eng",
    layers: int = 2,
    experts: int = 4,
    knob_changes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A valid StepTelemetry record (as the bus carries it) with two decode slots."""
    return StepTelemetry.model_validate(
        {
            "session": session,
            "step": step,
            "t": t,
            "knobs_version": 1,
            "dur_ms": dict.fromkeys(("schedule", "prepare", "forward", "moe", "sample"), 0.5)
            | {"total": 2.5},
            "batch": {
                "max_slots": 8,
                "token_budget": 256,
                "num_prefill_tokens": 0,
                "num_decode_tokens": 2,
                "slots": [
                    {"slot": i, "req": f"r{i}", "phase": "decode", "tokens": 1, "ctx": 10 + step}
                    for i in range(2)
                ],
            },
            "queue": {
                "waiting": 0,
                "running": 2,
                "swapped": 0,
                "arrived": 0,
                "finished": 0,
                "preempted": 0,
            },
            "kv": {
                "block_size": 16,
                "total": 64,
                "usable": 64,
                "used": 2,
                "cached": 0,
                "free": 62,
                "tokens": 20,
                "watermark_blocks": 0,
                "host_total": 0,
                "host_used": 0,
                "prefix_hit_rate": 0.0,
            },
            "experts": {
                "layers": layers,
                "experts": experts,
                "top_k": 2,
                "counts": [[step % 3 + e for e in range(experts)] for _ in range(layers)],
                "dropped": [0] * layers,
                "balance": [0.5] * layers,
            },
            "a2a": {"ep_size": 1, "mode": "modeled", "bytes": [[0]]},
            "latency": {"ttft_ms": [], "tpot_ms": []},
            "knob_changes": knob_changes or [],
        }
    ).model_dump()


def request_record(
    req: str, arrival: float, prompt_len: int, output_len: int, priority: int = 0
) -> dict[str, Any]:
    """A RequestRecord's dict, as the loop publishes it."""
    return RequestRecord(
        req=req,
        arrival=arrival,
        finished_t=arrival + 0.5,
        prompt_len=prompt_len,
        output_len=output_len,
        max_tokens=output_len,
        ttft_ms=12.5,
        finish_reason="length",
        preemptions=0,
        e2e_ms=500.0,
        priority=priority,
    ).model_dump()


def bare_recorder(store: Store, **kwargs: Any) -> tuple[Recorder, TelemetryBus, TelemetryBus]:
    """A started recorder on two fresh buses (main session `main`)."""
    steps, requests = TelemetryBus(), TelemetryBus()
    rec = Recorder(store, steps, requests, **kwargs)
    rec.start("main", model="synthetic:test", engine_session="eng", config={}, knobs={})
    return rec, steps, requests


def sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


@contextmanager
def locked(url: str) -> Iterator[None]:
    """Another connection holds the write lock: every writer gets 'database is locked'."""
    conn = sqlite3.connect(sqlite_path(url), isolation_level=None, timeout=10)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


TIMEOUT = 60.0  # for a wait on a condition: generous, since only a hang should ever reach it


def wait_for(cond: Any, timeout: float = TIMEOUT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


PG_ENV = "MOESCOPE_TEST_PG_URL"


def fresh_url(kind: str, tmp: Path) -> str:
    """A fresh database: a SQLite file in `tmp`, or the PostgreSQL one in $MOESCOPE_TEST_PG_URL
    (emptied first; the test is skipped when that is not set)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'moescope.db'}"
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set (.ci/run sets it when PostgreSQL starts)")
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()
    return url


def pre_alembic_database(url: str) -> None:
    """A database as the last moescope before Alembic made it (schema version 1, no revision
    table): one session with a step, a knob change and a request."""
    engine = create_engine(url)
    schema_v1.Base.metadata.create_all(engine)
    columns = schema_v1.RequestRow.__table__.columns.keys()
    with Session(engine) as db, db.begin():
        db.add(schema_v1.SchemaInfo(id=1, version=1, created_t=1.0))
        db.add(
            schema_v1.SessionRow(
                id="old",
                kind="server",
                model="m",
                engine_session="e",
                config={},
                knobs={"max_num_seqs": 8},
                knobs_version=1,
                started_t=10.0,
                ended_t=20.0,
            )
        )
        db.flush()
        record = step_record(1, 11.0)
        db.add(
            schema_v1.StepRow(
                session_id="old",
                step=1,
                t=11.0,
                knobs_version=1,
                dur_ms=2.5,
                running=2,
                waiting=0,
                num_tokens=2,
                kv_used=2,
                data=record,
            )
        )
        db.add(
            schema_v1.KnobChangeRow(
                session_id="old", step=1, version=2, t=11.0, origin="api", changes={}, reason="r"
            )
        )
        db.add(
            schema_v1.RequestRow(
                session_id="old",
                **{k: v for k, v in request_record("r0", 11.0, 5, 3, 1).items() if k in columns},
            )
        )
    engine.dispose()


def run_requests(loop: EngineLoop, n: int, max_tokens: int, timeout: float = TIMEOUT) -> None:
    """Submit `n` greedy requests straight to the loop and wait until all have finished."""
    done = threading.Semaphore(0)

    def on_output(delta: RequestDelta) -> None:
        if delta.finished:
            done.release()

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(n):
        loop.submit([256, *range(1 + i, 24 + i)], params, on_output)
    for _ in range(n):
        assert done.acquire(timeout=timeout), "requests did not finish"


def mark_step(loop: EngineLoop) -> int:
    """Make the idle loop run one (empty) step, by a knob change, and wait until it is
    published; its number.

    Every earlier step has been published by then too, so a recorder flush covers them all.
    """
    before = loop.steps
    loop.update_knobs({"max_num_seqs": loop.knobs.max_num_seqs % 64 + 1}).result(TIMEOUT)
    wait_for(lambda: loop.steps > before, what="the marker step")
    return loop.steps - 1
