"""LLMEngine: one step = schedule, prepare, forward (attention + grouped MoE), sample, update."""

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig, Knobs, engine_config
from engine.kv_cache import BlockManager
from engine.model.loader import load_model
from engine.outputs import RequestOutput, tpot
from engine.parallel import Placement
from engine.request import Request, Status
from engine.runner import ForwardResult, ModelRunner
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


class LLMEngine:
    """Continuous-batching MoE engine; `step()` advances every scheduled request by one step."""

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.config = config or engine_config(**kwargs)
        cfg = self.config
        torch.manual_seed(cfg.seed)
        self.model, self.tokenizer = load_model(
            cfg.model, cfg.dtype, cfg.device, cfg.seed, cfg.router_skew
        )
        self.model_config = self.model.cfg
        self.placement = Placement(self.model_config.num_experts, cfg.parallel.ep_size)
        cache = cfg.cache
        self.blocks = BlockManager(
            cache.num_blocks, cache.block_size, cache.num_host_blocks, cache.enable_prefix_caching
        )
        self.runner = ModelRunner(self.model, cache, cfg.device)
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
        self._arrived = 0

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
        if request_id is not None and request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        req = Request(ids, params, request_id or "", arrival or time.time())
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

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # knobs

    def _validate_knobs(self, values: dict[str, Any]) -> Knobs:
        max_len = self.model_config.max_model_len
        need = max((self.blocks.blocks_for(min(r.max_total_tokens, max_len))
                    for r in self.requests.values()), default=1)
        context = {
            "total_blocks": self.blocks.total,
            "min_blocks": need,
            "max_model_len": max_len,
        }
        return Knobs.model_validate(values, context=context)

    def update_knobs(self, origin: str = "api", **changes: Any) -> int:
        """Validate a knob change as a whole; it applies at the next step boundary.

        Returns the new knobs version; raises pydantic.ValidationError (a ValueError)
        naming the field when the result would be invalid or inconsistent.
        """
        with self._knob_lock:
            base = self._pending_knobs[-1][0] if self._pending_knobs else self.knobs
            new = self._validate_knobs({**base.model_dump(), **changes})
            old = base.model_dump()
            diff = {k: [old[k], v] for k, v in new.model_dump().items() if old[k] != v}
            self.knobs_version += 1
            change = KnobChange(version=self.knobs_version, t=time.time(), origin=origin,
                                changes=diff)
            self._pending_knobs.append((new, change))
            return self.knobs_version

    def _apply_knobs(self) -> list[KnobChange]:
        with self._knob_lock:
            pending, self._pending_knobs = self._pending_knobs, []
        if not pending:
            return []
        knobs, last = pending[-1]
        self.knobs = knobs
        self.applied_knobs_version = last.version
        self.scheduler.knobs = knobs
        self.blocks.set_usable(knobs.kv_capacity_blocks or self.blocks.total)
        changes = [change for _, change in pending]
        self.knob_changes.extend(changes)
        return changes

    # the step

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        applied = self._apply_knobs()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.runner.swap(sched)
        result: ForwardResult | None = None
        t2 = t3 = t4 = t1
        if sched.chunks:
            inp = self.runner.prepare(sched, self.knobs.expert_capacity_factor, self.placement)
            t2 = time.perf_counter()
            result = self.runner.forward(inp)
            t3 = time.perf_counter()
            outputs, finished = self._sample_and_update(sched, result)
            t4 = time.perf_counter()
        else:
            outputs, finished = [], []
        durations = [t1 - t0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t0]
        telemetry = self._telemetry(sched, result, finished, durations, applied)
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
            text=self.tokenizer.decode(req.output_token_ids),
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
            dur_ms=Durations(schedule=ms[0], prepare=ms[1], forward=ms[2], moe=moe_ms,
                             sample=ms[3], total=ms[4]),
            batch=BatchInfo(
                max_slots=self.knobs.max_num_seqs,
                token_budget=self.knobs.max_num_batched_tokens,
                num_prefill_tokens=sched.num_prefill_tokens,
                num_decode_tokens=sched.num_decode_tokens,
                slots=[Slot(slot=c.slot, req=c.req.request_id,
                            phase="prefill" if c.is_prefill else "decode",
                            tokens=c.num_tokens, ctx=c.start + c.num_tokens)
                       for c in sched.chunks],
            ),
            queue=QueueInfo(waiting=len(sch.waiting), running=len(sch.running),
                            swapped=len(sch.swapped), arrived=arrived,
                            finished=len(finished), preempted=len(sched.preempted)),
            kv=self._kv_info(),
            experts=self._expert_info(result),
            a2a=self._a2a_info(result),
            latency=LatencyInfo(
                ttft_ms=[round(r.ttft_s * 1000, 3) for r in finished if r.ttft_s is not None],
                tpot_ms=[round(tp * 1000, 3) for r in finished
                         if (tp := tpot(r.token_times)) is not None],
            ),
            knob_changes=applied,
        )

    def _kv_info(self) -> KVInfo:
        b = self.blocks
        queries = b.prefix_queries
        return KVInfo(
            block_size=b.block_size, total=b.total, usable=b.usable, used=b.num_used,
            cached=b.num_cached, free=b.num_free,
            tokens=self._filled_kv_tokens(),
            watermark_blocks=int(self.knobs.kv_watermark * b.usable),
            host_total=self.config.cache.num_host_blocks,
            host_used=self.config.cache.num_host_blocks - len(b.host_free),
            prefix_hit_rate=round(b.prefix_hits / queries, 4) if queries else 0.0,
        )

    def _filled_kv_tokens(self) -> int:
        """Token slots filled in used blocks; shared prefix blocks are full and count once."""
        bs = self.blocks.block_size
        partial = [r.num_computed_tokens % bs for r in self.scheduler.running
                   if r.num_computed_tokens % bs]
        return (self.blocks.num_used - len(partial)) * bs + sum(partial)

    def _expert_info(self, result: ForwardResult | None) -> ExpertInfo:
        cfg = self.model_config
        if result is None:
            counts = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.long)
            dropped = [0] * cfg.num_layers
        else:
            counts = result.expert_counts.sum(1)
            dropped = result.expert_dropped.tolist()
        peak = counts.max(dim=1).values.clamp(min=1)
        balance = (counts.float().mean(dim=1) / peak).tolist()
        return ExpertInfo(layers=cfg.num_layers, experts=cfg.num_experts, top_k=cfg.top_k,
                          counts=counts.tolist(), dropped=dropped,
                          balance=[round(x, 4) for x in balance])

    def _a2a_info(self, result: ForwardResult | None) -> A2AInfo:
        ep = self.placement.ep_size
        if result is None:
            volume = [[0] * ep for _ in range(ep)]
        else:
            elem = self.model.embed_tokens.weight.element_size()
            volume = self.placement.a2a_bytes(
                result.expert_counts, self.model_config.hidden_size * elem
            )
        return A2AInfo(ep_size=ep, mode="modeled", bytes=volume)
