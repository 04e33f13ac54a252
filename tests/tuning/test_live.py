"""The live twin's trace and knobs: the queue as it stands, then the recent arrivals laid over the
horizon."""

import math
import statistics

import pytest

from engine.knobs import Knobs
from engine.queue_snapshot import QueuedRequest
from engine.telemetry import KnobChange
from tuning.twin.live import (
    MAX_STRETCH,
    arrival_window,
    knobs_at,
    live_trace,
    stretched_horizon,
)
from tuning.twin.trace import TraceItem

NOW = 1000.0


def record(arrival: float, prompt_len: int, output_len: int, priority: int = 0) -> dict[str, float]:
    return {
        "arrival": arrival,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "priority": priority,
    }


def test_the_queue_enters_first_then_arrivals_drawn_like_the_recent_ones() -> None:
    queued = [
        # running with output: 25 tokens, all but the last in KV, 7 to go
        QueuedRequest("running", NOW - 3.0, 20, 5, 12, 0),
        QueuedRequest("waiting", NOW - 2.0, 30, 0, 8, 0),  # no output yet: keeps its arrival
        QueuedRequest("swapped", NOW - 30.0, 40, 2, 6, 0),  # prefills its 42 again, 4 to go
    ]
    recent = [
        record(NOW - 15.0, 7, 3),  # older than the 10 s window: left out
        record(NOW - 9.0, 9, 4),
        record(NOW - 4.0, 11, 0),  # ended before its first token: nothing to repeat
    ]
    trace = live_trace(queued, recent, NOW, window_s=10.0, horizon_s=25.0)
    assert trace[:3] == [
        TraceItem(0.0, 25, 7, computed=24),
        TraceItem(-2.0, 30, 8),
        TraceItem(0.0, 42, 4),
    ]
    # then copies of what arrived 2 s, 3 s (the queued ones, to max_tokens) and 9 s ago, in
    # time order within the horizon; the same at the same moment
    future = trace[3:]
    assert future
    assert {(t.prompt_len, t.output_len) for t in future} <= {(30, 8), (20, 12), (9, 4)}
    offsets = [t.offset_s for t in future]
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] <= 25.0
    assert live_trace(queued, recent, NOW, 10.0, 25.0) == trace


def test_drawn_arrivals_come_at_the_windows_rate_and_bunch_as_poisson_arrivals_do() -> None:
    # 4 arrivals in the last 10 s, evenly spaced: 0.4 a second, drawn over a long horizon
    recent = [record(NOW - ago, ago, 4) for ago in (1.5, 4.0, 6.5, 9.0)]
    horizon = 10_000.0
    future = live_trace([], recent, NOW, window_s=10.0, horizon_s=horizon)
    assert len(future) == pytest.approx(0.4 * horizon, rel=0.05)
    # each recent arrival as often as the others
    for ago in (1.5, 4.0, 6.5, 9.0):
        assert sum(t.prompt_len == ago for t in future) == pytest.approx(len(future) / 4, rel=0.1)
    # exponential gaps: a fifth of them shorter than a quarter of the mean (1 - e^-0.25),
    # where the window's own were all 2.5 s apart
    gaps = [b.offset_s - a.offset_s for a, b in zip(future, future[1:], strict=False)]
    short = sum(g < 0.25 * 2.5 for g in gaps) / len(gaps)
    assert short == pytest.approx(1 - math.exp(-0.25), abs=0.03)


def test_priorities_go_with_the_requests_queued_and_drawn() -> None:
    queued = [
        QueuedRequest("running", NOW - 1.0, 20, 5, 12, 3),
        QueuedRequest("waiting", NOW - 2.0, 30, 0, 8, -1),
    ]
    recent = [record(NOW - 4.0, 9, 4, priority=7), {**record(NOW - 5.0, 6, 2), "priority": None}]
    trace = live_trace(queued, recent, NOW, window_s=10.0, horizon_s=200.0)
    assert trace[:2] == [TraceItem(0.0, 25, 7, 3, computed=24), TraceItem(-2.0, 30, 8, -1)]
    # a record from before priorities: 0
    assert {(t.prompt_len, t.priority) for t in trace[2:]} == {(20, 3), (30, -1), (9, 7), (6, 0)}


def test_a_window_longer_than_the_horizon_is_squeezed_into_it_at_its_rate() -> None:
    # 16 arrivals over the last 20 s, prompt length = seconds ago; a 5 s horizon holds a
    # quarter of them, evenly spaced over the whole window (2, 6, 10 and 16 s ago): the first
    # as long from now as the newest arrived ago (1 s), each then followed by its own gap back
    # in the window (1, 1, 1, 2 s), scaled by 5 / 6 to span the horizon
    recent = [record(NOW - ago, ago, 4) for ago in range(1, 13)]
    recent += [record(NOW - ago, ago, 4) for ago in (14, 16, 18, 20)]
    trace = live_trace([], recent, NOW, window_s=20.0, horizon_s=5.0)
    assert [t.prompt_len for t in trace] == [2, 6, 10, 16]
    assert [t.offset_s for t in trace] == pytest.approx([x * 5 / 6 for x in (1, 2, 3, 4)])


def test_squeezed_arrivals_stay_bunched_as_they_came() -> None:
    # pairs 0.1-0.2 s apart among longer gaps; half of them kept, every other in time order
    ages = [0.5, 0.6, 3.0, 3.2, 8.0, 10.0, 11.0, 11.1, 15.0, 19.3]
    recent = [record(NOW - ago, i, 4) for i, ago in enumerate(ages)]
    trace = live_trace([], recent, NOW, window_s=20.0, horizon_s=10.0)
    assert [t.prompt_len for t in trace] == [0, 2, 4, 6, 8]
    # from 0.5 s on, the kept ones' own gaps 0.1, 0.2, 2.0, 0.1 (and 4.3 after the last),
    # scaled by 10 / 7.2 so that the five span the horizon
    scale = 10 / 7.2
    assert [t.offset_s for t in trace] == pytest.approx(
        [x * scale for x in (0.5, 0.6, 0.8, 2.8, 2.9)]
    )


def test_a_horizon_too_short_for_enough_requests_stretches_until_it_holds_them() -> None:
    least = 30
    queued = [QueuedRequest("waiting", NOW - 1.0, 30, 0, 8, 0)] * 4
    # 8 ended in the last 10 s, with the 4 queued 1.2 a second: 26 more take 21.7 s
    recent = [record(NOW - ago, 50, 4) for ago in range(2, 10)]
    horizon = stretched_horizon(queued, recent, NOW, 10.0, 10.0, least)
    assert horizon == pytest.approx((least - 4) * 10.0 / 12)
    assert len(live_trace(queued, recent, NOW, 10.0, 10.0)) < least
    # stretched past the window, its arrivals are drawn: they hold `least` on average over
    # looks (each look's draw seeded by its own moment)
    held = []
    for k in range(400):
        now = NOW + 0.37 * k
        moved = [QueuedRequest("waiting", now - 1.0, 30, 0, 8, 0)] * 4
        ended = [record(now - ago, 50, 4) for ago in range(2, 10)]
        held.append(len(live_trace(moved, ended, now, 10.0, horizon)))
    assert statistics.fmean(held) == pytest.approx(least, rel=0.05)
    # none asked for, or enough already: as asked; a trickle: at most MAX_STRETCH times; nothing
    # to repeat: as asked
    assert stretched_horizon(queued, recent, NOW, 10.0, 10.0, 0) == 10.0
    assert stretched_horizon(queued, recent * 3, NOW, 10.0, 10.0, least) == 10.0
    assert stretched_horizon([], recent[:1], NOW, 10.0, 10.0, least) == MAX_STRETCH * 10.0
    assert stretched_horizon(queued, [], NOW, 0.5, 10.0, least) == 10.0


def test_nothing_queued_and_nothing_recent_is_an_empty_trace() -> None:
    assert live_trace([], [record(NOW - 100.0, 5, 5)], NOW, 60.0, 60.0) == []


@pytest.mark.parametrize(("uptime", "window"), [(0.5, 10.0), (25.0, 25.0), (600.0, 60.0)])
def test_the_arrival_window_is_the_last_minute_but_at_least_ten_seconds(
    uptime: float, window: float
) -> None:
    assert arrival_window(uptime) == window


def test_knobs_at_an_older_version_undo_the_newer_changes() -> None:
    now = Knobs(max_num_seqs=4, policy="shortest_first", max_num_batched_tokens=512)
    changes = [
        KnobChange(version=2, t=1.0, origin="api", changes={"max_num_seqs": [8, 6]}),
        KnobChange(
            version=3,
            t=2.0,
            origin="api",
            changes={"max_num_seqs": [6, 4], "policy": ["fcfs", "shortest_first"]},
        ),
        # a placement switch is versioned like a knob change but holds no knob
        KnobChange(version=4, t=3.0, origin="auto", changes={"expert_placement": [1, 2]}),
    ]
    assert knobs_at(now, changes, 4) == now.model_dump()
    assert knobs_at(now, changes, 2) == {**now.model_dump(), "max_num_seqs": 6, "policy": "fcfs"}
    assert knobs_at(now, changes, 1)["max_num_seqs"] == 8
