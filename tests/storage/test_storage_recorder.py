"""The recorder on bare buses: batches, session segments, outages (drop, count, resume), close."""

import threading
import time
from typing import Any

import pytest
from sqlalchemy import event, func, select
from storage_helpers import (
    TIMEOUT,
    bare_recorder,
    locked,
    request_record,
    step_record,
    wait_for,
)

from storage import SessionNotFound, Store
from storage import queries as q
from storage.models import SessionRow, StepRow


def test_records_steps_knob_changes_and_requests_in_order(db_url: str) -> None:
    store = Store(db_url)
    rec, steps, requests = bare_recorder(store, batch_size=16)
    t0 = time.time()
    change = {
        "version": 2,
        "t": t0,
        "origin": "autopilot",
        "changes": {"max_num_seqs": [8, 4]},
        "reason": "p90 TPOT 138 ms > 100 ms target",
    }
    for i in range(100):
        steps.publish(step_record(i, t0 + i * 1e-3, knob_changes=[change] if i == 40 else None))
    requests.publish(request_record("r1", t0, 12, 30))
    assert rec.flush()
    assert rec.stats()["batches"] >= 100 // 16  # batches are bounded by batch_size
    rec.close()
    got = q.steps(store, "main")
    assert [s["step"] for s in got] == list(range(100))
    assert got[7]["experts"]["counts"] == step_record(7, 0)["experts"]["counts"]
    assert all(s["session"] == "main" for s in got)
    assert [s["step"] for s in q.steps(store, "main", 10, 19, every=5)] == [10, 15]
    assert q.knob_changes(store, "main") == [{"step": 40, **change}]
    assert [(r["req"], r["prompt_len"], r["output_len"]) for r in q.requests(store, "main")] == [
        ("r1", 12, 30)
    ]
    summary = q.get_session(store, "main")
    assert summary["steps"] == 100 and summary["requests"] == 1 and summary["ended_t"]
    assert summary["dropped"] == 0 and summary["knob_changes"] == 1
    store.close()


def test_a_begun_session_takes_records_until_it_ends(db_url: str) -> None:
    store = Store(db_url)
    rec, steps, requests = bare_recorder(store)
    t = time.time()
    steps.publish(step_record(0, t))
    child = rec.begin_session(
        "rerun",
        parent_id="main",
        label="rerun of main",
        model="m",
        engine_session="eng",
        config={},
        knobs={},
    )
    assert rec.current_session == child
    steps.publish(step_record(1, time.time()))
    requests.publish(request_record("r-child", time.time(), 3, 4))
    rec.end_session(child)
    steps.publish(step_record(2, time.time()))
    rec.close()
    assert [s["step"] for s in q.steps(store, "main")] == [0, 2]
    assert [(s["step"], s["session"]) for s in q.steps(store, child)] == [(1, child)]
    assert [r["req"] for r in q.requests(store, child)] == ["r-child"]
    info = q.get_session(store, child)
    assert info["parent"] == "main" and info["kind"] == "rerun" and info["ended_t"]
    assert q.get_session(store, "main")["reruns"] == [child]
    store.close()


def test_a_locked_database_drops_and_counts_then_recording_resumes(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/locked.db"
    store = Store(url, timeout_s=0.05)
    rec, steps, _ = bare_recorder(
        store, max_pending=50, flush_interval_s=0.02, retry_interval_s=0.05
    )
    t0 = time.time()
    steps.publish(step_record(0, t0))
    assert rec.flush()
    with locked(url):
        for i in range(1, 301):
            steps.publish(step_record(i, t0 + i * 1e-3))
        wait_for(lambda: rec.dropped_steps >= 250 and not rec.ok, what="drops while locked")
        stats = rec.stats()
        assert stats["pending_steps"] <= 50 and "locked" in stats["last_error"]
    assert rec.flush()  # the lock is gone: the next retry writes what was kept
    for i in range(301, 311):
        steps.publish(step_record(i, t0 + i * 1e-3))
    assert rec.flush()
    assert rec.ok and rec.dropped_steps == 250
    rec.close()
    stored = [s["step"] for s in q.steps(store, "main")]
    assert stored == [0, *range(251, 311)]  # the oldest were dropped, the newest kept
    assert q.get_session(store, "main")["dropped"] == 250
    store.close()


def test_publishing_never_waits_for_the_database(tmp_path: object) -> None:
    """Publishing only appends to a bus buffer: all of it happens while the recorder is stuck
    in its first write, and what the buffer could not keep is dropped and counted."""
    store = Store(f"sqlite:///{tmp_path}/stuck.db")
    stuck, unstick = threading.Event(), threading.Event()

    def stall(*_: Any) -> None:
        if threading.current_thread().name == "moescope-recorder":
            stuck.set()
            unstick.wait(TIMEOUT)

    event.listen(store.engine, "before_cursor_execute", stall)
    rec, steps, _ = bare_recorder(store, max_pending=50)
    t0 = time.time()
    try:
        assert stuck.wait(TIMEOUT)  # writing the session's row
        publisher = threading.Thread(
            target=lambda: [steps.publish(step_record(i, t0 + i * 1e-3)) for i in range(300)]
        )
        publisher.start()
        publisher.join(TIMEOUT)
        assert not publisher.is_alive()
        assert not unstick.is_set()  # the recorder was in the database all along
    finally:
        unstick.set()  # (the listener stays: removing it could race the recorder's next call)
    assert rec.flush()
    assert rec.ok and rec.dropped_steps == 250
    rec.close()
    assert [s["step"] for s in q.steps(store, "main")] == list(range(250, 300))
    store.close()


def test_refused_batches_are_dropped_and_reported_until_a_write_succeeds(db_url: str) -> None:
    store = Store(db_url)
    rec, steps, _ = bare_recorder(store)
    t = time.time()
    steps.publish(step_record(0, t))
    assert rec.flush() and rec.ok
    q.delete_session(store, "main")  # under the recorder: its steps now break the foreign key
    for i in range(1, 6):
        steps.publish(step_record(i, t + i * 1e-3))
    assert rec.flush()
    stats = rec.stats()
    assert not stats["ok"] and "foreign key" in stats["last_error"].lower()
    assert stats["dropped_steps"] == 5 and stats["pending_steps"] == 0
    assert rec.brief()["ok"] is False
    child = rec.begin_session("rerun", model="m", engine_session="eng", config={}, knobs={})
    steps.publish(step_record(6, time.time()))
    assert rec.flush()
    assert rec.ok and [s["step"] for s in q.steps(store, child)] == [6]
    rec.close()  # ends both sessions: the deleted one is not written back
    assert q.get_session(store, child)["ended_t"] and rec.ok
    with pytest.raises(SessionNotFound):
        q.get_session(store, "main")
    store.close()


def test_close_flushes_everything_pending(db_url: str) -> None:
    store = Store(db_url)
    rec, steps, _ = bare_recorder(store, flush_interval_s=60.0)
    t = time.time()
    for i in range(500):
        steps.publish(step_record(i, t + i * 1e-3))
    rec.close()
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(StepRow)).scalar() == 500
        assert conn.execute(select(SessionRow.ended_t)).scalar() is not None
    store.close()


def test_bad_bounds_are_refused(tmp_path: object) -> None:
    store = Store(f"sqlite:///{tmp_path}/b.db")
    with pytest.raises(ValueError, match="max_pending"):
        bare_recorder(store, max_pending=0)
    store.close()
