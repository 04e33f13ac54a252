"""LLMEngine: one step = schedule, prepare, forward (attention + grouped MoE), sample, update."""

import numbers
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engine.config import EngineConfig, engine_config
from engine.ep.placement import Placement, max_replicas
from engine.ep.ranks import Ranks, model_runner
from engine.ep.rebalance import predicted_imbalance, rebalance
from engine.errors import InvalidInput, Refused
from engine.gc_heap import freeze_heap
from engine.knob_versions import KnobVersions
from engine.knobs import Knobs, validate_knobs
from engine.kv_cache import BlockManager
from engine.outputs import RequestDelta, RequestOutput
from engine.request import Request, Status, auto_request_id
from engine.runner import ForwardResult
from engine.sampling import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.step_telemetry import (
    EPInfo,
    StepStats,
    a2a_info,
    durations,
    expert_info,
    step_telemetry,
)
from engine.telemetry import KnobChange, RequestRecord, StepTelemetry
from engine.threads import ThreadGovernor


@dataclass
class StepResult:
    """A delta for every request that sampled a token, the whole output of each request that
    finished, the step's record, and the end records of the requests that finished in it."""

    deltas: list[RequestDelta]
    outputs: list[RequestOutput]
    telemetry: StepTelemetry
    ended: list[RequestRecord]


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
        self.knob_versions = KnobVersions(self._validate_knobs(cfg.knobs.model_dump()))
        self.blocks.set_usable(self.knobs.kv_capacity_blocks or cache.num_blocks)
        self.scheduler = Scheduler(self.blocks, self.knobs, cfg.batching)
        self.sampler = Sampler(cfg.seed)
        self.session = uuid.uuid4().hex[:12]
        # other ranks' processes would count as a neighbour's load: they keep the count fixed
        self.threads = ThreadGovernor(None if self.ranks and cfg.threads == "auto" else cfg.threads)
        self._loads: deque[torch.Tensor] = deque(maxlen=LOAD_WINDOW)
        self._since_rebalance = 0
        self._arrived = 0
        freeze_heap()

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
        stream_text: bool = False,
    ) -> str:
        """Queue a request; raises InvalidInput naming the field before any state changes.
        With `stream_text`, its deltas carry text as it settles, else all of it at the end."""
        req = self.make_request(
            prompt, params or SamplingParams(), request_id, arrival, stream_text
        )
        self.add(req)
        return req.request_id

    def make_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival: float | None = None,
        stream_text: bool = False,
    ) -> Request:
        """Tokenize and validate a request without queueing it (callable from any thread);
        raises InvalidInput naming the field. No id picks an automatic `req-N`."""
        if request_id is None:
            request_id = auto_request_id()
            while request_id in self.requests:  # a caller chose this `req-N` already
                request_id = auto_request_id()
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidInput(
                f"request_id must be a non-empty string, got {request_id!r}", "request_id"
            )
        ids = self._prompt_ids(prompt)
        self._check_fits(len(ids), params.max_tokens)
        arrival = time.time() if arrival is None else arrival
        return Request(ids, params, request_id, arrival, stream_text=stream_text)

    def add(self, req: Request) -> None:
        """Queue a request from `make_request`, checking only what may have changed since."""
        if req.request_id in self.requests:
            raise InvalidInput(f"request_id {req.request_id!r} is already in use", "request_id")
        self._check_fits(req.num_prompt_tokens, req.params.max_tokens)
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        self._arrived += 1

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        cfg = self.model_config
        if not ids:
            raise InvalidInput("prompt is empty", "prompt")
        odd = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if odd:
            raise InvalidInput(f"prompt token id {odd[0]!r} is not an integer", "prompt")
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
        if bad:
            raise InvalidInput(
                f"prompt token id {bad[0]} is outside the vocabulary (0..{cfg.vocab_size - 1})",
                "prompt",
            )
        if len(ids) >= cfg.max_model_len:
            raise InvalidInput(
                f"prompt has {len(ids)} tokens; the model's context (max_model_len) is "
                f"{cfg.max_model_len}, leaving no room to generate",
                "prompt",
            )
        return ids

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """The request must fit the KV blocks usable once every accepted knob change applied."""
        need = self.blocks.blocks_for(min(prompt_len + max_tokens, self.model_config.max_model_len))
        usable = self.latest_knobs.kv_capacity_blocks or self.blocks.total
        if need > usable:
            raise InvalidInput(
                f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) needs {need} "
                f"KV blocks but the cache has {usable} usable blocks",
                "max_tokens",
            )

    def abort(self, request_id: str, reason: str = "abort") -> RequestRecord | None:
        """Stop a request and free its KV blocks; its end record, or None if it is unknown or
        already done."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._end(req, reason)
        return req.end_record(time.time())

    def _end(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req, reason)
        del self.requests[req.request_id]
        self.sampler.forget(req.request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def has_work(self) -> bool:
        """Whether a step would do something: run requests, or apply or report a change."""
        return self.has_unfinished() or self.knob_versions.waiting

    # knobs

    @property
    def knobs(self) -> Knobs:
        """The knobs in force."""
        return self.knob_versions.knobs

    @property
    def latest_knobs(self) -> Knobs:
        """The knobs in force once every accepted change has applied."""
        return self.knob_versions.latest

    @property
    def knobs_version(self) -> int:
        return self.knob_versions.version

    @property
    def applied_knobs_version(self) -> int:
        return self.knob_versions.applied_version

    @property
    def knob_changes(self) -> list[KnobChange]:
        """The applied changes kept (the newest knob_versions.HISTORY), oldest first."""
        return list(self.knob_versions.history)

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
        return validate_knobs(values, context)

    def update_knobs(self, origin: str = "api", reason: str | None = None, **changes: Any) -> int:
        """Validate a knob change as a whole; it applies at the next step boundary, recorded
        with `reason` (why, in words) when given.

        Returns the new knobs version (the current one when nothing changes); raises
        InvalidInput naming the field when the result would be invalid or inconsistent.
        """
        return self.knob_versions.propose(changes, origin, self._validate_knobs, reason)

    def _apply_knobs(self) -> None:
        knobs = self.knob_versions.apply_pending()
        if knobs is not None:
            self.scheduler.knobs = knobs
            self.blocks.set_usable(knobs.kv_capacity_blocks or self.blocks.total)

    # expert placement

    def rebalance(self, window: int = 64, replicas: int = 0, origin: str = "api") -> dict[str, Any]:
        """Place experts for the loads of the last `window` steps; applies before the next step.

        Recorded like a knob change (a new knobs version). Raises Refused when there is nothing
        to rebalance, InvalidInput (`replicas`) for too many replicas.
        """
        return self._switch(*self._plan(window, replicas), replicas, origin)

    def _plan(self, window: int, replicas: int) -> tuple[Placement, float, float, int]:
        """A placement for the last `window` steps' loads, the predicted imbalance before and
        after it, and the number of steps it saw."""
        old = self.placement
        if old.ep_size == 1:
            raise Refused("nothing to rebalance: ep_size is 1 (start with --ep N or --ep-size N)")
        most = max_replicas(self.model_config.num_experts, old.ep_size)
        if replicas > most:
            raise InvalidInput(f"replicas ({replicas}) must be at most {most}", "replicas")
        recent = list(self._loads)[-window:]
        if not recent:
            raise Refused("no expert load recorded yet: rebalance after some steps ran")
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
        change = self.knob_versions.record(
            {
                "expert_placement": [old.version, new.version],
                "predicted_imbalance": [before, after],
            },
            origin,
        )
        return {
            "placement_version": new.version,
            "knobs_version": change.version,
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
        self.threads.tick()
        self._apply_knobs()
        self._auto_rebalance()
        applied = self.knob_versions.take_unreported()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.runner.swap(sched)
        result: ForwardResult | None = None
        t2 = t3 = t4 = t1
        deltas: list[RequestDelta] = []
        finished: list[Request] = []
        if sched.chunks:
            inp = self.runner.prepare(sched, self.knobs.expert_capacity_factor)
            t2 = time.perf_counter()
            result = self.runner.forward(inp)
            t3 = time.perf_counter()
            self._loads.append(result.expert_counts)
            deltas, finished = self._sample_and_update(sched, result)
            t4 = time.perf_counter()
        seconds = [t1 - t0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t0]
        arrived, self._arrived = self._arrived, 0
        telemetry = step_telemetry(
            StepStats(
                session=self.session,
                knobs_version=self.applied_knobs_version,
                t=time.time(),
                sched=sched,
                scheduler=self.scheduler.stats(),
                arrived=arrived,
                finished=finished,
                knob_changes=applied,
                dur_ms=durations(seconds, result.moe_seconds if result else 0.0),
                experts=expert_info(self.model_config, result),
                a2a=a2a_info(
                    self._ep_info(), result, sched.num_prefill_tokens + sched.num_decode_tokens
                ),
            )
        )
        self._since_rebalance += 1
        ended = [r.end_record(r.token_times[-1]) for r in finished]
        outputs = [d.output for d in deltas if d.output is not None]
        return StepResult(deltas, outputs, telemetry, ended)

    def _ep_info(self) -> EPInfo:
        """Made each step: a rebalance replaces the placement."""
        elem = self.model.embed_tokens.weight.element_size()
        return EPInfo(
            placement=self.placement,
            mode=self.a2a_mode,
            row_bytes=self.model_config.hidden_size * elem,
            num_layers=self.model_config.num_layers,
        )

    def _sample_and_update(
        self, sched: SchedulerOutput, result: ForwardResult
    ) -> tuple[list[RequestDelta], list[Request]]:
        sampling = [c.req for c in sched.chunks if c.sample]
        sampled = self.sampler.sample(
            result.logits, [r.request_id for r in sampling], [r.params for r in sampling]
        )
        self.scheduler.advance(sched)
        now = time.time()
        deltas, finished = [], []
        for req, token, lp in zip(sampling, sampled.token_ids, sampled.logprobs, strict=True):
            req.append_token(token, now)
            if lp is not None:
                req.logprobs.append(lp)
            reason = self._finish_reason(req, token)
            text = self._new_text(req, final=reason is not None)
            if req.text.stopped:
                reason = "stop"
            delta = RequestDelta(
                req.request_id, [token], [now - req.arrival], text, reason is not None, reason
            )
            if lp is not None:
                delta.logprobs = [lp]
            if reason:
                self._end(req, reason)
                finished.append(req)
                delta.output = self._output(req)
            deltas.append(delta)
        return deltas, finished

    def _new_text(self, req: Request, final: bool) -> str:
        """The text this step delivers: what settled since the last step when the request's
        text is decoded every step; otherwise all of it, decoded once, at the end."""
        if req.text_each_step:
            before = len(req.text.shown)
            req.text.update(self.tokenizer, req.output_token_ids, final)
            return req.text.shown[before:]
        if final:
            req.text.update(self.tokenizer, req.output_token_ids, final)
            return req.text.shown
        return ""

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
            text=req.text.shown,
            finished=req.status is Status.FINISHED,
            finish_reason=req.finish_reason,
            ttft_s=req.ttft_s,
            token_times_s=[t - req.arrival for t in req.token_times],
            logprobs=list(req.logprobs) if req.params.logprobs is not None else None,
            num_preemptions=req.num_preemptions,
        )
