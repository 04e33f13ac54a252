"""Latency attribution on simulated sessions, where every step's cost is known, so each cause's
share of a request's time has an exact answer."""

from typing import Any

import numpy as np
import pytest

from engine.config import CacheConfig
from engine.ep.placement import Placement
from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.attribution.causes import Timeline, attribute, rounded
from tuning.attribution.summary import over_time, report, summarize
from tuning.twin.experts import ExpertDraw, routing
from tuning.twin.simulator import Setup, simulate
from tuning.twin.trace import TraceItem

EXPERTS = ExpertDraw(routing([{"experts": {"counts": [[1, 1, 0, 0]], "top_k": 2}}]))


class Cost:
    """`base` ms a step, plus `per_prefill` per prefill token and `per_decode` per decode;
    `gap` ms of loop overhead after each step."""

    def __init__(
        self, base: float, per_prefill: float = 0.0, per_decode: float = 0.0, gap: float = 0.0
    ) -> None:
        self.base, self.per_prefill, self.per_decode, self.gap = base, per_prefill, per_decode, gap

    def step_ms(self, x: np.ndarray, step: int = 0) -> float:
        return self.base + self.per_prefill * x[1] + self.per_decode * x[4]

    def period_ms(self, x: np.ndarray, step: int = 0) -> float:
        return self.step_ms(x) + self.gap

    def periods_ms(self, xs: np.ndarray, first: int = 0) -> np.ndarray:
        return self.base + self.per_prefill * xs[:, 1] + self.per_decode * xs[:, 4] + self.gap

    def outside(self, x: np.ndarray) -> list[str]:
        return []

    def times(self, factor: float) -> "Cost":
        """Every step and gap `factor` times as long."""
        return Cost(*(factor * v for v in (self.base, self.per_prefill, self.per_decode, self.gap)))


def sim_setup(block_size: int, blocks: int) -> Setup:
    """One layer of four experts, no prefix caching, a 4096-token context."""
    cache = CacheConfig(block_size=block_size, num_blocks=blocks, enable_prefix_caching=False)
    return Setup(cache, "continuous", Placement.contiguous(1, 4, 1), 64, 4096)


def timeline_of(d: dict[str, Any]) -> Timeline:
    """A Timeline back from `as_dict` (what the summaries read)."""
    return Timeline(
        d["req"],
        d["arrival"],
        d["end"],
        d["ttft_ms"],
        d["e2e_ms"],
        d["output_len"],
        ttft=d["ttft"],
        after=d["after_first_token"],
    )


def run(
    trace: list[tuple[float, int, int]], cost: Cost, blocks: int = 256, **knobs: Any
) -> dict[str, dict[str, Any]]:
    """Simulate (arrival s, prompt, output) requests; each one's timeline as a dict, by id."""
    setup = sim_setup(8, blocks)
    full = Knobs.model_validate({**Knobs().model_dump(), "max_num_seqs": 8, **knobs})
    items = [TraceItem(t, p, o) for t, p, o in trace]
    sim = simulate(items, full, setup, cost, EXPERTS, keep_steps=True)
    assert sim.unfinished == 0
    records = [r.model_dump() for r in sim.records]
    timelines = attribute(records, [s.model_dump() for s in sim.steps])
    return {t.req: t.as_dict() for t in timelines}


def test_one_slot_five_requests_together_wait_for_the_slot() -> None:
    """Each request takes a 10 ms prefill step and three decode steps, one after another."""
    out = run([(0.0, 16, 4)] * 5, Cost(10.0), max_num_seqs=1)
    for i in range(5):
        t = out[f"sim-{i}"]
        queued = {"queue_slots": 40.0 * i} if i else {}
        assert t["ttft"] == pytest.approx({**queued, "prefill": 10.0})
        assert t["ttft_ms"] == pytest.approx(40.0 * i + 10)
        assert t["tpot"] == pytest.approx({"decode": 10.0})


def test_the_prefill_step_is_shared_by_tokens_and_gaps_are_overhead() -> None:
    """Two requests prefill together (24 and 8 tokens, a 40 ms step), then decode; every step
    is followed by 2 ms of loop overhead."""
    out = run([(0.0, 24, 3), (0.0, 8, 3)], Cost(8.0, per_prefill=1.0, gap=2.0))
    a, b = out["sim-0"], out["sim-1"]
    assert a["ttft"] == pytest.approx({"prefill": 30.0, "interference": 10.0, "overhead": 2.0})
    assert b["ttft"] == pytest.approx({"prefill": 10.0, "interference": 30.0, "overhead": 2.0})
    assert a["tpot"] == pytest.approx({"decode": 8.0, "overhead": 2.0})


def test_a_long_prompt_taxes_the_decodes_it_rides_with() -> None:
    """Three short requests decode (13 ms steps) while a 400-token prompt prefills in chunks of
    64 beside them; each chunk adds 0.05 ms a token to their step."""
    cost = Cost(10.0, per_prefill=0.05, per_decode=1.0)
    trace = [(0.0, 8, 40)] * 3 + [(0.1, 400, 2)]
    out = run(trace, cost, prefill_chunk_size=64, max_num_batched_tokens=128)
    taxed = [out[f"sim-{i}"]["after_first_token"] for i in range(3)]
    for after in taxed:
        # seven chunks: six of 64 tokens and one of 16
        assert after["decode_tax"] == pytest.approx(0.05 * 400)
        assert after["decode"] == pytest.approx(13.0 * 39 + 0.05 * 8 * 3 - 0.05 * 400, rel=0.1)
    long = out["sim-3"]
    assert "decode_tax" not in long["tpot"]
    assert long["ttft"]["interference"] > 0


def test_a_tiny_kv_cache_queues_for_blocks() -> None:
    """Each 60-token prompt needs 8 of the 12 blocks: one runs at a time."""
    out = run([(0.0, 60, 8)] * 3, Cost(10.0), blocks=12)
    for i in (1, 2):
        ttft = out[f"sim-{i}"]["ttft"]
        assert set(ttft) == {"queue_kv", "prefill"}
        assert ttft["queue_kv"] == pytest.approx(80.0 * i)


def test_a_request_passed_over_by_the_policy_waits_for_priority() -> None:
    """One slot, shortest_first: a short request holds the slot for 40 ms; a long prompt then
    arrives, then two short ones, which go first. Arrivals during a step wait for it. A step
    in which a later arrival heads the queue or is admitted passes the long prompt over; once
    the last short one holds the slot, the long prompt heads the queue and waits for it."""
    trace = [(0.0, 8, 4), (0.001, 200, 4), (0.002, 8, 4), (0.003, 8, 4)]
    out = run(trace, Cost(10.0), max_num_seqs=1, policy="shortest_first")
    assert out["sim-1"]["ttft"] == pytest.approx(
        {"queue_busy": 9.0, "queue_priority": 80.0, "queue_slots": 30.0, "prefill": 10.0}
    )
    assert out["sim-2"]["ttft"] == pytest.approx(
        {"queue_busy": 8.0, "queue_slots": 30.0, "prefill": 10.0}
    )
    assert out["sim-3"]["ttft"] == pytest.approx(
        {"queue_busy": 7.0, "queue_slots": 70.0, "prefill": 10.0}
    )


def test_recompute_after_preemption_is_preemption_loss() -> None:
    """Two requests fill the cache; as they decode, the newer is preempted, waits, and
    recomputes its prompt and tokens."""
    out = run([(0.0, 30, 20), (0.0, 30, 20)], Cost(10.0), blocks=9)
    hit = out["sim-1"]
    assert out["sim-0"]["ttft"] == pytest.approx({"prefill": 5.0, "interference": 5.0})
    assert hit["after_first_token"]["preemption"] > 10.0 * 10
    assert "preemption" not in out["sim-0"]["after_first_token"]


def test_every_cause_adds_up_to_the_measured_latencies() -> None:
    rng = np.random.default_rng(0)
    trace = [
        (float(t), int(p), int(o))
        for t, p, o in zip(
            np.sort(rng.uniform(0, 2, 40)),
            rng.integers(4, 300, 40),
            rng.integers(1, 40, 40),
            strict=True,
        )
    ]
    cost = Cost(5.0, per_prefill=0.02, per_decode=0.3, gap=1.0)
    out = run(trace, cost, blocks=40, max_num_batched_tokens=256, prefill_chunk_size=64)
    for t in out.values():
        # each cause is rounded to the microsecond
        assert sum(t["ttft"].values()) == pytest.approx(t["ttft_ms"], abs=0.01)
        total = sum(t["ttft"].values()) + sum(t["after_first_token"].values())
        assert total == pytest.approx(t["e2e_ms"], abs=0.01)


def test_steps_recorded_before_version_2_are_refused() -> None:
    with pytest.raises(InvalidInput, match="needs v2") as e:
        attribute([], [{"v": 1, "step": 3, "t": 0.0}])
    assert e.value.param == "session"


def test_the_dominant_cause_of_the_tail_is_named_in_words() -> None:
    """Ten requests through one slot: the tail's TTFT is nearly all the wait for it."""
    setup_out = run([(0.0, 16, 4)] * 10, Cost(10.0), max_num_seqs=1)
    timelines = [timeline_of(t) for t in setup_out.values()]
    summary = summarize(timelines)
    assert summary["requests"] == 10
    # p90 of TTFTs 10, 50, ..., 370 ms is 334: the last request's 360 ms wait of 370
    assert summary["ttft_p90"] == pytest.approx({"queue_slots": 0.973, "prefill": 0.027}, abs=1e-3)
    assert summary["dominant"]["ttft"]["text"] == (
        "97% of p90 TTFT is queueing for a slot: max_num_seqs"
    )
    assert summary["tpot"] == {"decode": 1.0}
    buckets = over_time(timelines, 0.2)
    assert [b["requests"] for b in buckets] == [4, 5, 1]  # ends every 40 ms from 40 to 400
    assert buckets[0]["ttft"]["prefill"] == pytest.approx(10.0)


def test_a_report_holds_the_summary_buckets_and_the_latest_timelines() -> None:
    setup = sim_setup(8, 64)
    knobs = Knobs.model_validate({**Knobs().model_dump(), "max_num_seqs": 1})
    sim = simulate([TraceItem(0.0, 16, 4)] * 6, knobs, setup, Cost(10.0), EXPERTS, keep_steps=True)
    out = report([r.model_dump() for r in sim.records], [s.model_dump() for s in sim.steps], 0.1, 2)
    assert out["requests"] == 6
    assert [t["req"] for t in out["recent"]] == ["sim-4", "sim-5"]
    assert out["recent"][-1]["phases"][0]["cause"] == "queue_slots"
    assert sum(b["requests"] for b in out["over_time"]) == 6


def step_record(i: int, t: float, total_ms: float, slots: list[tuple[str, str, int, int]]) -> dict:
    """A StepTelemetry dict (the fields attribution reads): step `i` ends at `t` after
    `total_ms`; `slots`: (req, phase, tokens, ctx)."""
    prefill = sum(n for _, phase, n, _ in slots if phase == "prefill")
    return {
        "v": 2,
        "step": i,
        "t": t,
        "dur_ms": {"total": total_ms, "moe": 0.0},
        "batch": {
            "num_prefill_tokens": prefill,
            "num_decode_tokens": sum(1 for _, phase, _, _ in slots if phase == "decode"),
            "slots": [
                {"slot": 0, "req": r, "phase": ph, "tokens": n, "ctx": c} for r, ph, n, c in slots
            ],
        },
        "a2a": {"ep_size": 1, "imbalance": 1.0},
        "sched": {"blocked": None, "ahead_arrival": None, "preempted": []},
    }


@pytest.mark.parametrize("overlap", [False, True])
def test_causes_add_up_when_step_spans_overlap(overlap: bool) -> None:
    """A request prefills (8 tokens) in step 0 and decodes in steps 1-5, 10 ms apart. A loaded
    machine stamps a step's `t` up to 3 ms before its `total` stops (so `t - total` reaches
    back into the step before); with overlap, a step's `total` runs from its planning, which
    began while the step before ran (20 ms, two steps' worth). Either way each 10 ms between
    two steps' ends is counted once."""
    late = [0.0, 3.0, 0.0, 3.0, 0.0, 3.0]  # ms between `t` and the end of `total`
    steps = []
    for i in range(6):
        t = 0.010 * (i + 1) - late[i] / 1000
        total = 20.0 if overlap and i else 9.5  # 0.5 ms between steps
        slot = ("r", "prefill", 8, 8) if i == 0 else ("r", "decode", 1, 8 + i)
        steps.append(step_record(i, t, total, [slot]))
    first, end = steps[0]["t"] - 0.0002, steps[5]["t"] - 0.0002  # its tokens' times
    record = {
        "req": "r",
        "arrival": 0.0,
        "finished_t": end,
        "ttft_ms": first * 1000,
        "e2e_ms": end * 1000,
        "output_len": 6,
    }
    (t,) = attribute([record], steps)
    assert sum(t.ttft.values()) == pytest.approx(t.ttft_ms, abs=1e-6)
    assert sum(t.ttft.values()) + sum(t.after.values()) == pytest.approx(t.e2e_ms, abs=1e-6)
    assert rounded(t.ttft) == pytest.approx({"overhead": 0.5, "prefill": 9.3})
    if overlap:  # each step's own time is the 10 ms since the step before ended
        assert rounded(t.after) == pytest.approx({"overhead": 0.2, "decode": 46.8})
    phases = t.phases
    assert all(a.t1 <= b.t0 + 1e-12 for a, b in zip(phases, phases[1:], strict=False))
