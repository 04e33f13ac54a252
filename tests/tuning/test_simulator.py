"""The twin's simulator makes the engine's scheduling decisions when it is given the engine's
own step durations."""

import importlib
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_attribution import EXPERTS, Cost, sim_setup

import stats
from engine import LLMEngine, SamplingParams
from engine.ep.placement import Placement
from engine.knobs import Knobs
from tuning.twin.experts import ExpertDraw, routing
from tuning.twin.features import capacity, kept
from tuning.twin.outcome import slo_scores
from tuning.twin.simulator import Setup, simulate
from tuning.twin.trace import TraceItem
from tuning.twin.whatif import sim_outcome

MODEL = "synthetic:tiny"
# small enough that requests queue for slots, chunk their prompts and get preempted
ENGINE = {"num_kv_blocks": 16, "block_size": 8}
KNOB_SETS = [
    {"max_num_seqs": 3, "max_num_batched_tokens": 48, "prefill_chunk_size": 16},
    {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "prefill_chunk_size": 64,
        "policy": "shortest_first",
        "preemption_mode": "swap",
    },
    {
        "max_num_seqs": 6,
        "max_num_batched_tokens": 40,
        "prefill_chunk_size": 24,
        "policy": "priority",
        "kv_watermark": 0.1,
    },
]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    engine_tests = str(Path(__file__).parents[1] / "engine")  # the checkpoint writers
    sys.path.insert(0, engine_tests)
    try:
        checkpoints = importlib.import_module("hf_checkpoints")
    finally:
        sys.path.remove(engine_tests)
    return Path(checkpoints.make_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt_oss"), seed=3))


class RecordedCost:
    """Each simulated step costs what the engine's step of the same number took."""

    def __init__(self, durations_ms: list[float]) -> None:
        self.durations = durations_ms

    def step_ms(self, x: np.ndarray, step: int) -> float:
        return self.durations[step]

    def period_ms(self, x: np.ndarray, step: int) -> float:
        return self.durations[step]

    def periods_ms(self, xs: np.ndarray, first: int) -> np.ndarray:
        return np.array(self.durations[first : first + len(xs)])

    def outside(self, x: np.ndarray) -> list[str]:
        return []


def workload(seed: int) -> list[tuple[int, int, int, int]]:
    """(arrival step, prompt length, output length, priority) of 10 requests."""
    rng = random.Random(seed)
    arrivals = sorted(rng.randrange(0, 12) for _ in range(10))
    return [(a, rng.randrange(3, 70), rng.randrange(2, 24), rng.randrange(-2, 3)) for a in arrivals]


def run_engine(
    knobs: dict[str, Any],
    work: list[tuple[int, int, int, int]],
    caching: bool = False,
    model: str = MODEL,
) -> tuple[list[dict[str, Any]], list[TraceItem]]:
    """Drive the engine on a clock that each step advances by its own measured duration;
    a request arrives at the clock's value when the engine reaches its arrival step (at
    once if the engine is idle). Returns the telemetry and the trace as arrived."""
    engine = LLMEngine(model=model, **ENGINE, enable_prefix_caching=caching, **knobs)
    vocab = min(256, engine.model_config.vocab_size)
    rng = random.Random(1)
    clock, steps, trace, pending = 0.0, [], [], list(work)
    while pending or engine.has_unfinished():
        while pending and (pending[0][0] <= len(steps) or not engine.has_unfinished()):
            _, prompt_len, output_len, priority = pending.pop(0)
            params = SamplingParams(
                max_tokens=output_len, temperature=0.0, ignore_eos=True, priority=priority
            )
            engine.add_request(
                [rng.randrange(vocab) for _ in range(prompt_len)], params, arrival=clock
            )
            trace.append(TraceItem(clock, prompt_len, output_len, priority))
        record = engine.step().telemetry.model_dump()
        clock += record["dur_ms"]["total"] / 1000
        steps.append(record)
    return steps, trace


def engine_setup(caching: bool, model: str = MODEL, knobs: dict[str, Any] | None = None) -> Setup:
    """The simulated twin of the engine `run_engine` drives (its cache as the engine sized it
    for `knobs`: a sliding-window model's window pool depends on them)."""
    engine = LLMEngine(model=model, **ENGINE, enable_prefix_caching=caching, **(knobs or {}))
    cfg = engine.model_config
    engine.close()
    return Setup(
        engine.config.cache,
        "continuous",
        Placement.contiguous(cfg.num_layers, cfg.num_experts, 1),
        cfg.hidden_size * 4,
        cfg.max_model_len,
        cfg.sliding_window,
    )


def decisions(steps: list[dict[str, Any]], ids: dict[str, int]) -> list[Any]:
    """Per step: each chunk as (request by arrival, phase, tokens, ctx), and the preemptions."""
    return [
        (
            [(ids[s["req"]], s["phase"], s["tokens"], s["ctx"]) for s in step["batch"]["slots"]],
            step["queue"]["preempted"],
            step["queue"]["finished"],
        )
        for step in steps
    ]


@pytest.mark.parametrize("knobs", KNOB_SETS)
@pytest.mark.parametrize(("seed", "caching"), [(0, False), (1, False), (2, True), (3, True)])
def test_simulator_schedules_as_the_engine_did(
    knobs: dict[str, Any], seed: int, caching: bool
) -> None:
    """With prefix caching on, a request preempted by recompute finds its own blocks again
    in both (the prompts share no prefix)."""
    check_simulated_as_run(knobs, seed, caching, MODEL)


def check_simulated_as_run(knobs: dict[str, Any], seed: int, caching: bool, model: str) -> None:
    """The simulator, given the engine's step durations, makes each of its decisions."""
    steps, trace = run_engine(knobs, workload(seed), caching, model)
    engine_ids = {}
    for step in steps:
        for slot in step["batch"]["slots"]:
            engine_ids.setdefault(slot["req"], int(slot["req"].split("-")[1]))
    order = {rid: i for i, rid in enumerate(sorted(engine_ids, key=engine_ids.get))}

    setup = engine_setup(caching, model, knobs)
    durations = [s["dur_ms"]["total"] for s in steps]
    full = Knobs.model_validate({**Knobs().model_dump(), **knobs})
    sim = simulate(
        trace, full, setup, RecordedCost(durations), ExpertDraw(routing(steps)), keep_steps=True
    )
    sim_steps = [s.model_dump() for s in sim.steps]
    sim_ids = {f"sim-{i}": i for i in range(len(trace))}

    assert decisions(sim_steps, sim_ids) == decisions(steps, order)
    assert sim.unfinished == 0 and len(sim.records) == len(trace)
    assert sim.peak_kv_blocks == max(s["kv"]["used"] for s in steps)
    assert sim.preemptions == sum(s["queue"]["preempted"] for s in steps)
    assert sim.end_s == pytest.approx(sum(durations) / 1000)
    kv = ("used", "window_used", "behind_window")
    assert [[s["kv"][k] for k in kv] for s in sim_steps] == [
        [s["kv"][k] for k in kv] for s in steps
    ]


@pytest.mark.parametrize("knobs", KNOB_SETS[:2])
@pytest.mark.parametrize("caching", [False, True])
def test_a_sliding_window_model_is_simulated_with_its_window_pool(
    gpt_oss: Path, knobs: dict[str, Any], caching: bool
) -> None:
    """gpt-oss's sliding layers keep a pool of their own that gives back blocks behind the
    window: the simulator keeps the same two pools, so each step holds, and gives back, the
    blocks the engine's did in both (with one pool the window's columns read 0)."""
    check_simulated_as_run(knobs, 0, caching, str(gpt_oss))


def test_a_capacity_factor_drops_exactly_what_the_recorded_loads_would() -> None:
    """The scheduling knobs stay the recording's, so every simulated step has a recorded step
    of its size, and the capacity cut applies to the loads the engine routed."""
    knobs = KNOB_SETS[0]
    steps, trace = run_engine(knobs, workload(0))
    setup = engine_setup(caching=False)
    full = Knobs.model_validate({**Knobs().model_dump(), **knobs, "expert_capacity_factor": 1.0})
    durations = [s["dur_ms"]["total"] for s in steps]
    sim = simulate(trace, full, setup, RecordedCost(durations), ExpertDraw(routing(steps)))

    dropped = 0
    for s in steps:
        counts = np.asarray(s["experts"]["counts"])
        tokens = sum(slot["tokens"] for slot in s["batch"]["slots"])
        cap = capacity(1.0, tokens, s["experts"]["top_k"], counts.shape[1])
        dropped += int((counts - kept(counts, cap)).sum())
    assert dropped > 0
    assert sim.dropped_pairs == dropped
    assert sim.routed_pairs == sum(int(np.sum(s["experts"]["counts"])) for s in steps)


def test_a_draw_shared_by_runs_gives_each_what_a_fresh_draw_would() -> None:
    """What the simulator keeps per drawn array (kept pairs, traffic, MoE features) is reused
    across runs on one draw only under the same capacity factor and placement: a run under
    another factor, or on two ranks, sees what it would on a draw of its own."""
    knobs = KNOB_SETS[0]
    steps, trace = run_engine(knobs, workload(0))
    one_rank = engine_setup(caching=False)
    layers, experts = np.asarray(steps[0]["experts"]["counts"]).shape
    placement = Placement.contiguous(layers, experts, 2)
    two_ranks = Setup(one_rank.cache, "continuous", placement, 64, one_rank.max_model_len)
    durations = [s["dur_ms"]["total"] for s in steps]
    shared = ExpertDraw(routing(steps))

    def run(factor: float | None, setup: Setup, draw: ExpertDraw) -> list[Any]:
        full = Knobs.model_validate({**Knobs().model_dump(), **knobs})
        full = full.model_copy(update={"expert_capacity_factor": factor})
        sim = simulate(trace, full, setup, RecordedCost(durations), draw, keep_steps=True)
        return [sim.dropped_pairs, [(s.a2a.bytes, s.a2a.rank_tokens) for s in sim.steps]]

    runs = [(None, one_rank), (1.0, one_rank), (None, two_ranks), (None, one_rank)]
    got = [run(factor, setup, shared) for factor, setup in runs]
    assert got == [run(factor, setup, ExpertDraw(routing(steps))) for factor, setup in runs]
    assert got[1][0] > 0 == got[0][0]  # the factor drops pairs
    assert got[2][1] != got[0][1]  # two ranks move bytes


def test_a_request_with_its_kv_in_place_decodes_on_where_another_prefills_again() -> None:
    """A live engine's running request (1500 tokens, all but the last in KV) takes one token's
    step to its next token; the same request without its KV prefills 1500 tokens first."""
    setup, knobs = sim_setup(16, 256), Knobs()
    cost = Cost(2.0, per_prefill=0.01)
    kept_kv = simulate([TraceItem(0.0, 1500, 4, computed=1499)], knobs, setup, cost, EXPERTS)
    again = simulate([TraceItem(0.0, 1500, 4)], knobs, setup, cost, EXPERTS)
    assert kept_kv.records[0].ttft_ms == pytest.approx(2.01)
    assert kept_kv.num_steps == 4
    assert again.records[0].ttft_ms == pytest.approx(3 * 2.0 + 15.0)  # three 512-token chunks


def test_requests_cut_off_at_the_horizon_are_judged_as_far_as_they_got() -> None:
    """One request decodes and another waits for the only slot: at a 50 ms horizon the first
    counts by its TTFT and TPOT so far, the second only once its wait passed the TTFT
    target, as a miss."""
    setup, knobs = sim_setup(16, 256), Knobs(max_num_seqs=1)
    trace = [TraceItem(0.0, 16, 100), TraceItem(0.01, 16, 100)]
    result = simulate(trace, knobs, setup, Cost(2.0), EXPERTS, horizon_s=0.05)
    assert result.unfinished == 2 and not result.records
    decoding, waiting = result.cut
    assert decoding.ttft_ms == pytest.approx(2.0) and decoding.tpot_ms == pytest.approx(2.0)
    assert decoding.waited_ms == pytest.approx(1000 * result.end_s)
    assert waiting.ttft_ms is None and waiting.tpot_ms is None
    assert waiting.waited_ms == pytest.approx(1000 * result.end_s - 10)
    out = sim_outcome(result)

    def attainment(ttft: float, tpot: float) -> float | None:
        return slo_scores(out, stats.SLO(ttft=ttft, tpot=tpot))["slo_attainment"]

    assert attainment(100, 5) == 1.0  # the waiting one may yet make it: left out
    assert attainment(30, 5) == 0.5  # it waited 40 ms, past a 30 ms target: a miss
    assert attainment(100, 1) == 0.0  # the decoding one's 2 ms a token misses 1 ms
