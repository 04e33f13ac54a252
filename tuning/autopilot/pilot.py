"""The SLO autopilot's decisions: when to check the targets and ask the twin, which knob set the
twin predicts best, when to apply it, and when to roll a change back. Pure: the caller supplies
the clock, the requests that ended lately, the attribution and a twin to evaluate candidates,
and applies what it decides (`applied` / `refused` / `dropped` tell it how that went)."""

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
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
DECISIONS = 50  # decisions kept (the newest), with their reasons
MIN_REQUESTS = 5  # requests a window needs before its percentiles mean anything
ROLLBACK_MARGIN = 0.05  # attainment this much worse after a change than before: undo it
# ... and as few attaining after it as chance gives this rarely at that attainment: in a phase
# of long prompts five to ten requests come in the seconds after a change
ROLLBACK_P = 0.05
BAN_S = 120.0  # a rolled-back move is not tried again for this long
MAX_CHANGE_BACKOFF = 8  # the gap between changes grows up to this many times after rollbacks
JUDGE_WITHIN = 3  # observe_s periods to wait for enough requests to judge a change
MAX_CHECK_BACKOFF = 4  # checks that change nothing space the next out up to this many times
REVERSE_S = 60.0  # undoing its own change this soon after it needs REVERSE_GAIN times the gain
REVERSE_GAIN = 2.0
# a gain must be worth this many of the simulated requests attaining: whether one request
# makes its targets is within the twin's error (its step times are 10-20% off)
MIN_GAINED = 2
# requests the twin simulates at least on the check a shift brings, its horizon stretched for
# them (tuning.twin.live.stretched_horizon): at the 11 a 10 s horizon held in a phase of long
# prompts, one request was 9 points, and the chunk lost to the budget by one. Only there: the
# twin's CPU grows with its horizon, and the shift's check is the one that settles a phase soonest
MIN_SIMULATED = 30

MEASURED_TOO_FEW = (
    f"fewer than {MIN_REQUESTS} requests measured lately (ended, or waiting for a first token "
    "past the TTFT target)"
)

Action = Literal["change", "rollback", "hold"]


class Phase(StrEnum):
    """What the autopilot is doing; its value is the `state` GET /api/autopilot shows."""

    OFF = "off"  # not enabled
    WAITING = "waiting"  # for the twin to be able to run (too few steps fitted, a new load)
    HOLDING = "holding"  # the knobs as they are: nothing to gain, or not time to check yet
    ADJUSTING = "adjusting"  # a change made, being measured before it is judged
    ROLLED_BACK = "rolled back"  # the last change made things worse and was undone
    PAUSED = "paused"  # by a person's change, until pause_s after it


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
# Evaluate for one check, its window and least requests fixed: (changes, errors)
RunTwin = Callable[[list[dict[str, Any]], float], list[Trial]]
Scored = tuple[float, float, Trial, Move]  # predicted gain, the gain required, trial, move


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
class ChangeOnTrial:
    """A change in force, waiting to be judged against what was measured before it."""

    t: float
    decision: Decision
    before: Measured
    move: Move  # its steps, as `moves` gives them
    unchanged: float | None  # the attainment the twin predicted had the knobs stayed


@dataclass(frozen=True)
class Outcome:
    """What one tick concluded: the phase to show and why (`phase` None: keep the one shown),
    and a change or rollback for the caller to apply."""

    phase: Phase | None = None
    note: str = ""
    decision: Decision | None = None


KEEP = Outcome()


@dataclass
class LoadShift:
    """The last shift in the load seen (tuning.twin.load_shift)."""

    t: float  # when it was seen
    shift: Shift  # with longer prompts named after it (`longer_since`)
    compared_from: float  # the arrivals it was told against began here


class Autopilot:
    """Holds the state between ticks; one tick every `settings.interval_s`. The phase and its
    note change in `_enter` alone: once a tick (`tick`, with the `Outcome` that `_next`
    decides), and on the events between ticks (`configure`, `person_changed`, `applied`,
    `refused`)."""

    def __init__(self, settings: AutopilotSettings) -> None:
        self.settings = settings
        self.phase = Phase.WAITING if settings.enabled else Phase.OFF
        self.note = ""  # why it is in its phase, in words
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS)
        # what each tick measured over the last observe_s, for the attainment chart
        self.history: deque[tuple[float, Measured]] = deque(maxlen=HISTORY)
        self.change_on_trial: ChangeOnTrial | None = None
        self.paused_until = float("-inf")
        # pacing the changes: the last one applied, the gap's factor (rollbacks double it),
        # the moves rolled back and until when they are not tried again, and knob ->
        # (direction, t) of our last move of each
        self.last_change_t = float("-inf")
        self.change_backoff = 1.0
        self.banned_until: dict[Move, float] = {}
        self.last_knob_moves: dict[str, tuple[int, float]] = {}
        # pacing the checks: the last that asked the twin, the checks in a row that changed
        # nothing with no target missed anew, and the targets missed at those checks
        self.last_check_t = float("-inf")
        self.checks_without_change = 0
        self.missed_at_checks: set[str] = set()
        self.last_shift: LoadShift | None = None
        self.unweighed_shift: Shift | None = None  # the last shift, until a check has weighed it
        self.shift_news_t = float("-inf")  # when `unweighed_shift` last told something new
        # bumped by configure and a person's change, which may come while the twin runs
        self.external_changes = 0

    def _enter(self, phase: Phase, note: str) -> None:
        """The one place the phase and its note change."""
        self.phase, self.note = phase, note

    def configure(self, settings: AutopilotSettings) -> None:
        self.settings = settings
        self.external_changes += 1
        if not settings.enabled:
            self.change_on_trial = None
            self._enter(Phase.OFF, "")
        elif self.phase is Phase.OFF:
            self._enter(Phase.WAITING, "starting")

    def person_changed(self, t: float, origin: str) -> None:
        """A change someone else made: pause, and never judge or undo it as ours."""
        if not self.settings.enabled:
            return
        self.external_changes += 1
        self.paused_until = t + self.settings.pause_s
        self.change_on_trial = None
        self._enter(
            Phase.PAUSED,
            f"paused by a change from {origin!r} until {self.settings.pause_s:g} s after it; "
            "the autopilot will not override it before then",
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
        the change on trial), `unstarted` the arrival times of the requests in the engine
        without a first token yet, `started` those of the requests in the engine with one,
        `arrivals` (arrival, prompt length) of every request that arrived lately, ended or
        not, `attribution` gives the `summarize` of the ended ones (or None), asked only when
        the twin is. A change or a rollback is for the caller to apply; None means hold."""
        s = self.settings
        if not s.enabled:
            return None
        ended = [r for r in recent if r["finished_t"] >= t - s.observe_s]
        measured = Measured.of(ended, s.slo, self._late_waits_ms(t, unstarted))
        self.history.append((t, measured))
        self._detect_load_shift(t, arrivals)
        outcome = self._next(t, knobs, measured, recent, attribution, evaluate, unstarted, started)
        if outcome.phase is not None:
            self._enter(outcome.phase, outcome.note)
        elif self.phase is Phase.PAUSED and t >= self.paused_until:
            self._enter(Phase.HOLDING, "resumed after a person's change")
        return outcome.decision

    def _next(
        self,
        t: float,
        knobs: Knobs,
        measured: Measured,
        recent: list[dict[str, Any]],
        attribution: Attribution,
        evaluate: Evaluate,
        unstarted: Sequence[float],
        started: Sequence[float],
    ) -> Outcome:
        """The tick's outcome: kept while paused; the change on trial measured, then judged
        (rolled back, or kept); nothing within the gap between changes; else a check."""
        s = self.settings
        if t < self.paused_until:
            return KEEP
        if self.change_on_trial is not None and self.unweighed_shift is not None:
            # what is measured after the change ran under another load than before it
            self.change_on_trial = None
        if self.change_on_trial is not None:
            if t < self.change_on_trial.t + s.observe_s:
                return Outcome(Phase.ADJUSTING, "measuring the last change")
            judged = self._judge_change(t, recent, unstarted, started)
            if judged is not None:
                return judged
        if t - self.last_change_t < s.min_gap_s * self.change_backoff:
            return KEEP
        return self._check(t, knobs, measured, attribution, evaluate)

    def _check(
        self,
        t: float,
        knobs: Knobs,
        measured: Measured,
        attribution: Attribution,
        evaluate: Evaluate,
    ) -> Outcome:
        """The targets against what was `measured` lately, and the twin asked when a check is
        due (`_check_interval`), or at once on news of a shift in the load."""
        s = self.settings
        unweighed = self.unweighed_shift
        if (
            unweighed is not None
            and self.last_check_t >= self.shift_news_t
            and t - self.last_check_t < s.look_s
        ):
            # a shift seen before the last check is kept only when the twin could not weigh it
            # there: it is asked again every look_s, news of a shift at once
            return KEEP
        self.unweighed_shift = None
        if measured.requests < MIN_REQUESTS and unweighed is None:
            return Outcome(Phase.HOLDING, MEASURED_TOO_FEW)
        missed = self._missed_targets(measured)
        if not set(missed) <= self.missed_at_checks or unweighed is not None:
            # a target missed anew, at none of the checks since the backoff began; fewer misses
            # are no reason to check sooner (in a heavy phase TTFT and TPOT came and went in
            # turn between checks, and each return restarted the backoff)
            self.checks_without_change = 0
        if t - self.last_check_t < self._check_interval(bool(missed)) and unweighed is None:
            return Outcome(Phase.HOLDING, "; ".join(missed.values()) or "targets met")
        self.last_check_t = t
        earlier = self.missed_at_checks if self.checks_without_change else set()
        self.missed_at_checks = set(missed) | earlier
        if not missed and unweighed is None and self._measured_leaves_no_room(measured):
            self.checks_without_change += 1
            return Outcome(
                Phase.HOLDING,
                f"targets met, {measured.attainment:.0%} of {measured.requests} requests "
                f"attaining: no candidate can gain {s.gain:.2f} in score",
            )
        load = {"load": f"load shifted: {unweighed.text}"} if unweighed is not None else {}
        hints = unweighed.causes if unweighed is not None else ()
        window = self.arrivals_window(t)
        least = MIN_SIMULATED if unweighed is not None else 0

        def run_twin(changes: list[dict[str, Any]], errors: float) -> list[Trial]:
            return evaluate(changes, window, errors, least)

        reasons = {**missed, **load}
        outcome = self._choose_change(t, knobs, measured, reasons, hints, attribution, run_twin)
        if outcome.decision is not None:
            self.checks_without_change = 0
            return outcome
        self.checks_without_change += 1
        if unweighed is None:
            return outcome
        if outcome.phase is Phase.HOLDING:
            outcome = replace(outcome, note=f"load shifted ({unweighed.text}); {outcome.note}")
        if (outcome.phase or self.phase) is Phase.WAITING and t - self._shift_t < s.arrivals_s:
            # the twin could not weigh it yet (a new load runs steps unlike any fitted): ask
            # again as the new load's steps come in
            self.unweighed_shift = unweighed
        return outcome

    def _measured_leaves_no_room(self, measured: Measured) -> bool:
        """Whether `measured` has an attainment above the `max_improvable_score`: with every
        target met and the load steady, no candidate can gain enough either, and the twin
        need not be asked (such checks were a quarter of its CPU on a phased load). Not while
        waiting for the twin to run at all: that wait is what the phase shows."""
        if self.phase is Phase.WAITING or measured.attainment is None:
            return False
        return measured.attainment > max_improvable_score(self.settings)

    @property
    def _shift_t(self) -> float:
        """When the last shift in the load was seen (-inf: none yet)."""
        return float("-inf") if self.last_shift is None else self.last_shift.t

    def _detect_load_shift(self, t: float, arrivals: Sequence[Arrival]) -> None:
        """Note a shift in the arrivals against those of the last arrivals_s since the last
        shift: a check weighs it at once, and the twin repeats only the arrivals since. For
        arrivals_s after a shift, longer prompts it did not name are news too: the check they
        bring weighs what they bring (the arrivals window still runs from the shift)."""
        last = self.last_shift
        since = max(self._shift_t, t - SHIFT_S - self.settings.arrivals_s)
        seen = shift(arrivals, t, since)
        if seen is not None:
            self.last_shift = LoadShift(t, seen, since)
        elif last is not None and t - last.t < self.settings.arrivals_s:
            seen = longer_since(arrivals, t, last.shift, last.t, last.compared_from)
            last.shift = seen or last.shift
        if seen is not None:
            self.unweighed_shift, self.shift_news_t = seen, t

    def arrivals_window(self, t: float) -> float:
        """Seconds of recent arrivals the twin repeats: arrivals_s, or fewer after a shift:
        those since the SHIFT_S that showed it."""
        return min(self.settings.arrivals_s, t - self._shift_t + SHIFT_S)

    def _late_waits_ms(self, t: float, arrivals: Sequence[float]) -> list[float]:
        """The waits (ms) of those of `arrivals`, without a first token at `t`, that are past
        the TTFT target."""
        return [1000 * (t - a) for a in arrivals if self._past_ttft_target(t, a)]

    def _past_ttft_target(self, t: float, arrival: float) -> bool:
        return 1000 * (t - arrival) > self.settings.ttft_p90_ms

    def _check_interval(self, missed: bool) -> float:
        """Seconds between checks that ask the twin: look_s while a target is missed,
        explore_s while every one is met; doubled after each check that changed nothing,
        until a target is missed that was at none of those checks (or the load shifts), up to
        MAX_CHECK_BACKOFF times: the twin is most of the CPU the autopilot costs."""
        s = self.settings
        base = s.look_s if missed else s.explore_s
        return base * min(MAX_CHECK_BACKOFF, 2**self.checks_without_change)

    def _missed_targets(self, m: Measured) -> dict[str, str]:
        """The targets missed, by metric ("ttft", "tpot"), in words."""
        s, out = self.settings, {}
        if m.ttft_p90_ms is not None and m.ttft_p90_ms > s.ttft_p90_ms:
            out["ttft"] = f"p90 TTFT {ms_text(m.ttft_p90_ms)} > {ms_text(s.ttft_p90_ms)} target"
        if m.tpot_p90_ms is not None and m.tpot_p90_ms > s.tpot_p90_ms:
            out["tpot"] = f"p90 TPOT {ms_text(m.tpot_p90_ms)} > {ms_text(s.tpot_p90_ms)} target"
        return out

    def _choose_change(
        self,
        t: float,
        knobs: Knobs,
        measured: Measured,
        reasons: dict[str, str],
        hints: Sequence[str],
        attribution: Attribution,
        run_twin: RunTwin,
    ) -> Outcome:
        """`reasons` to change: the targets missed and a shift in the load, in words (none:
        the check seeks a gain); `hints`: causes that shift brings, weighed before the
        attribution's (of requests that ended under the load before). The twin weighs the
        knobs as they are first: at most checks they leave no room (`max_improvable_score`),
        and then neither the attribution nor the candidates are worked out (each check that
        weighed the candidates too cost three to five times as much). A change made is on
        trial from here (`change_on_trial`)."""
        external = self.external_changes
        as_is = self._twin_trials(run_twin, [{}], external)
        if isinstance(as_is, Outcome):
            return as_is
        (current,) = as_is
        if current.outcome is None:
            return Outcome(Phase.WAITING, current.refused or "the twin cannot run")
        if score(current, self.settings) > max_improvable_score(self.settings):
            return Outcome(
                Phase.HOLDING,
                f"the twin predicts {current.slo_attainment or 0:.0%} attainment as the knobs "
                f"are: no candidate can gain {self.settings.gain:.2f} in score",
            )
        banned = {m for m, until in self.banned_until.items() if until > t}
        attributed = attribution()
        causes = [*hints, *dominant_causes(attributed)]
        candidates = moves(knobs, self.settings, causes, banned, together=hints)
        if not candidates:
            return Outcome(Phase.HOLDING, "no move left within the bounds")
        trials = self._twin_trials(run_twin, [c for c, _ in candidates], external)
        if isinstance(trials, Outcome):
            return trials
        # nothing attains under any candidate: a lower p90 that still misses gains nothing, but
        # a queue that drains sooner lets the requests after it attain
        hopeless = not current.slo_attainment and not any(tr.slo_attainment for tr in trials)
        requests = simulated(current)
        scored: list[Scored] = [
            (
                gain(tr, current, self.settings, excess=not hopeless),
                self._required_gain(m, t, bool(reasons), requests),
                tr,
                m,
            )
            for tr, (_, m) in zip(trials, candidates, strict=True)
            if tr.outcome is not None
        ]
        if not scored:
            return Outcome(Phase.HOLDING, "the twin refused every candidate")
        cleared = [x for x in scored if x[0] >= x[1]]
        if not cleared:
            return Outcome(Phase.HOLDING, self._no_gain_reason(t, scored, hopeless, requests))
        safe = [x for x in cleared if not risky(x[2], current)]
        if not safe:
            return Outcome(Phase.HOLDING, risky_reason(max(cleared, key=lambda x: x[0])[2]))
        cleared = safe
        gained, _, best, move = max(cleared, key=lambda x: x[0])
        within_error = self._gain_within_twin_error(best, gained, not hopeless, run_twin)
        if external != self.external_changes:
            return KEEP
        if within_error is not None:
            return Outcome(Phase.HOLDING, within_error)
        old = knobs.model_dump()
        changes = {k: [old[k], v] for k, v in best.changes.items()}
        reason = change_reason(reasons, attributed, changes, current, best)
        decision = Decision(t, "change", reason, changes, predicted=prediction(best))
        self.change_on_trial = ChangeOnTrial(t, decision, measured, move, current.slo_attainment)
        return Outcome(decision=decision)

    def _twin_trials(
        self, run_twin: RunTwin, changes: list[dict[str, Any]], external: int
    ) -> list[Trial] | Outcome:
        """The twin's trials of `changes`; else the outcome: waiting when it cannot run (why,
        in the note), or KEEP when new settings or a person's change came while it ran (since
        `external`): they stand."""
        try:
            trials = run_twin(changes, 0.0)
        except InvalidInput as exc:
            return Outcome(Phase.WAITING, str(exc)) if external == self.external_changes else KEEP
        return trials if external == self.external_changes else KEEP

    def _gain_within_twin_error(
        self, best: Trial, gained: float, excess: bool, run_twin: RunTwin
    ) -> str | None:
        """Why `best`'s predicted gain (`gained`) may be the twin's error, in words: with every
        step one held-out error longer, or shorter, than the fit, it loses, or it gains
        nothing both ways; None otherwise. The required gain was cleared by the fit's
        prediction; under the error the change must do no harm and still help one way. A
        uniform error moves both trials, so it can squeeze a real gain (a smaller chunk gained
        10-40 points in a long-prompt phase that the twin predicted +0.10 for, +0.06 with its
        steps 13% longer) or leave nothing to gain one way (with steps shorter, the knobs as
        they are may attain too). Only a change about to be made pays these two runs, and a
        loss the first way spares the second."""
        gains: dict[str, float] = {}
        for errors, way in ((-1.0, "shorter"), (1.0, "longer")):
            trials = run_twin([{}, best.changes], errors)
            gains[way] = (
                gain(trials[1], trials[0], self.settings, excess)
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

    def _required_gain(self, move: Move, t: float, urgent: bool, requests: int) -> float:
        """The predicted score gain a move must clear: `gain`, twice that unless `urgent` (a
        target missed or the load shifted), but at least MIN_GAINED of the `requests`
        simulated; REVERSE_GAIN times more for undoing our own change of the last REVERSE_S."""
        floor = MIN_GAINED / requests if requests else 0.0
        need = max(self.settings.gain * (1 if urgent else 2), floor)
        return need * REVERSE_GAIN if self._reversed_knob(move, t) else need

    def _reversed_knob(self, move: Move, t: float) -> str | None:
        """The knob of ours that `move` would take back within REVERSE_S, if any."""
        for knob, direction in move:
            last = self.last_knob_moves.get(knob)
            if last is not None and last[0] == -direction and t - last[1] < REVERSE_S:
                return knob
        return None

    def _no_gain_reason(self, t: float, scored: list[Scored], hopeless: bool, requests: int) -> str:
        """Why no candidate cleared its required gain, in words."""
        gain, need, _, move = max(scored, key=lambda x: x[0] - x[1])
        text = f"no candidate predicted to gain {need:.2f} in score (best {gain:+.3f})"
        if requests and MIN_GAINED / requests > self.settings.gain:
            text += f"; a gain must be worth {MIN_GAINED} of the {requests} requests simulated"
        if undone := self._reversed_knob(move, t):
            text += f"; undoing its own {undone} change so soon needs {REVERSE_GAIN:g}x the gain"
        if hopeless:
            text = (
                "the twin predicts no request meets both targets under any candidate: only a "
                f"faster-draining queue would justify a change; {text}"
            )
        return text

    def _judge_change(
        self,
        t: float,
        recent: list[dict[str, Any]],
        unstarted: Sequence[float],
        started: Sequence[float],
    ) -> Outcome | None:
        """Roll the change on trial back if attainment fell since it, below what was measured
        before it and below what the twin predicted for the knobs unchanged (under a rising
        load attainment falls whatever the knobs; that fall is not the change's doing), by more
        than chance on the requests measured after it, else keep it (None: the tick goes on).
        Too few requests after it to tell: wait for them, up to JUDGE_WITHIN observe_s."""
        on_trial = self.change_on_trial
        assert on_trial is not None
        after = self._measured_since(t, on_trial.t, recent, unstarted, started)
        before = on_trial.before.attainment
        judge_by = on_trial.t + JUDGE_WITHIN * self.settings.observe_s
        if after.requests < MIN_REQUESTS and t < judge_by:
            return Outcome(Phase.ADJUSTING, "waiting for requests to judge the last change")
        self.change_on_trial = None
        if before is None or after.attainment is None or after.requests < MIN_REQUESTS:
            return None
        baseline = before if on_trial.unchanged is None else min(before, on_trial.unchanged)
        if not attainment_fell_below(after, baseline - ROLLBACK_MARGIN):
            self.change_backoff = max(1.0, self.change_backoff / 2)
            return None
        self.banned_until[on_trial.move] = t + BAN_S
        self.change_backoff = min(MAX_CHANGE_BACKOFF, self.change_backoff * 2)
        undo = {k: [new, old] for k, (old, new) in on_trial.decision.changes.items()}
        moves_text = ", ".join(f"{k} {a} → {b}" for k, (a, b) in undo.items())
        reason = (
            f"rolled back: SLO attainment {after.attainment:.0%} of {after.requests} requests "
            f"after the change, {before:.0%} before: {moves_text}; next change no sooner than "
            f"{self.settings.min_gap_s * self.change_backoff:g} s"
        )
        return Outcome(Phase.ROLLED_BACK, reason, Decision(t, "rollback", reason, undo))

    def _measured_since(
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
        waiting = [a for a in unstarted if a >= since and not self._past_ttft_target(t, a)]
        end = min([a for a in started if a >= since] + waiting, default=math.inf)
        return Measured.of(
            [r for r in recent if since <= r["arrival"] < end],
            self.settings.slo,
            self._late_waits_ms(t, [a for a in unstarted if since <= a < end]),
        )

    def applied(self, decision: Decision, version: int) -> None:
        """The engine applied `decision` as knobs `version`."""
        decision.version = version
        self.decisions.append(decision)
        self.last_change_t = decision.t
        if decision.action != "change":
            return
        if self.change_on_trial is not None:
            for knob, direction in self.change_on_trial.move:
                self.last_knob_moves[knob] = (direction, decision.t)
        if self.phase is not Phase.PAUSED:
            # a person's change taken while the engine applied this one keeps its pause shown
            self._enter(Phase.ADJUSTING, decision.reason)

    def refused(self, decision: Decision, message: str) -> None:
        """The engine refused the change: record it and keep going."""
        decision.refused = message
        self.decisions.append(decision)
        self.change_on_trial = None
        if self.phase is not Phase.PAUSED:
            self._enter(Phase.HOLDING, f"the engine refused {decision.knob_values()}: {message}")

    def dropped(self) -> None:
        """The knobs changed since the twin checked them (a person's change, which pauses it):
        the change decided is not applied, nor on trial."""
        self.change_on_trial = None

    def status(self, history: int = HISTORY) -> dict[str, Any]:
        """State, note, decisions newest first, and the last `history` measurements."""
        last = self.decisions[-1] if self.decisions else None
        return {
            "state": self.phase.value,
            "note": self.note,
            "paused_until": self.paused_until if self.phase is Phase.PAUSED else None,
            "last_decision": None if last is None else vars(last),
            "decisions": [vars(d) for d in reversed(self.decisions)],
            "history": [{"t": t, **vars(m)} for t, m in list(self.history)[-history:]]
            if history > 0
            else [],
        }


def attainment_fell_below(after: Measured, baseline: float) -> bool:
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


def risky(trial: Trial, current: Trial) -> bool:
    """Whether a candidate runs near capacity: its queue builds in some of the twin's
    simulations, and in no fewer of them than with the knobs as they are (a candidate that
    saturates less often than they do is a rescue, not a risk)."""
    return trial.builds > 0 and trial.builds >= current.builds


def risky_reason(trial: Trial) -> str:
    what = ", ".join(f"{k} {v}" for k, v in trial.changes.items())
    text = (trial.outcome or {}).get("saturation", {}).get("text", "the queue builds")
    return f"{what} would gain, but it is risky: {text}"


def simulated(trial: Trial) -> int:
    """The requests a trial simulated: those that ended and those left unfinished."""
    out = trial.outcome or {}
    return len(out.get("latencies_ms", [])) + out.get("unfinished", 0)


def gain(trial: Trial, base: Trial, settings: AutopilotSettings, excess: bool = True) -> float:
    """How much `trial` scores above `base`: the median over the twin's simulations of each
    one's gain (both met the same step costs, loads and arrivals: a slow draw slows both),
    else the gain of their medians. The gain of the medians lost most of a real one when the
    draws' step costs spread widely (a live fit on a busy machine: runs 0.4-2x): one slot to
    two under a standing queue was predicted +0.025, and the autopilot held
    (tests/api/test_api_autopilot.py)."""
    pairs = list(zip(trial.per_draw, base.per_draw, strict=False))
    if not pairs:
        return score(trial, settings, excess) - score(base, settings, excess)
    gains = [score(a, settings, excess) - score(b, settings, excess) for a, b in pairs]
    return float(stats.percentile(gains, 50) or 0.0)


def max_improvable_score(settings: AutopilotSettings) -> float:
    """The highest score of the knobs as they are that leaves a candidate room to gain `gain`:
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


PREDICTED = ("ttft_p90_ms", "tpot_p90_ms", "queue_at_end", "slo_attainment", "goodput_rps")


def prediction(trial: Trial) -> dict[str, Any]:
    """What a decision records of a trial: the medians of PREDICTED over the twin's
    simulations, their 80% bands, and the saturation."""
    out = trial.outcome or {}
    bands = out.get("bands") or {}
    return {
        "ttft_p90_ms": out.get("ttft_p90_ms"),
        "tpot_p90_ms": out.get("tpot_p90_ms"),
        "queue_at_end": out.get("queue_at_end"),
        "slo_attainment": trial.slo_attainment,
        "goodput_rps": trial.goodput_rps,
        "bands": {k: bands[k] for k in PREDICTED if k in bands},
        "saturation": out.get("saturation"),
    }


def band_text(side: dict[str, Any], key: str, text: Callable[[float], str]) -> str:
    """` [low-high]` of a prediction's band of `key`, "" without one."""
    low, high = side["bands"].get(key) or (None, None)
    return "" if low is None or high is None else f" [{text(low)}-{text(high)}]"


def change_reason(
    reasons: dict[str, str],
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
        for metric, text in reasons.items()
    ] or ["targets met; the twin predicts better"]
    what = ", ".join(f"{k} {a} → {b}" for k, (a, b) in changes.items())
    now, then = prediction(current), prediction(best)
    predicted = [
        f"p90 {m.upper()} {ms_text(now[f'{m}_p90_ms'])} → {ms_text(then[f'{m}_p90_ms'])}"
        + band_text(then, f"{m}_p90_ms", ms_text)
        for m in ("ttft", "tpot")
        if now[f"{m}_p90_ms"] is not None and then[f"{m}_p90_ms"] is not None
    ]
    predicted.append(f"queued at the horizon {now['queue_at_end']} → {then['queue_at_end']}")
    predicted.append(
        f"attainment {now['slo_attainment'] or 0:.0%} → {then['slo_attainment'] or 0:.0%}"
        + band_text(then, "slo_attainment", lambda v: f"{v:.0%}")
    )
    return f"{', '.join(why)}: {what}; predicted {', '.join(predicted)}"
