"""The twin's simulator: the engine's own Scheduler and BlockManager on a simulated clock.

Requests arrive from a trace; each step is scheduled by the real scheduler, costs what the
cost model predicts for its composition and expert loads, and is accounted for exactly as
the engine does (`Scheduler.advance`, then one token per sampling chunk, finishing at the
recorded output length). Stretches in which the scheduler's decision is known without
asking it (every running request decodes its next token: nothing waiting or swapped could
start, the KV cache holds the stretch's growth) are coasted through:
their steps are costed together and their bookkeeping done at once, with the same result
as stepping (the most steps of a what-if are such, and stepping them was most of its time).
Requests share no prefix (each gets distinct token ids, as reruns send distinct random
prompts), but with prefix caching on a request preempted by recompute finds its own full
blocks again, as it does in the engine.
"""

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import torch

import stats
from engine.config import Batching, CacheConfig
from engine.ep.placement import Placement, gather_bytes, imbalance
from engine.knobs import Knobs
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.step_telemetry import StepStats, expert_counts_info, step_telemetry
from engine.telemetry import A2AInfo, Durations, RequestRecord, StepTelemetry
from engine.window_pool import block_manager
from tuning.twin.experts import ExpertDraw
from tuning.twin.features import FEATURES, capacity, chunk_features, kept, moe_features
from tuning.twin.trace import TraceItem

PARAMS = {"temperature": 0.0, "ignore_eos": True}
MAX_STEPS = 2_000_000  # a guard against a schedule that never ends
COAST_WINDOW = 16  # decode steps costed together at first when coasting


class StepCost(Protocol):
    """What the simulation's step number `step` of FEATURES `x` costs (`cost_model.CostModel`,
    a draw of it, or recorded durations): its own time, and its period (how far it moves the
    clock). `periods_ms` gives the periods of consecutive steps `first`, `first` + 1, ... with
    FEATURES rows `xs`. `outside` is monotone: a row no larger than one with nothing outside
    has nothing outside either."""

    def step_ms(self, x: np.ndarray, step: int) -> float: ...

    def period_ms(self, x: np.ndarray, step: int) -> float: ...

    def periods_ms(self, xs: np.ndarray, first: int) -> np.ndarray: ...

    def outside(self, x: np.ndarray) -> list[str]: ...


@dataclass
class Setup:
    """What the simulated engine is: its cache, batching, expert placement and row size."""

    cache: CacheConfig
    batching: Batching
    placement: Placement
    row_bytes: int  # hidden size x element size: one token row in the all-to-all
    max_model_len: int
    sliding_window: int = 0  # positions a sliding layer reads (its own pool: cache.window_blocks)


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


@functools.cache
def sampling(max_tokens: int, priority: int) -> SamplingParams:
    """The (frozen) SamplingParams of simulated requests, made once for every run: checking
    them was a tenth of admitting a request."""
    return SamplingParams(max_tokens=max_tokens, priority=priority, **PARAMS)


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
        blocks = block_manager(cache, setup.sliding_window)
        blocks.set_usable(knobs.kv_capacity_blocks or cache.num_blocks)
        self.scheduler = Scheduler(blocks, knobs, setup.batching)
        self.setup, self.model, self.experts = setup, model, experts
        self.trace, self.next = trace, 0
        self.keep_steps, self.t0, self.clock = keep_steps, t0, 0.0
        self.result = SimResult([], [], 0, 0, 0, 0, 0, 0, 0)

    def run(self, horizon_s: float | None) -> None:
        sch, res = self.scheduler, self.result
        for _ in range(MAX_STEPS):
            if horizon_s is not None and self.clock >= horizon_s:
                break
            arrived = self._admit_arrivals()
            if not sch.num_unfinished:
                if self.next >= len(self.trace):
                    break
                self.clock = self.trace[self.next].offset_s
                continue
            if not self.keep_steps and self._coast(horizon_s):
                continue
            out = sch.schedule()
            if not out.chunks and not self._wait_for_arrival():
                break  # nothing can ever run (a request larger than the cache)
            if out.chunks:
                self._step(out, arrived)
        res.unfinished = sch.num_unfinished
        res.queue_at_end = len(sch.waiting)
        res.end_s = self.clock
        res.cut = [cut_at(req, self.clock) for req in (*sch.running, *sch.swapped, *sch.waiting)]

    def _admit_arrivals(self) -> int:
        n = 0
        while self.next < len(self.trace) and self.trace[self.next].offset_s <= self.clock:
            item = self.trace[self.next]
            params = sampling(max(1, item.output_len), item.priority)
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
        step = out.step
        tokens = out.num_prefill_tokens + out.num_decode_tokens
        loads = self._loads(self.experts.draw(tokens), tokens)
        x = np.array(chunk_features(out.chunks) + loads.moe)  # the step's FEATURES
        self._note_outside(x)
        self.clock += self.model.period_ms(x, step) / 1000
        finished = self._advance(out)
        res.num_steps += 1
        res.peak_kv_blocks = max(res.peak_kv_blocks, self.scheduler.blocks.num_used)
        res.preemptions += len(out.preempted)
        res.routed_pairs += loads.routed
        res.dropped_pairs += loads.dropped
        if self.keep_steps:
            step_ms = self.model.step_ms(x, step)
            res.steps.append(self._telemetry(out, finished, arrived, loads, step_ms, tokens))

    def _coast(self, horizon_s: float | None) -> bool:
        """Run the next steps, while the scheduler's decision is known, without asking it:
        each running request decodes one token, until one of them ends, the next arrival or
        the horizon comes, or the KV cache could not hold another step's growth. False (and
        nothing done) when fewer than two steps are so known."""
        sch, blocks = self.scheduler, self.scheduler.blocks
        running = sch.running
        steps = self._coastable()
        if steps < 2:
            return False
        bound = min(
            self.trace[self.next].offset_s if self.next < len(self.trace) else math.inf,
            math.inf if horizon_s is None else horizon_s,
        )
        times, loads = self._coast_clock(len(running), steps, bound)
        k = len(times)
        if k < 2:
            return False
        self.experts.skip(len(running), k)
        sch.step_count += k
        self.clock = times[-1]
        res = self.result
        order = sorted(running, key=sch.policy_key)  # as the scheduler lists their chunks
        last = 0  # blocks taken by the last step: stepping, the peak came before it
        size = blocks.block_size
        for req in order:
            before = max(len(req.block_table), -(-(req.num_computed_tokens + k - 1) // size))
            blocks.allocate(req, k)
            last += len(req.block_table) - before
            req.output_token_ids += [0] * k  # the tokens first: the blocks' hashes read them
            req.all_token_ids += [0] * k
            req.token_times += times
            req.num_computed_tokens += k
            blocks.register_full_blocks(req)
        res.peak_kv_blocks = max(res.peak_kv_blocks, blocks.num_used - last)
        for req in [r for r in order if len(r.output_token_ids) >= r.params.max_tokens]:
            sch.finish(req, "length")
            res.records.append(req.end_record(self.clock))
        res.num_steps += k
        res.peak_kv_blocks = max(res.peak_kv_blocks, blocks.num_used)
        res.routed_pairs += sum(load.routed for load in loads)
        res.dropped_pairs += sum(load.dropped for load in loads)
        return True

    def _coastable(self) -> int:
        """How many steps from now the scheduler surely schedules one decode token of every
        running request and nothing else: none when one prefills or one swapped or waiting
        could start; else until the first of them ends, or the KV cache runs out."""
        sch, blocks = self.scheduler, self.scheduler.blocks
        running, knobs = sch.running, sch.knobs
        n = len(running)
        if (
            not n
            or blocks.window
            or n > knobs.max_num_seqs
            or n > knobs.max_num_batched_tokens
            or any(r.num_pending_tokens != 1 or not r.output_token_ids for r in running)
            or not self._held_back()
        ):
            return 0
        steps = min(r.params.max_tokens - len(r.output_token_ids) for r in running)
        # each request takes at most a block per block_size steps: check exactly only when
        # that could run out
        if n * -(-steps // blocks.block_size) <= blocks.num_allocatable:
            return steps
        held = sum(len(r.block_table) for r in running)
        tokens = np.array([r.num_computed_tokens for r in running])
        ahead = np.arange(1, steps + 1)
        need = (-(-(tokens[:, None] + ahead[None, :]) // blocks.block_size)).sum(axis=0) - held
        return int(np.searchsorted(need, blocks.num_allocatable, side="right"))

    def _held_back(self) -> bool:
        """Whether no swapped or waiting request can start while the running ones decode: the
        scheduler's own checks (`Scheduler._schedule_swapped`, `_admit`) made once, for a
        stretch of decodes only takes blocks and leaves the token budget as it is, so what
        they refuse now they refuse to its end. Not so for a waiting request with blocks in
        the prefix cache (losing them to eviction can shrink its prefill): that one is
        asked each step."""
        sch = self.scheduler
        n, knobs = len(sch.running), sch.knobs
        if n >= knobs.max_num_seqs or not (sch.swapped or sch.waiting):
            return True
        budget = knobs.max_num_batched_tokens - n
        if sch.swapped:  # they go first; nothing is admitted while one is left
            head = sch.swapped[0]
            tokens = sch._chunk_len(head, budget, head.in_prefill)
            return tokens == 0 or not sch.blocks.can_swap_in(head, tokens, sch._watermark())
        if sch.batching == "static":
            return True  # the batch runs to its end
        head = sch._waiting_head()
        if sch.blocks.prefix_match(head):
            return False
        return sch._admit(head, budget, 0, False).blocked is not None

    def _coast_clock(self, n: int, steps: int, bound: float) -> tuple[list[float], list[Loads]]:
        """The clock after each of at most `steps` decode steps of the `n` running requests,
        stopping before a step that would start at or after `bound`, and the steps' Loads.
        Costed COAST_WINDOW steps at a time, doubling: most stretches end at an arrival after
        a few steps, long before their requests would end."""
        sch, running = self.scheduler, self.scheduler.running
        ctx = sum(r.num_computed_tokens for r in running) + n  # the first step's contexts
        times: list[float] = []
        loads: list[Loads] = []
        clock, window = self.clock, COAST_WINDOW
        while len(times) < steps:
            done = len(times)
            m = min(window, steps - done)
            window *= 2
            chunk = [self._loads(c, n) for c in self.experts.ahead(n, m, done)]
            xs = np.empty((m, len(FEATURES)))
            xs[:, :6] = (1.0, 0.0, 0.0, 0.0, n, 0.0)
            xs[:, 5] = (ctx + n * np.arange(done, done + m)) / 1000
            xs[:, 6:] = [load.moe for load in chunk]
            for period in self.model.periods_ms(xs, sch.step_count + done).tolist():
                if times and clock >= bound:  # as stepping: an arrival is admitted first
                    break
                clock += period / 1000
                times.append(clock)
            used = len(times) - done
            loads += chunk[:used]
            self._note_outside_rows(xs[:used])
            if used < m:
                break
        return times, loads

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

    def _note_outside_rows(self, xs: np.ndarray) -> None:
        """`_note_outside` for each row, asking row by row only when their largest values are
        outside (`outside` is monotone)."""
        if len(xs) and self.model.outside(xs.max(axis=0)):
            for x in xs:
                self._note_outside(x)

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
