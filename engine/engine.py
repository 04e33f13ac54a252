"""LLMEngine: one step = schedule, prepare, forward (attention + grouped MoE), sample, update."""

import numbers
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engine.config import EngineConfig, Knobs, engine_config
from engine.ep.placement import Placement, a2a_bytes, gather_bytes, imbalance, max_replicas
from engine.ep.ranks import Ranks, model_runner
from engine.ep.rebalance import predicted_imbalance, rebalance
from engine.kv_cache import BlockManager
from engine.outputs import RequestOutput, tpot
from engine.request import Request, Status, auto_request_id
from engine.runner import ForwardResult
from engine.sampling import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.telemetry import (
    A2AInfo,
    BatchInfo,
    Durations,
    ExpertInfo,
    KnobChange,
    KVInfo,
    LatencyInfo,
    QueueInfo,
    Slot,
    StepTelemetry,
)


@dataclass
class StepResult:
    outputs: list[RequestOutput]
    telemetry: StepTelemetry


LOAD_WINDOW = 4096  # steps of expert loads kept for rebalancing


class LLMEngine:
    """Continuous-batching MoE engine; `step()` advances every scheduled request by one step.

    With `ep_size` N > 1 and `ep_distributed`, it starts ranks 1..N-1 as processes; call
    `close()` to stop them.
    """

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.config = config or engine_config(**kwargs)
        cfg = self.config
        distributed = cfg.parallel.distributed and cfg.parallel.ep_size > 1
        self.ranks = Ranks(cfg) if distributed else None
        try:
            self.runner, self.tokenizer = model_runner(
                cfg, self.ranks.group if self.ranks else None
            )
        except BaseException:
            self.close()
            raise
        self.model = self.runner.model
        self.model_config = self.model.cfg
        cache = cfg.cache
        self.blocks = BlockManager(
            cache.num_blocks, cache.block_size, cache.num_host_blocks, cache.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}
        self.knobs = self._validate_knobs(cfg.knobs.model_dump())
        self.blocks.set_usable(self.knobs.kv_capacity_blocks or cache.num_blocks)
        self.scheduler = Scheduler(self.blocks, self.knobs, cfg.batching)
        self.sampler = Sampler(cfg.seed)
        self.session = uuid.uuid4().hex[:12]
        self.knobs_version = 1
        self.applied_knobs_version = 1
        self.knob_changes: list[KnobChange] = []
        self._pending_knobs: list[tuple[Knobs, KnobChange]] = []
        self._knob_lock = threading.Lock()
        self._unreported: list[KnobChange] = []
        self._finished_between: list[Request] = []
        self._loads: deque[torch.Tensor] = deque(maxlen=LOAD_WINDOW)
        self._since_rebalance = 0
        self._arrived = 0

    @property
    def placement(self) -> Placement:
        return self.runner.placement

    @property
    def a2a_mode(self) -> Literal["measured", "modeled"]:
        """`measured` when real ranks exchange tokens, else `modeled` from the placement."""
        return "measured" if self.ranks else "modeled"

    @property
    def failure(self) -> str | None:
        """Why the engine cannot step any more (an expert-parallel rank exited), if so."""
        return self.ranks.failure if self.ranks else None

    def wait_failure(self, timeout: float) -> str | None:
        """The failure, waiting up to `timeout` s for a rank's exit to be noticed."""
        return self.ranks.wait_failure(timeout) if self.ranks else None

    def close(self) -> None:
        """Stop the other expert-parallel ranks, if any (the engine cannot step afterwards)."""
        if self.ranks is not None:
            self.ranks.close()

    # requests

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival: float | None = None,
    ) -> str:
        """Queue a request; raises ValueError naming the problem before any state changes."""
        params = params or SamplingParams()
        ids = self.check_request(prompt, params)
        if request_id is None:
            request_id = auto_request_id()
            while request_id in self.requests:  # a caller chose this `req-N` already
                request_id = auto_request_id()
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        elif request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        req = Request(ids, params, request_id, time.time() if arrival is None else arrival)
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        self._arrived += 1
        return req.request_id

    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Tokenize and validate a request without queueing it; returns its token ids."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        cfg = self.model_config
        if not ids:
            raise ValueError("prompt is empty")
        odd = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if odd:
            raise ValueError(f"prompt token id {odd[0]!r} is not an integer")
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token id {bad[0]} is outside the vocabulary (0..{cfg.vocab_size - 1})"
            )
        if len(ids) >= cfg.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's context (max_model_len) is "
                f"{cfg.max_model_len}, leaving no room to generate"
            )
        need = self.blocks.blocks_for(min(len(ids) + params.max_tokens, cfg.max_model_len))
        usable = self._usable_after_pending()
        if need > usable:
            raise ValueError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) needs {need} "
                f"KV blocks but the cache has {usable} usable blocks"
            )
        return ids

    def _usable_after_pending(self) -> int:
        """Usable KV blocks once every accepted knob change has applied."""
        return self.latest_knobs.kv_capacity_blocks or self.blocks.total

    @property
    def latest_knobs(self) -> Knobs:
        """The knobs in force once every accepted change has applied."""
        with self._knob_lock:
            return self._pending_knobs[-1][0] if self._pending_knobs else self.knobs

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV blocks; False if it is unknown or already done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req, "abort")
        self.sampler.forget(request_id)
        return True

    def finish(self, request_id: str, reason: str = "stop") -> bool:
        """End a request now as if it had finished (e.g. a stop string matched its text).

        Frees its KV blocks; the next step's telemetry counts it as finished, with its
        latencies. False if it is unknown or already done.
        """
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req, reason)
        self.sampler.forget(request_id)
        self._finished_between.append(req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # knobs

    def _validate_knobs(self, values: dict[str, Any]) -> Knobs:
        max_len = self.model_config.max_model_len
        need = max(
            (
                self.blocks.blocks_for(min(r.max_total_tokens, max_len))
                for r in self.requests.values()
            ),
            default=1,
        )
        context = {
            "total_blocks": self.blocks.total,
            "min_blocks": need,
            "max_model_len": max_len,
            "ep_size": self.config.parallel.ep_size,
            "num_experts": self.model_config.num_experts,
        }
        return Knobs.model_validate(values, context=context)

    def update_knobs(self, origin: str = "api", **changes: Any) -> int:
        """Validate a knob change as a whole; it applies at the next step boundary.

        Returns the new knobs version (the current one when nothing changes); raises
        pydantic.ValidationError (a ValueError) naming the field when the result would be
        invalid or inconsistent.
        """
        with self._knob_lock:
            base = self._pending_knobs[-1][0] if self._pending_knobs else self.knobs
            new = self._validate_knobs({**base.model_dump(), **changes})
            old = base.model_dump()
            diff = {k: [old[k], v] for k, v in new.model_dump().items() if old[k] != v}
            if not diff:
                return self.knobs_version
            self.knobs_version += 1
            change = KnobChange(
                version=self.knobs_version, t=time.time(), origin=origin, changes=diff
            )
            self._pending_knobs.append((new, change))
            return self.knobs_version

    def _apply_knobs(self) -> None:
        """Apply every accepted change; they go out with the next step's telemetry."""
        with self._knob_lock:
            pending, self._pending_knobs = self._pending_knobs, []
        if not pending:
            return
        knobs, last = pending[-1]
        self.knobs = knobs
        self.applied_knobs_version = last.version
        self.scheduler.knobs = knobs
        self.blocks.set_usable(knobs.kv_capacity_blocks or self.blocks.total)
        changes = [change for _, change in pending]
        self.knob_changes.extend(changes)
        self._unreported.extend(changes)

    # expert placement

    def rebalance(self, window: int = 64, replicas: int = 0, origin: str = "api") -> dict[str, Any]:
        """Place experts for the loads of the last `window` steps; applies before the next step.

        Recorded like a knob change (a new knobs version). Raises ValueError when there is
        nothing to rebalance.
        """
        return self._switch(*self._plan(window, replicas), replicas, origin)

    def _plan(self, window: int, replicas: int) -> tuple[Placement, float, float, int]:
        """A placement for the last `window` steps' loads, the predicted imbalance before and
        after it, and the number of steps it saw."""
        old = self.placement
        if old.ep_size == 1:
            raise ValueError(
                "nothing to rebalance: ep_size is 1 (start with --ep N or --ep-size N)"
            )
        most = max_replicas(self.model_config.num_experts, old.ep_size)
        if replicas > most:
            raise ValueError(f"replicas ({replicas}) must be at most {most}")
        recent = list(self._loads)[-window:]
        if not recent:
            raise ValueError("no expert load recorded yet: rebalance after some steps ran")
        loads = torch.stack(recent).sum(0)
        new = rebalance(loads, old, replicas)
        return new, predicted_imbalance(old, loads), predicted_imbalance(new, loads), len(recent)

    def _switch(
        self, new: Placement, before: float, after: float, steps: int, replicas: int, origin: str
    ) -> dict[str, Any]:
        """Move the weights to `new` and record the change."""
        old = self.placement
        self._apply_knobs()
        moved = self.runner.rebalance(new)
        self._since_rebalance = 0
        with self._knob_lock:
            self.knobs_version += 1
            version = self.knobs_version
        change = KnobChange(
            version=version,
            t=time.time(),
            origin=origin,
            changes={
                "expert_placement": [old.version, new.version],
                "predicted_imbalance": [before, after],
            },
        )
        self.applied_knobs_version = version
        self.knob_changes.append(change)
        self._unreported.append(change)
        return {
            "placement_version": new.version,
            "knobs_version": version,
            "window_steps": steps,
            "replicas": replicas,
            "imbalance_before": before,
            "imbalance_after": after,
            "moved_bytes": moved,
            "placement": new.hosted(),
        }

    def _auto_rebalance(self) -> None:
        interval = self.knobs.eplb_interval_steps
        if interval is not None and self._since_rebalance >= interval and self._loads:
            replicas = self.knobs.eplb_replicas
            new, before, after, steps = self._plan(interval, replicas)
            self._since_rebalance = 0
            if after < before:  # never move weights for a placement predicted to be no better
                self._switch(new, before, after, steps, replicas, "auto")

    # the step

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        self._apply_knobs()
        self._auto_rebalance()
        applied, self._unreported = self._unreported, []
        ended, self._finished_between = self._finished_between, []
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.runner.swap(sched)
        result: ForwardResult | None = None
        t2 = t3 = t4 = t1
        if sched.chunks:
            inp = self.runner.prepare(sched, self.knobs.expert_capacity_factor)
            t2 = time.perf_counter()
            result = self.runner.forward(inp)
            t3 = time.perf_counter()
            outputs, finished = self._sample_and_update(sched, result)
            t4 = time.perf_counter()
        else:
            outputs, finished = [], []
        durations = [t1 - t0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t0]
        telemetry = self._telemetry(sched, result, ended + finished, durations, applied)
        self._since_rebalance += 1
        return StepResult(outputs, telemetry)

    def _sample_and_update(
        self, sched: SchedulerOutput, result: ForwardResult
    ) -> tuple[list[RequestOutput], list[Request]]:
        sampling = [c.req for c in sched.chunks if c.sample]
        sampled = self.sampler.sample(
            result.logits, [r.request_id for r in sampling], [r.params for r in sampling]
        )
        for chunk in sched.chunks:
            chunk.req.num_computed_tokens += chunk.num_tokens
            self.blocks.register_full_blocks(chunk.req)
        now = time.time()
        outputs, finished = [], []
        for req, token, lp in zip(sampling, sampled.token_ids, sampled.logprobs, strict=True):
            req.append_token(token, now)
            if lp is not None:
                req.logprobs.append(lp)
            reason = self._finish_reason(req, token)
            if reason:
                self.scheduler.finish(req, reason)
                self.requests.pop(req.request_id, None)
                self.sampler.forget(req.request_id)
                finished.append(req)
            outputs.append(self._output(req))
        return outputs, finished

    def _finish_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (
            not p.ignore_eos and token in self.model_config.eos_token_ids
        ):
            return "stop"
        if len(req.output_token_ids) >= p.max_tokens:
            return "length"
        if req.num_tokens >= self.model_config.max_model_len:
            return "length"
        return None

    def _output(self, req: Request) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            text=req.text.update(self.tokenizer, req.output_token_ids),
            finished=req.status is Status.FINISHED,
            finish_reason=req.finish_reason,
            ttft_s=req.ttft_s,
            token_times_s=[t - req.arrival for t in req.token_times],
            logprobs=list(req.logprobs) if req.params.logprobs is not None else None,
            num_preemptions=req.num_preemptions,
        )

    # telemetry

    def _telemetry(
        self,
        sched: SchedulerOutput,
        result: ForwardResult | None,
        finished: list[Request],
        durations: list[float],
        applied: list[KnobChange],
    ) -> StepTelemetry:
        ms = [round(d * 1000, 3) for d in durations]
        moe_ms = round(result.moe_seconds * 1000, 3) if result else 0.0
        sch = self.scheduler
        arrived, self._arrived = self._arrived, 0
        return StepTelemetry(
            session=self.session,
            step=sched.step,
            t=time.time(),
            knobs_version=self.applied_knobs_version,
            dur_ms=Durations(
                schedule=ms[0], prepare=ms[1], forward=ms[2], moe=moe_ms, sample=ms[3], total=ms[4]
            ),
            batch=BatchInfo(
                max_slots=self.knobs.max_num_seqs,
                token_budget=self.knobs.max_num_batched_tokens,
                num_prefill_tokens=sched.num_prefill_tokens,
                num_decode_tokens=sched.num_decode_tokens,
                slots=[
                    Slot(
                        slot=c.slot,
                        req=c.req.request_id,
                        phase="prefill" if c.is_prefill else "decode",
                        tokens=c.num_tokens,
                        ctx=c.start + c.num_tokens,
                    )
                    for c in sched.chunks
                ],
            ),
            queue=QueueInfo(
                waiting=len(sch.waiting),
                running=len(sch.running),
                swapped=len(sch.swapped),
                arrived=arrived,
                finished=len(finished),
                preempted=len(sched.preempted),
            ),
            kv=self._kv_info(),
            experts=self._expert_info(result),
            a2a=self._a2a_info(result, sched.num_prefill_tokens + sched.num_decode_tokens),
            latency=LatencyInfo(
                ttft_ms=[round(r.ttft_s * 1000, 3) for r in finished if r.ttft_s is not None],
                tpot_ms=[
                    round(tp * 1000, 3) for r in finished if (tp := tpot(r.token_times)) is not None
                ],
            ),
            knob_changes=applied,
        )

    def _kv_info(self) -> KVInfo:
        b = self.blocks
        queries = b.prefix_queries
        return KVInfo(
            block_size=b.block_size,
            total=b.total,
            usable=b.usable,
            used=b.num_used,
            cached=b.num_cached,
            free=b.num_free,
            tokens=self._filled_kv_tokens(),
            watermark_blocks=int(self.knobs.kv_watermark * b.usable),
            host_total=self.config.cache.num_host_blocks,
            host_used=self.config.cache.num_host_blocks - len(b.host_free),
            prefix_hit_rate=round(b.prefix_hits / queries, 4) if queries else 0.0,
        )

    def _filled_kv_tokens(self) -> int:
        """Token slots filled in used blocks; shared prefix blocks are full and count once."""
        bs = self.blocks.block_size
        partial = [
            r.num_computed_tokens % bs for r in self.scheduler.running if r.num_computed_tokens % bs
        ]
        return (self.blocks.num_used - len(partial)) * bs + sum(partial)

    def _expert_info(self, result: ForwardResult | None) -> ExpertInfo:
        cfg = self.model_config
        if result is None:
            counts = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.long)
            dropped = [0] * cfg.num_layers
        else:
            counts = result.expert_counts
            self._loads.append(counts)
            dropped = result.expert_dropped.tolist()
        peak = counts.max(dim=1).values.clamp(min=1)
        balance = (counts.float().mean(dim=1) / peak).tolist()
        return ExpertInfo(
            layers=cfg.num_layers,
            experts=cfg.num_experts,
            top_k=cfg.top_k,
            counts=counts.tolist(),
            dropped=dropped,
            balance=[round(x, 4) for x in balance],
        )

    def _a2a_info(self, result: ForwardResult | None, rows: int) -> A2AInfo:
        ep = self.placement.ep_size
        moe_ms: list[float] = []
        if result is None:
            volume = gathered = [[0] * ep for _ in range(ep)]
            per_layer = torch.zeros(self.model_config.num_layers, ep, dtype=torch.long)
        elif result.measured is not None:
            volume, per_layer = result.measured.bytes, result.measured.computed
            gathered, moe_ms = result.measured.gather_bytes, result.measured.compute_ms
        else:
            assert result.rank_pairs is not None
            elem = self.model.embed_tokens.weight.element_size()
            row_bytes = self.model_config.hidden_size * elem
            volume = a2a_bytes(result.rank_pairs, row_bytes)
            per_layer = result.rank_pairs.sum(1)
            gathered = gather_bytes(ep, rows, per_layer.shape[0], row_bytes)
        return A2AInfo(
            ep_size=ep,
            mode=self.a2a_mode,
            bytes=volume,
            gather_bytes=gathered,
            rank_tokens=per_layer.sum(0).tolist(),
            rank_moe_ms=moe_ms,
            imbalance=imbalance(per_layer),
            placement_version=self.placement.version,
        )
