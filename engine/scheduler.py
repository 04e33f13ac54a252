"""Iteration-level scheduler: picks each step's requests and token counts under the knobs."""

import heapq
from collections import deque
from dataclasses import dataclass, field

from engine.config import Batching, Knobs
from engine.kv_cache import BlockManager, KVStats
from engine.request import Request, Status
from engine.telemetry import BlockReason


@dataclass
class ScheduledChunk:
    """`num_tokens` tokens of `req` starting at position `start`; `sample` when it ends them
    (decided when scheduled: the request's token count grows once the step is launched)."""

    req: Request
    start: int
    num_tokens: int
    is_prefill: bool
    slot: int = -1
    sample: bool = field(init=False)

    def __post_init__(self) -> None:
        self.sample = self.start + self.num_tokens == self.req.num_tokens


@dataclass
class SchedulerOutput:
    """What one step runs: the chunks (running decodes, running prefills, swapped-in requests,
    then admitted ones), preemptions and KV swaps."""

    step: int
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # the same for the sliding layers' pool (engine.window_pool), when the model has one
    window_swap_out: list[tuple[int, int]] = field(default_factory=list)
    window_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocked: BlockReason | None = None  # why the waiting queue's head was left waiting
    ahead_arrival: float | None = None  # latest arrival of that head and of those admitted

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if c.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.is_prefill)


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state at one moment, as a step's record reports it once the step's
    requests advanced and finished (like vLLM's SchedulerStats): its limits, queue lengths and
    KV cache."""

    max_slots: int
    token_budget: int
    waiting: int
    running: int
    swapped: int
    kv: KVStats
    kv_tokens: int  # token slots filled in used blocks
    watermark_blocks: int  # the kv_watermark knob in blocks


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a waiting request can be admitted now: `blocked` names what keeps it waiting;
    when None, it runs `tokens` prefill tokens now, takes `cost` blocks and reuses the
    prefix-cache blocks `matched`."""

    blocked: BlockReason | None
    tokens: int = 0
    cost: int = 0
    matched: list[int] = field(default_factory=list)


class Scheduler:
    """Holds the waiting, running and swapped queues and forms one batch per step."""

    def __init__(self, blocks: BlockManager, knobs: Knobs, batching: Batching) -> None:
        self.blocks = blocks
        self.knobs = knobs
        self.batching = batching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.free_slots: list[int] = []
        self.next_slot = 0
        self.step_count = 0
        # set by an engine that schedules a step while the one before runs: requests whose
        # tokens in flight reach this length end with them and are not scheduled again
        self.max_model_len: int | None = None

    def policy_key(self, req: Request) -> tuple[int, ...]:
        """Lower keys run first; the running request with the highest key is preempted first."""
        if self.knobs.policy == "priority":
            return (req.params.priority, req.seq)
        if self.knobs.policy == "shortest_first":
            return (req.num_prompt_tokens, req.seq)
        return (req.seq,)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def resume(self, req: Request, computed: int) -> None:
        """Run `req` with its first `computed` tokens already in KV blocks, as a running
        request of the live engine enters its twin; it waits, to prefill again, when the
        blocks are not there."""
        req.num_computed_tokens = computed
        if not self.blocks.fits(req, 0):
            req.num_computed_tokens = 0
            self.add(req)
            return
        self.blocks.allocate(req, 0)
        self._run(req)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def stats(self) -> SchedulerStats:
        kv = self.blocks.stats(self.running)
        return SchedulerStats(
            max_slots=self.knobs.max_num_seqs,
            token_budget=self.knobs.max_num_batched_tokens,
            waiting=len(self.waiting),
            running=len(self.running),
            swapped=len(self.swapped),
            kv=kv,
            kv_tokens=self._filled_kv_tokens(),
            watermark_blocks=int(self.knobs.kv_watermark * kv.usable),
        )

    def _filled_kv_tokens(self) -> int:
        """Token slots filled in used blocks; shared prefix blocks are full and count once."""
        bs = self.blocks.block_size
        partial = [r.num_computed_tokens % bs for r in self.running if r.num_computed_tokens % bs]
        return (self.blocks.num_used - len(partial)) * bs + sum(partial)

    def _chunk_len(self, req: Request, budget: int, prefilling: bool) -> int:
        if not prefilling:
            return 1 if budget >= 1 else 0
        return self._prefill_len(req.num_pending_tokens, budget)

    def _prefill_len(self, pending: int, budget: int) -> int:
        """Tokens of a prefill to run now: one chunk, or all of it when chunking is off."""
        chunk = self.knobs.prefill_chunk_size
        if chunk == 0:
            return pending if pending <= budget else 0
        return min(pending, chunk, budget)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(step=self.step_count)
        self.step_count += 1
        self._shrink_to_capacity(out)
        budget = self._schedule_running(out, self.knobs.max_num_batched_tokens)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
        if out.preempted and self.waiting:
            self._blocked(out, "kv", self._waiting_head())  # admission waits out the shortage
        elif self.swapped and self.waiting:
            self._blocked(out, "swapped", self._waiting_head())  # swapped requests go first
        elif not out.preempted and not self.swapped:
            self._schedule_waiting(out, budget)
        return out

    def _waiting_head(self) -> Request:
        if self.knobs.policy == "fcfs":
            return self.waiting[0]
        return min(self.waiting, key=self.policy_key)

    @staticmethod
    def _ahead(out: SchedulerOutput, req: Request) -> None:
        """Note `req` as admitted, or as the head left waiting, ahead of those still waiting."""
        if out.ahead_arrival is None or req.arrival > out.ahead_arrival:
            out.ahead_arrival = req.arrival

    def _blocked(self, out: SchedulerOutput, reason: BlockReason, head: Request) -> None:
        out.blocked = reason
        self._ahead(out, head)

    def _shrink_to_capacity(self, out: SchedulerOutput) -> None:
        while self.blocks.num_used > self.blocks.usable and self.running:
            self._preempt(max(self.running, key=self.policy_key), out)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # whether each request prefills is worked out once: this runs for every running request
        # every step, and a request's phase cannot change before its own turn
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in self.running:
            (prefills if req.in_prefill else decodes).append(req)
        static_prefilling = self.batching == "static" and bool(prefills)
        scheduled: set[int] = set()
        for prefilling, group in ((False, decodes), (True, prefills)):
            if static_prefilling and not prefilling:
                continue
            for req in sorted(group, key=self.policy_key):
                if req.status is not Status.RUNNING or len(scheduled) >= self.knobs.max_num_seqs:
                    continue
                if req.num_in_flight and self.ends_in_flight(req):
                    continue
                n = self._chunk_len(req, budget, prefilling)
                if n == 0:
                    continue
                if not self._make_room(req, n, scheduled, out):
                    continue
                self._add_chunk(req, n, out, prefilling)
                scheduled.add(req.seq)
                budget -= n
        return budget

    def _add_chunk(self, req: Request, n: int, out: SchedulerOutput, prefilling: bool) -> None:
        self.blocks.allocate(req, n)
        slot = -1 if req.slot is None else req.slot
        out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, prefilling, slot))

    def _make_room(self, req: Request, n: int, scheduled: set[int], out: SchedulerOutput) -> bool:
        """Preempt lowest-priority unscheduled running requests until `req` can grow by n."""
        while not self.blocks.fits(req, n):
            candidates = [r for r in self.running if r.seq not in scheduled]
            victim = max(candidates, key=self.policy_key)
            self._preempt(victim, out)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self._release_slot(req)
        req.num_preemptions += 1
        out.preempted.append(req)
        if self.knobs.preemption_mode == "swap" and self.blocks.can_swap_out(req):
            pairs, window = self.blocks.swap_out_all(req)
            out.swap_out.extend(pairs)
            out.window_swap_out.extend(window)
            req.status = Status.SWAPPED
            self.swapped.append(req)
            return
        self.blocks.free(req)
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def _watermark(self) -> int:
        if not self.running:
            return 0
        return int(self.knobs.kv_watermark * self.blocks.usable)

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        while self.swapped and len(self.running) < self.knobs.max_num_seqs:
            req = self.swapped[0]
            prefilling = req.in_prefill
            n = self._chunk_len(req, budget, prefilling)
            if n == 0 or not self.blocks.can_swap_in(req, n, self._watermark()):
                break
            self.swapped.popleft()
            pairs, window = self.blocks.swap_in_all(req)
            out.swap_in.extend(pairs)
            out.window_swap_in.extend(window)
            self._run(req)
            self._add_chunk(req, n, out, prefilling)
            budget -= n
        return budget

    def _waiting_order(self) -> list[Request]:
        if self.knobs.policy == "fcfs":
            return list(self.waiting)
        return heapq.nsmallest(len(self.waiting), self.waiting, key=self.policy_key)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        static = self.batching == "static"
        if static and self.running:
            if self.waiting:
                self._blocked(out, "static", self._waiting_head())  # the batch runs to its end
            return
        reserved = 0
        for req in self._waiting_order():
            admission = self._admit(req, budget, reserved, static)
            if admission.blocked is not None:
                self._blocked(out, admission.blocked, req)
                return
            before = self.blocks.num_allocatable
            self.waiting.remove(req)
            self.blocks.admit(req, admission.matched)
            self._run(req)
            self._ahead(out, req)
            if admission.tokens:
                self._add_chunk(req, admission.tokens, out, req.in_prefill)
                budget -= admission.tokens
            if static:
                reserved += admission.cost - (before - self.blocks.num_allocatable)

    def _admit(self, req: Request, budget: int, reserved: int, static: bool) -> Admission:
        if len(self.running) >= self.knobs.max_num_seqs:
            return Admission("slots")
        matched = self.blocks.prefix_match(req)
        hit_tokens = len(matched) * self.blocks.block_size
        n = self._prefill_len(req.num_tokens - hit_tokens, budget)
        if n == 0 and not static:
            return Admission("budget")
        cost = len(matched) - self.blocks.hit_blocks_in_use(matched)
        if static:
            cost += self.blocks.blocks_for(req.num_tokens) - len(matched)
        else:
            cost += self.blocks.blocks_for(hit_tokens + n) - len(matched)
        if reserved + cost > self.blocks.num_allocatable - self._watermark():
            return Admission("kv")
        if not self.blocks.window_fits(req, len(matched), n):
            return Admission("kv")
        return Admission(None, n, cost, matched)

    def _run(self, req: Request) -> None:
        req.status = Status.RUNNING
        req.slot = heapq.heappop(self.free_slots) if self.free_slots else self._new_slot()
        self.running.append(req)

    def _new_slot(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1

    def _release_slot(self, req: Request) -> None:
        if req.slot is not None:
            heapq.heappush(self.free_slots, req.slot)
            req.slot = None

    def ends_in_flight(self, req: Request) -> bool:
        """Whether the tokens in flight surely end `req` (max_tokens or the model's length)."""
        too_long = self.max_model_len is not None and req.num_tokens >= self.max_model_len
        return too_long or req.max_tokens_in_flight

    def has_schedulable(self) -> bool:
        """Whether a step scheduled now could run anything."""
        return bool(
            self.waiting
            or self.swapped
            or any(not (r.num_in_flight and self.ends_in_flight(r)) for r in self.running)
        )

    def launched(self, out: SchedulerOutput) -> None:
        """A step running `out` was launched: its tokens count as computed from now on and
        each chunk that samples holds a token in flight, so that the next step can be
        scheduled before this one ends. Its blocks are registered once it ended
        (`register`), when the sampled tokens are known."""
        for chunk in out.chunks:
            chunk.req.num_computed_tokens += chunk.num_tokens
            if chunk.sample:
                chunk.req.num_in_flight += 1

    def register(self, req: Request) -> None:
        """Register the full blocks of a running request for prefix reuse, and give back
        the sliding layers' blocks behind the window (the checks first: most steps fill no
        block and leave none behind)."""
        blocks = self.blocks
        full = req.num_computed_tokens // blocks.block_size
        if req.status is Status.RUNNING and (
            full > req.num_hashed_blocks or (blocks.window and blocks.behind(req))
        ):
            blocks.register_full_blocks(req)

    def advance(self, out: SchedulerOutput) -> None:
        """Account for a step having run `out`: computed tokens, and blocks that became full
        (registered for prefix reuse). Sampled tokens are the caller's to append."""
        for chunk in out.chunks:
            chunk.req.num_computed_tokens += chunk.num_tokens
            self.blocks.register_full_blocks(chunk.req)

    def finish(self, req: Request, reason: str) -> None:
        """Remove a request from whatever queue holds it and free its blocks."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self._release_slot(req)
            self.blocks.free(req)
        elif req.status is Status.SWAPPED:
            self.swapped.remove(req)
            self.blocks.drop_swapped(req)
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
