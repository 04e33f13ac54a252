"""LLMEngine: one step = schedule, plan the batch, forward (attention + grouped MoE) and sample
on the device, update the requests; with overlap, a step is planned while the one before runs."""

import time
import uuid
from typing import Any, Literal

import torch

from engine.config import EngineConfig, engine_config
from engine.ep.placement import Placement
from engine.ep.ranks import Ranks, model_runner
from engine.errors import InvalidInput
from engine.expert_loads import ExpertLoads
from engine.gc_heap import freeze_heap
from engine.knob_versions import KnobVersions
from engine.knobs import Knobs, validate_knobs
from engine.launched import ComputeThread, Launched, step_durations
from engine.outputs import RequestDelta, StepResult
from engine.request import Request, auto_request_id
from engine.request_checks import check_fits, prompt_token_ids
from engine.request_updates import update_requests
from engine.sampling import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.step_records import Executed
from engine.step_telemetry import EPInfo, StepStats, a2a_info, expert_info, step_telemetry
from engine.telemetry import KnobChange, RequestRecord
from engine.threads import ThreadGovernor
from engine.window_pool import block_manager, sized_cache


class LLMEngine:
    """Continuous-batching MoE engine; `step()` advances every scheduled request by one step.

    With `ep_size` N > 1 and `ep_distributed`, it starts ranks 1..N-1 as processes; call
    `close()` to stop them.
    """

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        self.config = sized_cache(config or engine_config(**kwargs))
        self._compute = ComputeThread()  # started by the first overlapped step
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
        self.blocks = block_manager(cache, self.model_config.sliding_window)
        self.requests: dict[str, Request] = {}
        self.knob_versions = KnobVersions(self._validate_knobs(cfg.knobs.model_dump()))
        self.blocks.set_usable(self.knobs.kv_capacity_blocks or cache.num_blocks)
        self.scheduler = Scheduler(self.blocks, self.knobs, cfg.batching)
        self.scheduler.max_model_len = self.model_config.max_model_len
        self.sampler = Sampler(cfg.seed, self.runner.device)
        # overlap: each step's forward pass runs on the compute thread while the engine
        # thread plans the next one (torch ops release the GIL); not with real ranks, whose
        # commands go out from the engine thread in order
        self._overlap = cfg.overlap and self.ranks is None
        self._inflight: Launched | None = None
        self.session = uuid.uuid4().hex[:12]
        # other ranks' processes would count as a neighbour's load: they keep the count fixed
        self.threads = ThreadGovernor(None if self.ranks and cfg.threads == "auto" else cfg.threads)
        self._loads = ExpertLoads()
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

    @property
    def overlap(self) -> bool:
        """Whether each step is scheduled and planned while the step before runs."""
        return self._overlap

    @overlap.setter
    def overlap(self, on: bool) -> None:
        """Switch overlap; takes effect at the next step (a step in flight finishes first)."""
        self._overlap = on and self.ranks is None

    def settle(self) -> None:
        """Wait until the step in flight, if any, has run on the device (its outputs come
        with the next step): a benchmark that switches engines keeps them apart."""
        if self._inflight is not None:
            self._inflight.wait()

    def close(self) -> None:
        """Stop the other expert-parallel ranks, if any (the engine cannot step afterwards)."""
        self._compute.shutdown()
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
        ids = prompt_token_ids(prompt, self.tokenizer, self.model_config)
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

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        usable = self.latest_knobs.kv_capacity_blocks or self.blocks.total
        max_len = self.model_config.max_model_len
        check_fits(self.blocks, usable, max_len, prompt_len, max_tokens)

    def abort(self, request_id: str, reason: str = "abort") -> RequestRecord | None:
        """Stop a request and free its KV blocks; its end record, or None if it is unknown or
        already done."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._end(req, reason)
        return req.end_record(time.time(), self.config.record_prompts)

    def _end(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req, reason)
        del self.requests[req.request_id]
        self.sampler.forget(req.request_id)

    def has_unfinished(self) -> bool:
        """Requests not finished, or a step still in flight (overlap)."""
        return self.scheduler.num_unfinished > 0 or self._inflight is not None

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
        knobs = validate_knobs(values, context)
        if not self.blocks.step_fits_window_pool(knobs.max_num_batched_tokens):
            raise InvalidInput(
                f"max_num_batched_tokens ({knobs.max_num_batched_tokens}) is more than one "
                "request's step can hold in the sliding layers' own KV pool (sized for the "
                "knobs the engine started with)",
                "max_num_batched_tokens",
            )
        return knobs

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
        return self._loads.plan(self.placement, self.model_config.num_experts, window, replicas)

    def _switch(
        self, new: Placement, before: float, after: float, steps: int, replicas: int, origin: str
    ) -> dict[str, Any]:
        """Move the weights to `new` and record the change."""
        old = self.placement
        self._apply_knobs()
        if self._inflight is not None:  # weights and placement change between forward passes
            self._inflight.wait()
        moved = self.runner.rebalance(new)
        self._loads.since_rebalance = 0
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
        if interval is not None and self._loads.since_rebalance >= interval and self._loads.steps:
            replicas = self.knobs.eplb_replicas
            new, before, after, steps = self._plan(interval, replicas)
            self._loads.since_rebalance = 0
            if after < before:  # never move weights for a placement predicted to be no better
                self._switch(new, before, after, steps, replicas, "auto")

    # the step

    def step(self) -> StepResult:
        """Run one step and return what it produced. With overlap on, the step after it is
        scheduled and planned while it runs and launched as soon as it ends, so the result
        of step N comes back while step N+1 runs."""
        if self.overlap:
            return self._step_overlapped()
        if self._inflight is not None:  # overlap was just turned off: finish its step first
            launched, self._inflight = self._inflight, None
            return self._complete(launched, launched.wait())
        launched = self._launch(self._plan_step(None), None)
        return self._complete(launched, launched.wait())

    def _step_overlapped(self) -> StepResult:
        current = self._inflight = self._inflight or self._launch(self._plan_step(None), None)
        following = None
        if self.scheduler.has_schedulable() or self.knob_versions.waiting:
            # while the current step runs (a rebalance in it waits for that step to end)
            following = self._plan_step(current)
        executed = current.wait()
        self._inflight = None
        if following is not None:
            previous = executed.tokens if executed is not None else None
            self._inflight = self._launch(following, previous)
        return self._complete(current, executed)

    def _plan_step(self, during: Launched | None) -> Launched:
        """Apply knob and placement changes, schedule, and plan the batch (engine thread);
        `during`: the step that runs meanwhile, if any."""
        t0 = time.perf_counter()
        self.threads.tick()
        self._apply_knobs()
        self._auto_rebalance()
        applied = self.knob_versions.take_unreported()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        sampling = [c.req for c in sched.chunks if c.sample]
        plan = None
        if sched.chunks or sched.swap_out or sched.swap_in:
            spec = self.sampler.spec([r.request_id for r in sampling], [r.params for r in sampling])
            plan = self.runner.prepare(sched, self.knobs.expert_capacity_factor, spec)
        for i, req in enumerate(sampling):
            req.sample_index = i
        self.scheduler.launched(sched)
        arrived, self._arrived = self._arrived, 0
        return Launched(
            sched,
            plan,
            sampling,
            applied,
            self.applied_knobs_version,
            arrived,
            during,
            self.placement,
            t0,
            t1,
            time.perf_counter(),
        )

    def _launch(self, launched: Launched, previous: torch.Tensor | None) -> Launched:
        """Start the step's device work: on the compute thread with overlap, else right here."""
        plan = launched.plan
        if plan is None:
            return launched
        if self.overlap:
            launched.launched_at = time.perf_counter()
            launched.job = self._compute.submit(self.runner.execute, plan, previous)
        else:
            launched.job = self.runner.execute(plan, previous)
        return launched

    def _complete(self, launched: Launched, executed: Executed | None) -> StepResult:
        """Take a step's sampled tokens into its requests and make its outputs and record."""
        t3 = time.perf_counter()
        result = executed.result if executed is not None else None
        sched = launched.sched
        deltas: list[RequestDelta] = []
        finished: list[Request] = []
        if executed is not None:
            if result is not None:
                self._loads.steps.append(result.expert_counts)
            deltas, finished = update_requests(
                launched, executed, self.scheduler, self.tokenizer, self.model_config, self._end
            )
        t4 = time.perf_counter()
        dur_ms = step_durations(launched, executed, self._inflight, t3, t4)
        # stamped right after `total` ends, so that t - total is when the step started
        end_t = time.time()
        telemetry = step_telemetry(
            StepStats(
                session=self.session,
                knobs_version=launched.knobs_version,
                t=end_t,
                sched=sched,
                scheduler=self.scheduler.stats(),
                arrived=launched.arrived,
                finished=finished,
                knob_changes=launched.applied,
                dur_ms=dur_ms,
                experts=expert_info(self.model_config, result),
                kv_bytes_per_token_layer=self.model_config.kv_elements_per_token
                * self.config.dtype.itemsize,
                a2a=a2a_info(
                    self._ep_info(launched.placement),
                    result,
                    sched.num_prefill_tokens + sched.num_decode_tokens,
                ),
            )
        )
        self._loads.since_rebalance += 1
        ended = [r.end_record(r.token_times[-1], self.config.record_prompts) for r in finished]
        outputs = [d.output for d in deltas if d.output is not None]
        return StepResult(deltas, outputs, telemetry, ended)

    def _ep_info(self, placement: Placement) -> EPInfo:
        """Made each step, for the placement it ran with: a rebalance replaces it."""
        elem = self.model.embed_tokens.weight.element_size()
        return EPInfo(
            placement=placement,
            mode=self.a2a_mode,
            row_bytes=self.model_config.hidden_size * elem,
            num_layers=self.model_config.num_moe_layers,
        )
