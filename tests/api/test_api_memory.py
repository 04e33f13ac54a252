"""Knob changes keep nothing without bound: a few hundred changes through a real server (engine
loop, live window, scorecard and twin in the analysis process) under load, with the limits
made small so that they are reached within the test."""

import asyncio
import gc
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_servers import Served, serve, stop, traffic, wait_for

from engine import knob_versions
from engine.outputs import RequestDelta
from server import scorecard
from server.settings import ServerSettings
from server.state import state_of

# the files whose allocations a knob change makes: the change itself, its history, the
# scorecard's entry and the twin's inputs for its prediction
PER_CHANGE = (
    "*/api/control.py",
    "*/engine/knob_versions.py",
    "*/engine/queue_snapshot.py",
    "*/server/scorecard.py",
    "*/server/twins.py",
)
BURST = 150  # changes a measurement spans
RETAINED = 256 << 10  # bytes a burst may leave (allocator and interpreter noise), not per change


@pytest.fixture
def busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A server whose engine never idles (each finished request is replaced) until the end."""
    monkeypatch.setattr(knob_versions, "HISTORY", 64)
    monkeypatch.setattr(scorecard, "KEEP", 16)
    settings = ServerSettings(db_url=f"sqlite:///{tmp_path / 'm.db'}", whatif_horizon_s=2.0)
    served = serve(settings, max_num_seqs=8)
    ending = threading.Event()

    def refill(delta: RequestDelta) -> None:
        if delta.finished and not ending.is_set():
            traffic(served.loop, 1, 32, on_output=refill)

    traffic(served.loop, 8, 32, on_output=refill)  # together first: the twin sees a long prefill
    yield served
    ending.set()
    stop(served)


def _burst(client: httpx.Client, served: Served, n: int) -> None:
    """`n` knob changes back to back, then until the scorecard has an entry for the last."""
    for i in range(n):
        resp = client.patch("/api/knobs", json={"max_num_seqs": 4 if i % 2 else 8})
        assert resp.status_code == 200, resp.text
    last = resp.json()["version"]
    card = state_of(served.app).scorecard
    wait_for(lambda: card.entries and card.entries[0]["version"] == last, what="the last change")


def _retained() -> int:
    gc.collect()
    snap = tracemalloc.take_snapshot()
    kept = snap.filter_traces([tracemalloc.Filter(True, f, all_frames=True) for f in PER_CHANGE])
    return sum(stat.size for stat in kept.statistics("filename"))


def _within_limits(served: Served) -> dict[str, dict[str, int]]:
    sizes = httpx.get(served.url + "/api/status", timeout=30).json()["sizes"]
    over = {name: s for name, s in sizes.items() if s["size"] > s["limit"]}
    assert not over, f"past their limits: {over}"
    return sizes


def _hold_the_twin(served: Served) -> threading.Event:
    """Keep the twin busy, as a long what-if does, until the event returned is set."""
    twins = state_of(served.app).twins
    loop = state_of(served.app).scorecard.tasks["predict"].get_loop()
    release = threading.Event()

    async def hold() -> None:
        async with twins.lock:
            await asyncio.to_thread(release.wait)

    asyncio.run_coroutine_threadsafe(hold(), loop)
    wait_for(twins.lock.locked, what="the twin held")
    return release


@pytest.mark.slow
def test_knob_changes_retain_nothing_per_change(busy: Served) -> None:
    card = state_of(busy.app).scorecard
    window = state_of(busy.app).window
    wait_for(lambda: len(window.routed) >= 64, what="steps for the twin to fit")
    with httpx.Client(base_url=busy.url, timeout=30) as client:
        _burst(client, busy, 100)  # warm-up: the history and the scorecard reach their limits
        release = _hold_the_twin(busy)
        tracemalloc.start(16)
        try:
            first = _retained()
            _burst(client, busy, BURST)
            second = _retained()
            _burst(client, busy, BURST)
            third = _retained()
        finally:
            tracemalloc.stop()
            release.set()
        sizes = _within_limits(busy)
        assert sizes["knob_history"]["size"] == 64
        assert sizes["scorecard_entries"]["size"] == 16
        # the changes that waited for the twin: the newest is predicted once it is free
        last = card.entries[0]
        wait_for(lambda: last["observed"] is not None, what="the last change observed")
        assert last["predicted"] is not None or last["reason"], last
        assert card.dropped > 0
        _within_limits(busy)
    # a prediction's inputs are copies of the live window (hundreds of KB): queued for the
    # twin, every change held its own until its turn
    grown = [second - first, third - second]
    assert max(grown) < RETAINED, f"bytes retained over {BURST} changes: {grown}"
