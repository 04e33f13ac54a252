"""The twin's simulator: the engine's own Scheduler and BlockManager on a simulated clock.

Requests arrive from a trace; each step is scheduled by the real scheduler, costs what the
cost model predicts for its composition and expert loads, and is accounted for exactly as
the engine does (`Scheduler.advance`, then one token per sampling chunk, finishing at the
recorded output length). Requests share no prefix (each gets distinct token ids, as reruns
send distinct random prompts), but with prefix caching on a request preempted by recompute
finds its own full blocks again, as it does in the engine.
"""

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import torch

import stats
from engine.config import Batching, CacheConfig
from engine.ep.placement import Placement, gather_bytes, imbalance
from engine.knobs import Knobs
from engine.kv_cache import BlockManager
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.step_telemetry import StepStats, expert_counts_info, step_telemetry
from engine.telemetry import A2AInfo, Durations, RequestRecord, StepTelemetry
from tuning.twin.experts import ExpertDraw
from tuning.twin.features import batch_features, capacity, kept, moe_features
from tuning.twin.trace import TraceItem

PARAMS = {"temperature": 0.0, "ignore_eos": True}
MAX_STEPS = 2_000_000  # a guard against a schedule that never ends
QUEUE_MARKS = (0.5, 1.0)  # where the queue is read, as shares of the arrivals' span (horizon)


class StepCost(Protocol):
    """What a step of given FEATURES costs (`cost_model.CostModel`, or recorded durations)."""

    def step_ms(self, x: np.ndarray) -> float: ...

    def period_ms(self, x: np.ndarray) -> float: ...

    def outside(self, x: np.ndarray) -> list[str]: ...


@dataclass
class Setup:
    """What the simulated engine is: its cache, batching, expert placement and row size."""

    cache: CacheConfig
    batching: Batching
    placement: Placement
    row_bytes: int  # hidden size x element size: one token row in the all-to-all
    max_model_len: int


class Cut(NamedTuple):
    """How far a request still unfinished at the end got, in ms: its TTFT and TPOT so far (None
    before its first and second token), and its time since arrival."""

    ttft_ms: float | None
    tpot_ms: float | None
    waited_ms: float


class Loads(NamedTuple):
    """What a step's routed pairs [layers, experts] come to under the capacity cut and the
    placement."""

    counts: np.ndarray
    kept: np.ndarray
    ranks: np.ndarray | None  # kept pairs [layers, ranks]; None with one rank
    moved: np.ndarray  # bytes [from][to]
    moe: list[float]  # the MOE features
    routed: int
    dropped: int


@dataclass
class SimResult:
    records: list[RequestRecord]  # one per request that ended
    steps: list[StepTelemetry]  # when asked for
    unfinished: int  # requests still queued or running at the end
    peak_kv_blocks: int
    preemptions: int
    routed_pairs: int
    dropped_pairs: int
    queue_at_end: int  # waiting at the last simulated step
    outside_steps: int  # steps beyond what the cost model saw
    outside: dict[str, int] = field(default_factory=dict)  # feature -> steps beyond it
    num_steps: int = 0
    end_s: float = 0.0  # the simulated clock at the end
    cut: list[Cut] = field(default_factory=list)  # the unfinished requests, as far as they got
    # (time, requests waiting or swapped) at QUEUE_MARKS of the span of arrivals within the
    # horizon: whether the queue grows (tuning.twin.bands.builds)
    queued_at: list[tuple[float, int]] = field(default_factory=list)


def simulate(
    trace: list[TraceItem],
    knobs: Knobs,
    setup: Setup,
    model: StepCost,
    experts: ExpertDraw,
    horizon_s: float | None = None,
    keep_steps: bool = False,
    t0: float = 0.0,
) -> SimResult:
    """Run `trace` under `knobs` until every request ends (or the clock passes `horizon_s`)."""
    sim = _Sim(trace, knobs, setup, model, experts, keep_steps, t0)
    sim.run(horizon_s)
    return sim.result


def cut_at(req: Request, now: float) -> Cut:
    """How far `req` got by `now`."""
    times = req.token_times
    tpot = stats.tpot_span(times[0], times[-1], len(times)) if times else None
    ttft = req.ttft_s
    return Cut(
        None if ttft is None else 1000 * ttft,
        None if tpot is None else 1000 * tpot,
        1000 * (now - req.arrival),
    )


class _Sim:
    def __init__(
        self,
        trace: list[TraceItem],
        knobs: Knobs,
        setup: Setup,
        model: StepCost,
        experts: ExpertDraw,
        keep_steps: bool,
        t0: float,
    ) -> None:
        cache = setup.cache
        blocks = BlockManager(
            cache.num_blocks, cache.block_size, cache.num_host_blocks, cache.enable_prefix_caching
        )
        blocks.set_usable(knobs.kv_capacity_blocks or cache.num_blocks)
        self.scheduler = Scheduler(blocks, knobs, setup.batching)
        self.setup, self.model, self.experts = setup, model, experts
        self.trace, self.next = trace, 0
        self.keep_steps, self.t0, self.clock = keep_steps, t0, 0.0
        self.result = SimResult([], [], 0, 0, 0, 0, 0, 0, 0)

    def run(self, horizon_s: float | None) -> None:
        sch, res = self.scheduler, self.result
        last = max((t.offset_s for t in self.trace), default=0.0)
        span = last if horizon_s is None else min(last, horizon_s)
        marks = [share * span for share in QUEUE_MARKS] if span > 0 else []
        for _ in range(MAX_STEPS):
            while marks and self.clock >= marks[0]:
                res.queued_at.append((marks.pop(0), len(sch.waiting) + len(sch.swapped)))
            if horizon_s is not None and self.clock >= horizon_s:
                break
            arrived = self._admit_arrivals()
            if not sch.num_unfinished:
                if self.next >= len(self.trace):
                    break
                self.clock = self.trace[self.next].offset_s
                continue
            out = sch.schedule()
            if not out.chunks and not self._wait_for_arrival():
                break  # nothing can ever run (a request larger than the cache)
            if out.chunks:
                self._step(out, arrived)
        res.queued_at += [(mark, len(sch.waiting) + len(sch.swapped)) for mark in marks]
        res.unfinished = sch.num_unfinished
        res.queue_at_end = len(sch.waiting)
        res.end_s = self.clock
        res.cut = [cut_at(req, self.clock) for req in (*sch.running, *sch.swapped, *sch.waiting)]

    def _admit_arrivals(self) -> int:
        n = 0
        while self.next < len(self.trace) and self.trace[self.next].offset_s <= self.clock:
            item = self.trace[self.next]
            params = SamplingParams(
                max_tokens=max(1, item.output_len), priority=item.priority, **PARAMS
            )
            size = min(max(1, item.prompt_len), self.setup.max_model_len - 1)
            first = (self.next + 1) * self.setup.max_model_len  # ids no other request has
            prompt = list(range(first, first + size))
            req = Request(prompt, params, f"sim-{self.next}", item.offset_s)
            if item.computed:
                self.scheduler.resume(req, min(item.computed, size - 1))
            else:
                self.scheduler.add(req)
            self.next += 1
            n += 1
        return n

    def _wait_for_arrival(self) -> bool:
        """Jump to the next arrival when nothing could run; False when none is left."""
        if self.next >= len(self.trace):
            return False
        self.clock = max(self.clock, self.trace[self.next].offset_s)
        return True

    def _step(self, out: SchedulerOutput, arrived: int) -> None:
        res = self.result
        tokens = out.num_prefill_tokens + out.num_decode_tokens
        loads = self._loads(self.experts.draw(tokens), tokens)
        slots = [
            {
                "phase": "prefill" if c.is_prefill else "decode",
                "tokens": c.num_tokens,
                "ctx": c.start + c.num_tokens,
            }
            for c in out.chunks
        ]
        x = np.array(batch_features(slots) + loads.moe)  # the step's FEATURES
        self._note_outside(x)
        step_ms = self.model.step_ms(x)
        self.clock += self.model.period_ms(x) / 1000
        finished = self._advance(out)
        res.num_steps += 1
        res.peak_kv_blocks = max(res.peak_kv_blocks, self.scheduler.blocks.num_used)
        res.preemptions += len(out.preempted)
        res.routed_pairs += loads.routed
        res.dropped_pairs += loads.dropped
        if self.keep_steps:
            res.steps.append(self._telemetry(out, finished, arrived, loads, step_ms, tokens))

    def _loads(self, counts: np.ndarray, tokens: int) -> Loads:
        """The Loads of `counts`, drawn for a step of `tokens` (a size the draw hands each
        array out for alone): worked out once for each array, capacity factor and placement,
        for every run on this draw (the MoE features were a fifth of the twin's CPU)."""
        factor = self.scheduler.knobs.expert_capacity_factor
        placement = self.setup.placement
        # the placement itself, not its id: the key holds it, so no other takes its id
        key = (id(counts), factor, placement, placement.version, self.setup.row_bytes)
        known = self.experts.loads.get(key)
        if known is None:
            cap = capacity(factor, tokens, self.experts.top_k, counts.shape[1])
            kept_counts = kept(counts, cap)
            ranks, moved = self._traffic(kept_counts, tokens)
            rank_pairs = None if ranks is None else ranks.sum(axis=0)
            moe = moe_features(kept_counts, rank_pairs, int(moved.sum()))
            dropped = int((counts - kept_counts).sum())
            known = Loads(counts, kept_counts, ranks, moved, moe, int(counts.sum()), dropped)
            self.experts.loads[key] = known
        return known

    def _advance(self, out: SchedulerOutput) -> list[Request]:
        """The engine's bookkeeping after a step; the requests that finished in it."""
        self.scheduler.advance(out)
        finished = []
        for chunk in out.chunks:
            req = chunk.req
            if not chunk.sample:
                continue
            req.append_token(0, self.clock)
            if len(req.output_token_ids) >= req.params.max_tokens:
                self.scheduler.finish(req, "length")
                finished.append(req)
                self.result.records.append(req.end_record(self.clock))
        return finished

    def _traffic(
        self, kept_counts: np.ndarray, tokens: int
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Kept pairs [layers, ranks] (None with one rank) and the bytes [from][to] that the
        all-to-alls and all-gathers move, modeled from the placement."""
        placement = self.setup.placement
        ep = placement.ep_size
        if ep == 1:
            return None, np.zeros((1, 1))
        loads = np.stack(
            [
                lp.rank_loads(torch.from_numpy(c)).numpy()
                for lp, c in zip(placement.layers, kept_counts, strict=True)
            ]
        )
        # rows are spread evenly over source ranks: a pair leaves its rank with odds (ep-1)/ep
        remote = loads.sum() * (ep - 1) / ep
        dispatch = np.full((ep, ep), 2 * remote * self.setup.row_bytes / (ep * (ep - 1)))
        np.fill_diagonal(dispatch, 0)
        layers = kept_counts.shape[0]
        gathered = np.asarray(gather_bytes(ep, tokens, layers, self.setup.row_bytes))
        return loads, dispatch + gathered

    def _note_outside(self, x: np.ndarray) -> None:
        names = self.model.outside(x)
        if names:
            self.result.outside_steps += 1
            for name in names:
                self.result.outside[name] = self.result.outside.get(name, 0) + 1

    def _telemetry(
        self,
        out: SchedulerOutput,
        finished: list[Request],
        arrived: int,
        loads: Loads,
        step_ms: float,
        tokens: int,
    ) -> StepTelemetry:
        ep = self.setup.placement.ep_size
        counts, ranks, moved = loads.counts, loads.ranks, loads.moved
        dropped = (counts - loads.kept).sum(axis=1).tolist()
        a2a = A2AInfo(
            ep_size=ep,
            mode="modeled",
            bytes=np.rint(moved).astype(int).tolist() if ep > 1 else [[0]],
            rank_tokens=[] if ranks is None else np.rint(ranks.sum(axis=0)).astype(int).tolist(),
            imbalance=1.0 if ranks is None else imbalance(torch.from_numpy(ranks)),
            placement_version=self.setup.placement.version,
        )
        ms = round(step_ms, 3)
        return step_telemetry(
            StepStats(
                session="twin",
                knobs_version=1,
                t=self.t0 + self.clock,
                sched=out,
                scheduler=self.scheduler.stats(),
                arrived=arrived,
                finished=finished,
                knob_changes=[],
                dur_ms=Durations(
                    schedule=0.0, prepare=0.0, forward=ms, moe=0.0, sample=0.0, total=ms
                ),
                experts=expert_counts_info(torch.from_numpy(counts), dropped, self.experts.top_k),
                a2a=a2a,
            )
        )
