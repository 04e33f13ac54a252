"""Why a request was slow: its wait for the first token and its decoding, split by cause step by
step, from StepTelemetry records (version 2 on) and its RequestRecord.

A request's life from arrival to end is cut at every step's start and end, and each piece goes
to one cause, or is shared among several in a fixed ratio, so the causes add up to the
measured TTFT and E2E. A step's own time runs from `t - dur_ms.total`, or from the step
before's `t` when that is later, to its `t`: recorded spans overlap (with overlap on, a step
is planned while the one before runs; and `t` is stamped a little before `total` stops), and
no time is counted twice. The pieces before the first token are TTFT's; the rest, divided by
the tokens after the first, is TPOT's."""

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import InvalidInput

MIN_VERSION = 2  # telemetry with `sched`, the scheduler's blocking reasons

QUEUE = {  # a waiting request's cause, by the step's blocking reason
    "slots": "queue_slots",
    "budget": "queue_budget",
    "kv": "queue_kv",
    "swapped": "queue_swapped",
    "static": "queue_static",
}
CAUSES = {  # every cause, in words a person tuning the knobs reads
    "queue_slots": "queueing for a slot: max_num_seqs",
    "queue_budget": "waiting for token budget: max_num_batched_tokens",
    "queue_kv": "waiting for KV blocks: kv_capacity_blocks, kv_watermark",
    "queue_priority": "passed over by the scheduling policy",
    "queue_swapped": "waiting behind swapped-out requests",
    "queue_static": "waiting for the static batch to end",
    "queue_busy": "arriving while a step ran",
    "prefill": "its own prefill",
    "interference": "other requests' work in its prefill steps",
    "preemption": "preemption: stalled, or recomputing lost KV",
    "overhead": "engine work between steps",
    "decode": "decode steps",
    "decode_tax": "prefill chunks riding in its decode steps",
    "straggler": "waiting for the slowest expert-parallel rank",
}
PHASES = ("waiting", "prefill", "decode", "preempted")


@dataclass
class Phase:
    """A stretch of a request's life in one phase; `cause` names why, while it waited."""

    t0: float
    t1: float
    phase: str
    cause: str | None = None


@dataclass
class Timeline:
    """One request: the measured latencies, and the ms of each cause before the first token
    (`ttft`) and after it (`after`; over the tokens after the first, `tpot`)."""

    req: str
    arrival: float
    end: float
    ttft_ms: float | None
    e2e_ms: float
    output_len: int
    ttft: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    phases: list[Phase] = field(default_factory=list)
    first_step: int | None = None
    last_step: int | None = None

    @property
    def tpot(self) -> dict[str, float]:
        n = self.output_len - 1
        return {c: ms / n for c, ms in self.after.items()} if n > 0 else {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "req": self.req,
            "arrival": self.arrival,
            "end": self.end,
            "ttft_ms": self.ttft_ms,
            "e2e_ms": self.e2e_ms,
            "output_len": self.output_len,
            "ttft": rounded(self.ttft),
            "tpot": rounded(self.tpot),
            "after_first_token": rounded(self.after),
            "steps": [self.first_step, self.last_step],
            "phases": [vars(p) for p in self.phases],
        }


def rounded(ms: dict[str, float]) -> dict[str, float]:
    out = {c: round(v, 3) for c, v in ms.items()}
    return {c: v for c, v in out.items() if v > 0}


def require_version(steps: list[dict[str, Any]]) -> None:
    """Refuse steps recorded before the scheduler recorded why requests waited."""
    old = next((s for s in steps if s.get("v", 1) < MIN_VERSION), None)
    if old is not None:
        raise InvalidInput(
            f"step {old['step']} was recorded with telemetry v{old.get('v', 1)}; attribution "
            f"needs v{MIN_VERSION} or later (record the session again with this version)",
            "session",
        )


class DecodeBase:
    """A decode step's duration without prefill chunks, by its decode count: a line (no
    negative weight) fitted to the decode-only steps, so a mixed step's time beyond it is the
    prefill chunks' tax on its decodes. With no decode-only step nothing can be told apart,
    and a mixed step counts whole as decode time."""

    def __init__(self, steps: list[dict[str, Any]], own_ms: list[float]) -> None:
        only = [
            i
            for i, s in enumerate(steps)
            if s["batch"]["num_decode_tokens"] and not prefill_tokens(s)
        ]
        self.coef: np.ndarray | None = None
        if not only:
            return
        n = np.array([steps[i]["batch"]["num_decode_tokens"] for i in only], dtype=np.float64)
        ms = np.array([own_ms[i] - straggler_ms(steps[i], own_ms[i]) for i in only])
        self.coef = np.array([ms.mean(), 0.0])
        if np.ptp(n) > 0:
            slope, icpt = np.polyfit(n, ms, 1)
            if slope >= 0 and icpt >= 0:
                self.coef = np.array([icpt, slope])

    def ms(self, decodes: int, busy: float) -> float:
        if self.coef is None:
            return busy
        return min(busy, float(self.coef[0] + self.coef[1] * decodes))


def prefill_tokens(step: dict[str, Any]) -> int:
    return int(step["batch"]["num_prefill_tokens"])


def straggler_ms(step: dict[str, Any], own_ms: float) -> float:
    """The MoE time spent waiting for the busiest expert-parallel rank beyond the mean one (no
    more than the step's own time, `own_ms`)."""
    a2a = step["a2a"]
    if a2a["ep_size"] < 2 or a2a["imbalance"] <= 1:
        return 0.0
    return min(own_ms, float(step["dur_ms"]["moe"]) * (1 - 1 / a2a["imbalance"]))


class Steps:
    """The steps a set of requests ran in, indexed by time and by request, each with its own
    time: `starts[i]` to `ends[i]`, which never overlap (see the module's docstring)."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        require_version(steps)
        self.steps = sorted(steps, key=lambda s: s["t"])
        self.ends = [float(s["t"]) for s in self.steps]
        self.starts = [
            min(end, max(start(s), before))
            for s, end, before in zip(self.steps, self.ends, [-np.inf, *self.ends], strict=False)
        ]
        self.own_ms = [(e - s) * 1000 for s, e in zip(self.starts, self.ends, strict=True)]
        self.slots = [{x["req"]: x for x in s["batch"]["slots"]} for s in self.steps]
        self.preempted = [set(s["sched"]["preempted"]) for s in self.steps]
        self.base = DecodeBase(self.steps, self.own_ms)

    def between(self, t0: float, t1: float) -> range:
        """Indices of the steps whose own time ends after t0 and starts before t1."""
        return range(bisect.bisect_right(self.ends, t0), bisect.bisect_left(self.starts, t1))


def start(step: dict[str, Any]) -> float:
    """When the step began, as recorded: with overlap on, while the step before ran."""
    return float(step["t"]) - step["dur_ms"]["total"] / 1000


def timeline(record: dict[str, Any], steps: Steps) -> Timeline:
    """Attribute one ended request (a RequestRecord dict) over `steps`, which must hold every
    step from its arrival to its end."""
    return Attributor(record, steps).run()


class Attributor:
    """Walks one request through the steps of its life, keeping its state between them."""

    def __init__(self, record: dict[str, Any], steps: Steps) -> None:
        self.steps = steps
        self.arrival = float(record["arrival"])
        self.end = float(record["finished_t"])
        ttft = record["ttft_ms"]
        self.first = self.end if ttft is None else self.arrival + ttft / 1000
        self.out = Timeline(
            record["req"],
            self.arrival,
            self.end,
            ttft,
            float(record["e2e_ms"]),
            int(record["output_len"]),
        )
        self.req = record["req"]
        self.started = False  # scheduled once, and not preempted since
        self.preempted = False
        self.reached = 0  # the furthest its KV got: recomputing below it is preemption's
        self.lost_to = 0

    def run(self) -> Timeline:
        prev = self.arrival  # the pieces so far cover [arrival, prev], once
        for i in self.steps.between(self.arrival, self.end):
            step = self.steps.steps[i]
            slot = self.steps.slots[i].get(self.req)
            if self.req in self.steps.preempted[i]:
                self.preempted, self.started = True, False
                self.lost_to = self.reached
            s0 = max(self.steps.starts[i], prev)
            if slot is None:
                cause, phase = self._idle_cause(step)
                self._add(prev, s0, {cause: 1.0}, phase, cause)
                self._add(s0, step["t"], {cause: 1.0}, phase, cause)
            else:
                waiting = not self.started
                self._add(prev, s0, {"overhead": 1.0}, "waiting" if waiting else "", "overhead")
                self._run(step, slot, s0, self.steps.own_ms[i])
            prev = max(prev, step["t"])
        self._add(prev, self.end, {"overhead": 1.0}, "")
        return self.out

    def _idle_cause(self, step: dict[str, Any]) -> tuple[str, str]:
        """(cause, phase) of a step that did not run the request."""
        if self.preempted:
            return "preemption", "preempted"
        if self.started:
            return "queue_budget", "waiting"  # running, but the budget went to others
        sched = step["sched"]
        if sched["blocked"] is None or self.arrival > start(step):
            return "queue_busy", "waiting"
        ahead = sched["ahead_arrival"]
        if ahead is not None and self.arrival < ahead:
            return "queue_priority", "waiting"
        return QUEUE[sched["blocked"]], "waiting"

    def _run(self, step: dict[str, Any], slot: dict[str, Any], s0: float, own_ms: float) -> None:
        ctx, n = int(slot["ctx"]), int(slot["tokens"])
        self.started, self.preempted = True, False
        if self.out.first_step is None:
            self.out.first_step = step["step"]
        self.out.last_step = step["step"]
        if slot["phase"] == "decode":
            self.reached = max(self.reached, ctx)
            self._add(s0, step["t"], self._decode_shares(step, own_ms), "decode")
            return
        lost = max(0, min(ctx, self.lost_to) - (ctx - n)) / n  # recomputed after preemption
        self.reached = max(self.reached, ctx)
        own = n / (prefill_tokens(step) + step["batch"]["num_decode_tokens"])
        shares = {"preemption": own * lost, "prefill": own * (1 - lost), "interference": 1 - own}
        phase = "preempted" if lost > 0.5 else "prefill"
        self._add(s0, min(step["t"], self.first), shares, phase)
        # after the first token: recomputing after a preemption in decode, or the tail of the
        # step that sampled the first token (sampling, detokenizing)
        after = "preemption" if lost else "overhead"
        self._add(max(s0, self.first), step["t"], {after: 1.0}, phase)

    def _decode_shares(self, step: dict[str, Any], own_ms: float) -> dict[str, float]:
        """Shares of a decode step's own time (`own_ms`), which add up to 1."""
        if own_ms <= 0:
            return {"decode": 1.0}
        busy = own_ms - straggler_ms(step, own_ms)
        base = busy
        if prefill_tokens(step):
            base = self.steps.base.ms(step["batch"]["num_decode_tokens"], busy)
        return {
            "straggler": (own_ms - busy) / own_ms,
            "decode_tax": (busy - base) / own_ms,
            "decode": base / own_ms,
        }

    def _add(
        self,
        t0: float,
        t1: float,
        shares: dict[str, float],
        phase: str,
        cause: str | None = None,
    ) -> None:
        """Give [t0, t1] (clipped to the request's life) to causes by their shares, split at
        the first token; `phase` ("" for the phase it is in) goes to the waterfall."""
        t0, t1 = max(t0, self.arrival), min(t1, self.end)
        if t1 <= t0:
            return
        for lo, hi, into in (
            (t0, min(t1, self.first), self.out.ttft),
            (max(t0, self.first), t1, self.out.after),
        ):
            if hi > lo:
                for c, share in shares.items():
                    if share > 0:
                        into[c] = into.get(c, 0.0) + (hi - lo) * 1000 * share
        self._phase(t0, t1, phase or self._phase_now(), cause)

    def _phase_now(self) -> str:
        if self.preempted:
            return "preempted"
        return "waiting" if not self.started else "decode"

    def _phase(self, t0: float, t1: float, phase: str, cause: str | None) -> None:
        phases = self.out.phases
        if phases and phases[-1].phase == phase and phases[-1].cause == cause:
            phases[-1].t1 = t1
        else:
            phases.append(Phase(t0, t1, phase, cause))


def attribute(records: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[Timeline]:
    """Timelines of ended requests over the steps that ran them."""
    index = Steps(steps)
    return [timeline(r, index) for r in records]
