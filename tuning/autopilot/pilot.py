"""The SLO autopilot's decisions: when to look, which knob set the twin predicts best, when to
apply it, and when to roll a change back. Pure: the caller supplies the clock, the requests
that ended lately, the attribution and a twin to evaluate candidates, and applies what it
decides (`applied` / `refused` tell it how that went)."""

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from scipy.special import bdtr

import stats
from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.autopilot.moves import Move, moves
from tuning.autopilot.settings import AutopilotSettings
from tuning.twin.load_shift import SHIFT_S, Arrival, Shift, longer_since, shift
from tuning.twin.outcome import request_tpot_ms
from tuning.twin.tune import Trial

EXCESS_WEIGHT = 0.1  # halving a p90 above its target scores 7 points of attainment
BACKLOG_WEIGHT = 0.5  # a queue left at the horizon of half the requests costs 25 points
HISTORY = 900  # ticks of measurements kept: half an hour at the default interval
MIN_REQUESTS = 5  # requests a window needs before its percentiles mean anything
ROLLBACK_MARGIN = 0.05  # attainment this much worse after a change than before: undo it
# ... and as few attaining after it as chance gives this rarely at that attainment: in a phase
# of long prompts five to ten requests come in the seconds after a change
ROLLBACK_P = 0.05
BAN_S = 120.0  # a rolled-back move is not tried again for this long
MAX_BACKOFF = 8  # the gap between changes grows up to this many times after rollbacks
JUDGE_WITHIN = 3  # observe_s periods to wait for enough requests to judge a change
MAX_LOOK_BACKOFF = 4  # fruitless looks space the next out up to this many times
REVERSE_S = 60.0  # undoing its own change this soon after it needs REVERSE_GAIN times the gain
REVERSE_GAIN = 2.0
# a gain must be worth this many of the simulated requests attaining: whether one request
# makes its targets is within the twin's error (its step times are 10-20% off)
MIN_GAINED = 2
# requests the twin simulates at least on a shift's look, its horizon stretched for them
# (tuning.twin.live.stretched_horizon): at the 11 a 10 s horizon held in a phase of long prompts,
# one request was 9 points, and the chunk lost to the budget by one. Only there: the twin's
# CPU grows with its horizon, and the shift's look is the one that settles a phase soonest
MIN_SIMULATED = 30

MEASURED_TOO_FEW = (
    f"fewer than {MIN_REQUESTS} requests measured lately (ended, or waiting for a first token "
    "past the TTFT target)"
)

State = Literal["off", "waiting", "holding", "adjusting", "rolled back", "paused"]
Action = Literal["change", "rollback", "hold"]


class Evaluate(Protocol):
    def __call__(
        self,
        changes: list[dict[str, Any]],
        window_s: float,
        errors: float = 0.0,
        min_requests: int = 0,
        /,
    ) -> list[Trial]:
        """A trial for each knob change ({} for the knobs as they are), with the twin repeating
        the arrivals of the last `window_s` seconds, over a horizon long enough for
        `min_requests` (within bounds), and its steps `errors` of its held-out errors longer
        than its fit (`CostModel.off_by`)."""
        ...


Attribution = Callable[[], dict[str, Any] | None]
# Evaluate for one look, its window and least requests fixed: (changes, errors)
Ask = Callable[[list[dict[str, Any]], float], list[Trial]]
Scored = tuple[float, float, Trial, Move]  # predicted gain, the gain needed, trial, move


@dataclass
class Measured:
    """Requests that ended in a window, and those still waiting for a first token that
    already missed the TTFT target: how many, p90 TTFT and TPOT, SLO attainment."""

    requests: int
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    attainment: float | None

    @classmethod
    def of(
        cls, records: list[dict[str, Any]], slo: stats.SLO, late_ms: Sequence[float] = ()
    ) -> "Measured":
        """`late_ms`: the waits so far of the requests without a first token past the TTFT
        target: certain misses, each TTFT at least its wait. A queue that builds shows in
        them seconds before its requests end."""
        pairs = [(r["ttft_ms"], request_tpot_ms(r)) for r in records]
        pairs += [(wait, None) for wait in late_ms]
        return cls(
            len(pairs),
            stats.percentile([t for t, _ in pairs if t is not None], 90),
            stats.percentile([p for _, p in pairs if p is not None], 90),
            stats.slo_attainment(pairs, slo),
        )


@dataclass
class Decision:
    """One tick's outcome. `changes` maps knob -> [old, new] for a change or a rollback."""

    t: float
    action: Action
    reason: str
    changes: dict[str, list[Any]] = field(default_factory=dict)
    predicted: dict[str, Any] | None = None
    version: int | None = None
    refused: str | None = None

    def knob_values(self) -> dict[str, Any]:
        return {k: new for k, (_, new) in self.changes.items()}


@dataclass
class Pending:
    """A change in force, waiting to be judged against what was measured before it."""

    t: float
    decision: Decision
    before: Measured
    move: Move  # its steps, as `moves` gives them
    unchanged: float | None  # the attainment the twin predicted had the knobs stayed


class Autopilot:
    """Holds the state between ticks; one tick every `settings.interval_s`."""

    def __init__(self, settings: AutopilotSettings) -> None:
        self.settings = settings
        self.state: State = "off" if not settings.enabled else "waiting"
        self.note = ""  # why it is in its state, in words
        self.decisions: deque[Decision] = deque(maxlen=50)
        # what each tick measured over the last observe_s, for the attainment chart
        self.history: deque[tuple[float, Measured]] = deque(maxlen=HISTORY)
        self.pending: Pending | None = None
        self.last_change_t = float("-inf")
        self.last_look_t = float("-inf")
        self.fruitless_looks = 0  # looks in a row that found nothing, no target missed anew
        self.looked_at: set[str] = set()  # the targets missed at the looks since the backoff began
        self.paused_until = float("-inf")
        self.backoff = 1.0
        self.banned: dict[Move, float] = {}
        self.last_moves: dict[str, tuple[int, float]] = {}  # knob -> (direction, t) of our last
        self.regime_t = float(
            "-inf"
        )  # when a shift in the load was last seen (tuning.twin.load_shift)
        self.regime: Shift | None = None  # that shift, with longer prompts named after it
        self.regime_since = float("-inf")  # the arrivals it was told against began here
        self.shifted: Shift | None = None  # that shift, until a look has weighed it
        self.shifted_t = float("-inf")  # when `shifted` last told something new
        # bumped by configure and a person's change, which may come while the twin runs
        self.generation = 0

    def configure(self, settings: AutopilotSettings) -> None:
        self.settings = settings
        self.generation += 1
        if not settings.enabled:
            self.state, self.note, self.pending = "off", "", None
        elif self.state == "off":
            self.state, self.note = "waiting", "starting"

    def person_changed(self, t: float, origin: str) -> None:
        """A change someone else made: pause, and never judge or undo it as ours."""
        if not self.settings.enabled:
            return
        self.generation += 1
        self.paused_until = t + self.settings.pause_s
        self.pending = None
        self.state = "paused"
        self.note = (
            f"paused by a change from {origin!r} until {self.settings.pause_s:g} s after it; "
            "the autopilot will not override it before then"
        )

    def tick(
        self,
        t: float,
        knobs: Knobs,
        recent: list[dict[str, Any]],
        attribution: Attribution,
        evaluate: Evaluate,
        unstarted: Sequence[float] = (),
        arrivals: Sequence[Arrival] = (),
        started: Sequence[float] = (),
    ) -> Decision | None:
        """What to do now; `recent` are the RequestRecords that ended lately (at least since
        the pending change), `unstarted` the arrival times of the requests in the engine
        without a first token yet, `started` those of the requests in the engine with one,
        `arrivals` (arrival, prompt length) of every request that arrived lately, ended or
        not, `attribution` gives the `summarize` of the ended ones (or None), asked only when
        the twin is. A change or a rollback is for the caller to apply; None means hold."""
        s = self.settings
        if not s.enabled:
            return None
        ended = [r for r in recent if r["finished_t"] >= t - s.observe_s]
        now = Measured.of(ended, s.slo, self._late(t, unstarted))
        self.history.append((t, now))
        self._watch_load(t, arrivals)
        if t < self.paused_until:
            return None
        if self.state == "paused":
            self.state, self.note = "holding", "resumed after a person's change"
        if self.pending is not None and self.shifted:
            # what is measured after the change ran under another load than before it
            self.pending = None
        if self.pending is not None:
            if t < self.pending.t + s.observe_s:
                self.state, self.note = "adjusting", "measuring the last change"
                return None
            rollback = self._judge(t, recent, unstarted, started)
            if rollback is not None or self.pending is not None:
                return rollback
        if t - self.last_change_t < s.min_gap_s * self.backoff:
            return None
        if self.shifted and self.last_look_t >= self.shifted_t and t - self.last_look_t < s.look_s:
            # a shift seen before the last look is kept only when the twin could not weigh it
            # there: it is asked again every look_s, news of a shift at once
            return None
        shifted, self.shifted = self.shifted, None
        if now.requests < MIN_REQUESTS and not shifted:
            self.state, self.note = "holding", MEASURED_TOO_FEW
            return None
        violated = self._violated(now)
        if not set(violated) <= self.looked_at or shifted:
            # a target missed anew, at none of the looks since the backoff began; fewer misses
            # are no reason to look sooner (in a heavy phase TTFT and TPOT came and went in
            # turn between looks, and each return restarted the backoff)
            self.fruitless_looks = 0
        if t - self.last_look_t < self._look_gap(bool(violated)) and not shifted:
            self.state = "holding"
            self.note = "; ".join(violated.values()) or "targets met"
            return None
        self.last_look_t = t
        self.looked_at = set(violated) | (self.looked_at if self.fruitless_looks else set())
        if not violated and not shifted and self._no_room_measured(now):
            self.fruitless_looks += 1
            self.state = "holding"
            self.note = (
                f"targets met, {now.attainment:.0%} of {now.requests} requests attaining: no "
                f"candidate can gain {s.gain:.2f} in score"
            )
            return None
        why = {**violated, **({"load": f"load shifted: {shifted.text}"} if shifted else {})}
        hints = shifted.causes if shifted else ()
        window, least = self.arrivals_window(t), MIN_SIMULATED if shifted else 0

        def ask(changes: list[dict[str, Any]], errors: float) -> list[Trial]:
            return evaluate(changes, window, errors, least)

        decision = self._choose(t, knobs, now, why, hints, attribution, ask)
        self.fruitless_looks = 0 if decision is not None else self.fruitless_looks + 1
        if decision is None and shifted and self.state == "holding":
            self.note = f"load shifted ({shifted.text}); {self.note}"
        if (
            decision is None
            and self.state == "waiting"
            and shifted
            and t - self.regime_t < s.arrivals_s
        ):
            # the twin could not weigh it yet (a new load runs steps unlike any fitted): ask
            # again as the new load's steps come in
            self.shifted = shifted
        return decision

    def _no_room_measured(self, now: Measured) -> bool:
        """Whether `now` measured an attainment above the `ceiling`: with every target met
        and the load steady, no candidate can gain enough either, and the twin need not be
        asked (such looks were a quarter of its CPU on a phased load). Not while waiting for
        the twin to run at all: that wait is what the state shows."""
        if self.state == "waiting" or now.attainment is None:
            return False
        return now.attainment > ceiling(self.settings)

    def _watch_load(self, t: float, arrivals: Sequence[Arrival]) -> None:
        """Note a shift in the arrivals against those of the last arrivals_s since the last
        shift: a look weighs it at once, and the twin repeats only the arrivals since. For
        arrivals_s after a shift, longer prompts it did not name are news too: the look they
        bring weighs what they bring (the arrivals window still runs from the shift)."""
        since = max(self.regime_t, t - SHIFT_S - self.settings.arrivals_s)
        seen = shift(arrivals, t, since)
        if seen is not None:
            self.regime_t, self.regime, self.regime_since = t, seen, since
        elif self.regime is not None and t - self.regime_t < self.settings.arrivals_s:
            seen = longer_since(arrivals, t, self.regime, self.regime_t, self.regime_since)
            self.regime = seen or self.regime
        if seen is not None:
            self.shifted, self.shifted_t = seen, t

    def arrivals_window(self, t: float) -> float:
        """Seconds of recent arrivals the twin repeats: arrivals_s, or fewer after a shift:
        those since the SHIFT_S that showed it."""
        return min(self.settings.arrivals_s, t - self.regime_t + SHIFT_S)

    def _late(self, t: float, arrivals: Sequence[float]) -> list[float]:
        """The waits (ms) of those of `arrivals`, without a first token at `t`, that are past
        the TTFT target."""
        return [1000 * (t - a) for a in arrivals if self._past_target(t, a)]

    def _past_target(self, t: float, arrival: float) -> bool:
        return 1000 * (t - arrival) > self.settings.ttft_p90_ms

    def _look_gap(self, violated: bool) -> float:
        """Seconds between looks: look_s while a target is missed, explore_s while every one
        is met; doubled after each look that found nothing to do, until a target is missed
        that was at none of those looks (or the load shifts), up to MAX_LOOK_BACKOFF times:
        the twin is most of the CPU the autopilot costs."""
        s = self.settings
        base = s.look_s if violated else s.explore_s
        return base * min(MAX_LOOK_BACKOFF, 2**self.fruitless_looks)

    def _violated(self, m: Measured) -> dict[str, str]:
        """The targets missed, by metric ("ttft", "tpot"), in words."""
        s, out = self.settings, {}
        if m.ttft_p90_ms is not None and m.ttft_p90_ms > s.ttft_p90_ms:
            out["ttft"] = f"p90 TTFT {ms_text(m.ttft_p90_ms)} > {ms_text(s.ttft_p90_ms)} target"
        if m.tpot_p90_ms is not None and m.tpot_p90_ms > s.tpot_p90_ms:
            out["tpot"] = f"p90 TPOT {ms_text(m.tpot_p90_ms)} > {ms_text(s.tpot_p90_ms)} target"
        return out

    def _choose(
        self,
        t: float,
        knobs: Knobs,
        now: Measured,
        violated: dict[str, str],
        hints: Sequence[str],
        attribution: Attribution,
        ask: Ask,
    ) -> Decision | None:
        """`hints`: causes a shift in the load brings, weighed before the attribution's (of
        requests that ended under the load before). The twin weighs the knobs as they are
        first: at most looks they leave no room (`ceiling`), and then neither the attribution
        nor the candidates are worked out (each look that weighed the candidates too cost
        three to five times as much)."""
        generation = self.generation
        asked = self._asked(ask, [{}], generation)
        if asked is None:
            return None
        (current,) = asked
        if current.outcome is None:
            self.state, self.note = "waiting", current.refused or "the twin cannot run"
            return None
        if score(current, self.settings) > ceiling(self.settings):
            self.state = "holding"
            self.note = (
                f"the twin predicts {current.slo_attainment or 0:.0%} attainment as the knobs "
                f"are: no candidate can gain {self.settings.gain:.2f} in score"
            )
            return None
        banned = {m for m, until in self.banned.items() if until > t}
        attributed = attribution()
        causes = [*hints, *dominant_causes(attributed)]
        candidates = moves(knobs, self.settings, causes, banned, together=hints)
        if not candidates:
            self.state, self.note = "holding", "no move left within the bounds"
            return None
        rest = self._asked(ask, [c for c, _ in candidates], generation)
        if rest is None:
            return None
        # nothing attains under any candidate: a lower p90 that still misses gains nothing, but
        # a queue that drains sooner lets the requests after it attain
        hopeless = not current.slo_attainment and not any(tr.slo_attainment for tr in rest)
        base = score(current, self.settings, excess=not hopeless)
        requests = simulated(current)
        scored: list[Scored] = [
            (
                score(tr, self.settings, excess=not hopeless) - base,
                self._need(m, t, bool(violated), requests),
                tr,
                m,
            )
            for tr, (_, m) in zip(rest, candidates, strict=True)
            if tr.outcome is not None
        ]
        if not scored:
            self.state, self.note = "holding", "the twin refused every candidate"
            return None
        cleared = [x for x in scored if x[0] >= x[1]]
        if not cleared:
            self.state, self.note = "holding", self._no_gain(t, scored, hopeless, requests)
            return None
        gained, _, best, move = max(cleared, key=lambda x: x[0])
        doubt = self._doubt(best, gained, not hopeless, ask)
        if generation != self.generation:
            return None
        if doubt is not None:
            self.state, self.note = "holding", doubt
            return None
        old = knobs.model_dump()
        changes = {k: [old[k], v] for k, v in best.changes.items()}
        reason = change_reason(violated, attributed, changes, current, best)
        decision = Decision(t, "change", reason, changes, predicted=prediction(best))
        self.pending = Pending(t, decision, now, move, current.slo_attainment)
        return decision

    def _asked(
        self, ask: Ask, changes: list[dict[str, Any]], generation: int
    ) -> list[Trial] | None:
        """The twin's trials of `changes`; None when it cannot run (why, in the state), or when
        new settings or a person's change came while it ran: they stand."""
        try:
            trials = ask(changes, 0.0)
        except InvalidInput as exc:
            if generation == self.generation:
                self.state, self.note = "waiting", str(exc)
            return None
        return trials if generation == self.generation else None

    def _doubt(self, best: Trial, gained: float, excess: bool, ask: Ask) -> str | None:
        """Why `best`'s predicted gain (`gained`) may be the twin's error, in words: with every
        step one held-out error longer, or shorter, than the fit, it loses, or it gains
        nothing both ways; None otherwise. The need was cleared by the fit's prediction; under
        the error the change must do no harm and still help one way. A uniform error moves
        both trials, so it can squeeze a real gain (a smaller chunk gained 10-40 points in a
        long-prompt phase that the twin predicted +0.10 for, +0.06 with its steps 13% longer)
        or leave nothing to gain one way (with steps shorter, the knobs as they are may
        attain too). Only a change about to be made pays these two runs, and a loss the first
        way spares the second."""
        gains: dict[str, float] = {}
        for errors, way in ((-1.0, "shorter"), (1.0, "longer")):
            trials = ask([{}, best.changes], errors)
            gains[way] = (
                score(trials[1], self.settings, excess) - score(trials[0], self.settings, excess)
                if len(trials) == 2 and trials[0].outcome and trials[1].outcome
                else -math.inf
            )
            if gains[way] < 0:
                break
        worst = min(gains, key=gains.__getitem__)
        if gains[worst] < 0 or max(gains.values()) <= 0:
            what = ", ".join(f"{k} {v}" for k, v in best.changes.items())
            shown = "nothing" if gains[worst] == -math.inf else f"{gains[worst]:+.3f}"
            return (
                f"{what} is predicted to gain {gained:+.3f} in score, but {shown} "
                f"with the twin's steps one held-out error {worst}: within its error"
            )
        return None

    def _need(self, move: Move, t: float, violated: bool, requests: int) -> float:
        """The predicted score gain a move must clear: `gain`, twice that while every target is
        met, but at least MIN_GAINED of the `requests` simulated; REVERSE_GAIN times more for
        undoing our own change of the last REVERSE_S."""
        floor = MIN_GAINED / requests if requests else 0.0
        need = max(self.settings.gain * (1 if violated else 2), floor)
        return need * REVERSE_GAIN if self._reverses(move, t) else need

    def _reverses(self, move: Move, t: float) -> str | None:
        """The knob of ours that `move` would take back within REVERSE_S, if any."""
        for knob, direction in move:
            last = self.last_moves.get(knob)
            if last is not None and last[0] == -direction and t - last[1] < REVERSE_S:
                return knob
        return None

    def _no_gain(self, t: float, scored: list[Scored], hopeless: bool, requests: int) -> str:
        """Why no candidate cleared its need, in words."""
        gain, need, _, move = max(scored, key=lambda x: x[0] - x[1])
        text = f"no candidate predicted to gain {need:.2f} in score (best {gain:+.3f})"
        if requests and MIN_GAINED / requests > self.settings.gain:
            text += f"; a gain must be worth {MIN_GAINED} of the {requests} requests simulated"
        if undone := self._reverses(move, t):
            text += f"; undoing its own {undone} change so soon needs {REVERSE_GAIN:g}x the gain"
        if hopeless:
            text = (
                "the twin predicts no request meets both targets under any candidate: only a "
                f"faster-draining queue would justify a change; {text}"
            )
        return text

    def _judge(
        self,
        t: float,
        recent: list[dict[str, Any]],
        unstarted: Sequence[float],
        started: Sequence[float],
    ) -> Decision | None:
        """Roll the pending change back if attainment fell since it, below what was measured
        before it and below what the twin predicted for the knobs unchanged (under a rising
        load attainment falls whatever the knobs; that fall is not the change's doing), by more
        than chance on the requests measured after it, else accept it."""
        pending = self.pending
        assert pending is not None
        after = self._cohort(t, pending.t, recent, unstarted, started)
        before = pending.before.attainment
        if after.requests < MIN_REQUESTS and t < pending.t + JUDGE_WITHIN * self.settings.observe_s:
            self.state, self.note = "adjusting", "waiting for requests to judge the last change"
            return None
        self.pending = None
        if before is None or after.attainment is None or after.requests < MIN_REQUESTS:
            return None
        baseline = before if pending.unchanged is None else min(before, pending.unchanged)
        if not fell(after, baseline - ROLLBACK_MARGIN):
            self.backoff = max(1.0, self.backoff / 2)
            return None
        self.banned[pending.move] = t + BAN_S
        self.backoff = min(MAX_BACKOFF, self.backoff * 2)
        undo = {k: [new, old] for k, (old, new) in pending.decision.changes.items()}
        moves_text = ", ".join(f"{k} {a} → {b}" for k, (a, b) in undo.items())
        reason = (
            f"rolled back: SLO attainment {after.attainment:.0%} of {after.requests} requests "
            f"after the change, {before:.0%} before: {moves_text}; next change no sooner than "
            f"{self.settings.min_gap_s * self.backoff:g} s"
        )
        self.state, self.note = "rolled back", reason
        return Decision(t, "rollback", reason, undo)

    def _cohort(
        self,
        t: float,
        since: float,
        recent: list[dict[str, Any]],
        unstarted: Sequence[float],
        started: Sequence[float],
    ) -> Measured:
        """The requests that arrived from `since` on, up to the first whose outcome is still
        open (one decoding, or one waiting for a first token within the TTFT target). Those
        that ended alone would leave out the ones still decoding, mostly those whose first
        token came in time, and keep every late one: a sample of misses."""
        waiting = [a for a in unstarted if a >= since and not self._past_target(t, a)]
        end = min([a for a in started if a >= since] + waiting, default=math.inf)
        return Measured.of(
            [r for r in recent if since <= r["arrival"] < end],
            self.settings.slo,
            self._late(t, [a for a in unstarted if since <= a < end]),
        )

    def applied(self, decision: Decision, version: int) -> None:
        decision.version = version
        self.decisions.append(decision)
        self.last_change_t = decision.t
        if decision.action != "change":
            return
        if self.state != "paused":
            # a person's change taken while the engine applied this one keeps its pause shown
            self.state, self.note = "adjusting", decision.reason
        if self.pending is not None:
            for knob, direction in self.pending.move:
                self.last_moves[knob] = (direction, decision.t)

    def refused(self, decision: Decision, message: str) -> None:
        """The engine refused the change: record it and keep going."""
        decision.refused = message
        self.decisions.append(decision)
        self.pending = None
        if self.state != "paused":
            self.note = f"the engine refused {decision.knob_values()}: {message}"
            self.state = "holding"

    def status(self, history: int = HISTORY) -> dict[str, Any]:
        """State, note, decisions newest first, and the last `history` measurements."""
        last = self.decisions[-1] if self.decisions else None
        return {
            "state": self.state,
            "note": self.note,
            "paused_until": self.paused_until if self.state == "paused" else None,
            "last_decision": None if last is None else vars(last),
            "decisions": [vars(d) for d in reversed(self.decisions)],
            "history": [{"t": t, **vars(m)} for t, m in list(self.history)[-history:]]
            if history > 0
            else [],
        }


def fell(after: Measured, baseline: float) -> bool:
    """Whether fewer of `after`'s requests attained than chance would leave with probability
    ROLLBACK_P, had each attained with probability `baseline`."""
    if after.attainment is None or baseline <= 0:
        return False
    attained = round(after.attainment * after.requests)
    return float(bdtr(attained, after.requests, baseline)) < ROLLBACK_P  # the binomial CDF


def score(trial: Trial, settings: AutopilotSettings, excess: bool = True) -> float:
    """SLO attainment, plus goodput by its weight, less EXCESS_WEIGHT for each e-fold a
    predicted p90 lies above its target (unless not `excess`) and BACKLOG_WEIGHT times the
    share of requests still waiting at the horizon: when every request already misses (a
    queue waited too long), attainment alone cannot tell a setting that drains it faster."""
    out = trial.outcome or {}
    over = sum(
        math.log(p90 / target)
        for p90, target in (
            (out.get("ttft_p90_ms"), settings.ttft_p90_ms),
            (out.get("tpot_p90_ms"), settings.tpot_p90_ms),
        )
        if excess and p90 is not None and p90 > target
    )
    total = simulated(trial)
    backlog = out.get("queue_at_end", 0) / total if total else 0.0
    attainment = trial.slo_attainment or 0.0
    goodput = settings.goodput_weight * (trial.goodput_rps or 0.0)
    return attainment + goodput - EXCESS_WEIGHT * over - BACKLOG_WEIGHT * backlog


def simulated(trial: Trial) -> int:
    """The requests a trial simulated: those that ended and those left unfinished."""
    out = trial.outcome or {}
    return len(out.get("latencies_ms", [])) + out.get("unfinished", 0)


def ceiling(settings: AutopilotSettings) -> float:
    """The score of the knobs as they are above which no candidate can gain `gain`:
    no score exceeds 1 (every request attaining) while goodput counts for nothing; with
    goodput in the score there is no such bound."""
    return 1.0 - settings.gain if settings.goodput_weight == 0 else math.inf


def dominant_causes(attribution: dict[str, Any] | None) -> list[str]:
    """Causes of the tail's TTFT and TPOT, largest share first."""
    if not attribution:
        return []
    shares = {**attribution.get("tpot_p90", {}), **attribution.get("ttft_p90", {})}
    return sorted(shares, key=lambda c: -shares[c])


def ms_text(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def prediction(trial: Trial) -> dict[str, Any]:
    out = trial.outcome or {}
    return {
        "ttft_p90_ms": out.get("ttft_p90_ms"),
        "tpot_p90_ms": out.get("tpot_p90_ms"),
        "queue_at_end": out.get("queue_at_end"),
        "slo_attainment": trial.slo_attainment,
        "goodput_rps": trial.goodput_rps,
    }


def change_reason(
    violated: dict[str, str],
    attribution: dict[str, Any] | None,
    changes: dict[str, list[Any]],
    current: Trial,
    best: Trial,
) -> str:
    """E.g. "p90 TTFT 1.9 s > 800 ms target (70% of p90 TTFT is queueing for a slot:
    max_num_seqs): max_num_seqs 16 → 32, predicted p90 TTFT 600 ms, attainment 40% → 85%"."""
    dominant = (attribution or {}).get("dominant") or {}
    why = [
        f"{text} ({d['text']})" if (d := dominant.get(metric)) else text
        for metric, text in violated.items()
    ] or ["targets met; the twin predicts better"]
    what = ", ".join(f"{k} {a} → {b}" for k, (a, b) in changes.items())
    now, then = prediction(current), prediction(best)
    predicted = [
        f"p90 {m.upper()} {ms_text(now[f'{m}_p90_ms'])} → {ms_text(then[f'{m}_p90_ms'])}"
        for m in ("ttft", "tpot")
        if now[f"{m}_p90_ms"] is not None and then[f"{m}_p90_ms"] is not None
    ]
    predicted.append(f"queued at the horizon {now['queue_at_end']} → {then['queue_at_end']}")
    predicted.append(
        f"attainment {now['slo_attainment'] or 0:.0%} → {then['slo_attainment'] or 0:.0%}"
    )
    return f"{', '.join(why)}: {what}; predicted {', '.join(predicted)}"
