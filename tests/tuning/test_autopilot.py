"""The SLO autopilot's decisions on simulated load: the right knob in the right direction, with
a reason in words; rollback, pauses, refusals and waiting."""

import math
import re
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from test_attribution import EXPERTS, Cost, sim_setup

from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.attribution.causes import attribute
from tuning.attribution.summary import summarize
from tuning.autopilot.moves import MAX_MOVES, moves
from tuning.autopilot.pilot import (
    MEASURED_TOO_FEW,
    MIN_SIMULATED,
    REVERSE_S,
    Autopilot,
    Decision,
    Evaluate,
    Phase,
    max_improvable_score,
)
from tuning.autopilot.settings import AutopilotSettings, parse_targets
from tuning.twin.simulator import simulate
from tuning.twin.trace import TraceItem
from tuning.twin.tune import Trial, evaluate
from tuning.twin.whatif import Twin

SETUP = sim_setup(16, 2048)
CONTEXT = {"total_blocks": 2048, "min_blocks": 1, "max_model_len": 4096, "ep_size": 1}
ERROR = 0.15  # the held-out error of the twins' cost model here: their steps 10-20% off


class Load:
    """A trace run under `knobs` in simulation: what the live engine would have reported (its
    ended requests and their attribution), and a twin of it for the autopilot to ask."""

    def __init__(self, trace: list[TraceItem], cost: Cost, **knobs: Any) -> None:
        self.knobs = Knobs.model_validate({**Knobs().model_dump(), **knobs})
        sim = simulate(trace, self.knobs, SETUP, cost, EXPERTS, keep_steps=True)
        self.records = [r.model_dump() for r in sim.records]
        steps = [s.model_dump() for s in sim.steps]
        self.attribution = summarize(attribute(self.records, steps))
        self.end = max(r["finished_t"] for r in self.records)
        self.cost = cost
        self.twin = Twin(SETUP, self.knobs, trace, cost, EXPERTS, CONTEXT)  # type: ignore[arg-type]

    def evaluate(self, settings: AutopilotSettings) -> Any:
        """The twin's trials, its steps `errors` times ERROR longer."""

        def run(
            changes: list[dict[str, Any]], window_s: float, errors: float = 0.0, *_: Any
        ) -> list[Trial]:
            longer = self.cost.times(1 + errors * ERROR)
            twin = replace(self.twin, model=longer)  # type: ignore[arg-type]
            return [evaluate(twin, c, settings.slo) for c in changes]

        return run

    def tick(self, pilot: Autopilot) -> Decision | None:
        return pilot.tick(
            self.end,
            self.knobs,
            self.records,
            lambda: self.attribution,
            self.evaluate(pilot.settings),
        )


def settings(**values: Any) -> AutopilotSettings:
    return AutopilotSettings.model_validate({"enabled": True, "observe_s": 5.0, **values})


def steady(rate: float, seconds: float, prompt: int, output: int) -> list[TraceItem]:
    return [TraceItem(i / rate, prompt, output) for i in range(int(rate * seconds))]


def test_queueing_for_slots_raises_max_num_seqs() -> None:
    """Two slots serve about 11 requests a second; 20 arrive each second."""
    load = Load(steady(20, 3, 32, 16), Cost(10.0, per_prefill=0.01, per_decode=0.2), max_num_seqs=2)
    pilot = Autopilot(settings(ttft_p90_ms=200, tpot_p90_ms=50))
    decision = load.tick(pilot)
    assert decision is not None and decision.action == "change"
    old, new = decision.changes["max_num_seqs"]
    assert (old, new) == (2, 4)
    assert decision.reason.startswith("p90 TTFT")
    assert "queueing for a slot: max_num_seqs" in decision.reason
    assert "max_num_seqs 2 → 4" in decision.reason and "predicted p90 TTFT" in decision.reason
    assert decision.predicted is not None and decision.predicted["slo_attainment"] > 0.5
    # the prediction is a median with its 80% band over the twin's simulations
    low, high = decision.predicted["bands"]["ttft_p90_ms"]
    assert low <= decision.predicted["ttft_p90_ms"] <= high
    assert decision.predicted["saturation"]["draws"] > 1
    assert re.search(r"predicted p90 TTFT \S+ m?s → \S+ m?s \[\S+ m?s-\S+ m?s\]", decision.reason)


def test_slow_big_decode_batches_lower_max_num_seqs() -> None:
    """64 requests decode together; each decode adds 2 ms to a step, so a token takes 140 ms.
    Half the slots halve that, and the other half's wait stays within the TTFT target."""
    load = Load([TraceItem(0.0, 16, 50)] * 64, Cost(10.0, per_decode=2.0), max_num_seqs=64)
    pilot = Autopilot(settings(ttft_p90_ms=5000, tpot_p90_ms=100))
    decision = load.tick(pilot)
    assert decision is not None and decision.action == "change"
    assert decision.changes == {"max_num_seqs": [64, 32]}
    assert decision.reason.startswith("p90 TPOT 138 ms > 100 ms target")
    assert "(100% of p90 TPOT is decode steps)" in decision.reason
    assert "TTFT is" not in decision.reason  # only the missed target is explained


def test_moves_weigh_the_causes_hints_first_and_no_banned_one() -> None:
    """Prefill chunks riding in decode steps hint a smaller chunk, then a smaller budget; the
    other single steps follow, MAX_MOVES in all (each is a twin run). A shift that brings that
    cause weighs its two steps together as well, first, as one more candidate; not when one
    of them is banned or cannot move."""
    s = settings(ttft_p90_ms=500, tpot_p90_ms=50)
    chunk_down, budget_down = (("prefill_chunk_size", -1),), (("max_num_batched_tokens", -1),)
    got = moves(Knobs(), s, ["decode_tax"], set())
    assert len(got) == MAX_MOVES == 3
    assert got[:2] == [
        ({"prefill_chunk_size": 256}, chunk_down),
        ({"max_num_batched_tokens": 1024}, budget_down),
    ]
    assert got[2] == ({"max_num_seqs": 128}, (("max_num_seqs", 1),))
    unbanned = moves(Knobs(), s, ["decode_tax"], {chunk_down})
    assert [m for _, m in unbanned] == [
        budget_down,
        (("max_num_seqs", 1),),
        (("max_num_seqs", -1),),
    ]
    both = moves(Knobs(), s, ["decode_tax"], set(), together=["decode_tax"])
    assert both == [
        ({"prefill_chunk_size": 256, "max_num_batched_tokens": 1024}, chunk_down + budget_down),
        *got,
    ]
    assert moves(Knobs(), s, ["decode_tax"], {chunk_down}, together=["decode_tax"]) == unbanned
    assert moves(Knobs(), s, ["decode_tax"], {both[0][1]}, together=["decode_tax"]) == got
    bounded = settings(
        ttft_p90_ms=500,
        tpot_p90_ms=50,
        knobs={
            "prefill_chunk_size": {"lo": 512, "hi": 4096},
            "max_num_batched_tokens": {"lo": 64, "hi": 8192},
        },
    )
    alone = [m for _, m in moves(Knobs(), bounded, ["decode_tax"], set(), together=["decode_tax"])]
    assert alone == [budget_down, (("prefill_chunk_size", 1),), (("max_num_batched_tokens", 1),)]


def test_met_targets_hold() -> None:
    load = Load(steady(5, 2, 32, 8), Cost(5.0))
    pilot = Autopilot(settings(ttft_p90_ms=1000, tpot_p90_ms=100))
    assert load.tick(pilot) is None
    assert pilot.phase is Phase.HOLDING
    (measured,) = pilot.status()["history"]
    assert measured["requests"] == 10 and measured["attainment"] == 1.0


def test_knobs_that_leave_no_room_are_the_only_ones_simulated() -> None:
    """TTFT is missed, but the twin predicts every request attains with the knobs as they
    are: no candidate can gain the 0.05 a change needs, so neither the candidates nor the
    attribution are worked out. With goodput in the score, or a gain it could still reach,
    they are, after the knobs as they are."""
    misses = [record(95 + 0.4 * i, 600.0 if i % 2 else 100.0) for i in range(10)]
    asked: list[list[dict[str, Any]]] = []
    attributed: list[int] = []

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        asked.append(changes)
        return fixed(1.0, 1.0)(changes, window_s)

    def attribution() -> None:
        attributed.append(1)

    for other, candidates in (({}, False), ({"goodput_weight": 0.5}, True), ({"gain": 0.0}, True)):
        asked.clear()
        attributed.clear()
        pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, **other))
        assert pilot.tick(100.0, Knobs(), misses, attribution, twin) is None
        assert asked[0] == [{}]
        assert (len(asked) > 1 and len(asked[1]) == MAX_MOVES) is candidates
        assert bool(attributed) is candidates
        if not candidates:
            assert pilot.note == (
                "the twin predicts 100% attainment as the knobs are: no candidate can gain "
                "0.05 in score"
            )


def test_a_check_that_measures_targets_met_and_room_for_no_gain_skips_the_twin() -> None:
    """Every target met and 90% attaining leaves room for a gain, so the twin is asked; 100%
    attaining leaves none, unless goodput counts or the pilot still waits for its twin."""
    met = [record(95 + 0.4 * i, 100.0) for i in range(10)]
    some = [record(95 + 0.4 * i, 100.0 if i else 1200.0) for i in range(10)]
    asked: list[list[dict[str, Any]]] = []

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        asked.append(changes)
        return fixed(1.0, 1.0)(changes, window_s)

    s = settings(ttft_p90_ms=1000, tpot_p90_ms=500)
    for records, other, phase, asks in (
        (some, {}, Phase.HOLDING, True),
        (met, {}, Phase.HOLDING, False),
        (met, {"goodput_weight": 0.5}, Phase.HOLDING, True),
        (met, {}, Phase.WAITING, True),
    ):
        asked.clear()
        pilot = Autopilot(s.model_copy(update=other))
        pilot.phase = phase
        assert pilot.tick(100.0, Knobs(), records, no_attribution, twin) is None
        assert bool(asked) is asks
    pilot = Autopilot(s)
    pilot.phase = Phase.HOLDING
    pilot.tick(100.0, Knobs(), met, no_attribution, twin)
    assert pilot.note == (
        "targets met, 100% of 10 requests attaining: no candidate can gain 0.05 in score"
    )
    assert pilot.checks_without_change == 1 and pilot.last_check_t == 100.0


def no_attribution() -> None:
    return None


def fixed(attainment: float, better: float) -> Any:
    """An evaluate that predicts `attainment` for the current knobs and `better` for the rest."""

    def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        return [
            Trial(c, {"ttft_p90_ms": 100.0}, 1.0, attainment if not c else better) for c in changes
        ]

    return run


def record(arrival: float, ttft_ms: float) -> dict[str, Any]:
    return {
        "arrival": arrival,
        "finished_t": arrival + ttft_ms / 1000 + 0.1,
        "ttft_ms": ttft_ms,
        "e2e_ms": ttft_ms + 100.0,
        "output_len": 11,
    }


def test_a_queue_past_the_ttft_target_is_a_miss_before_its_requests_end() -> None:
    """Nothing ended lately; seven requests wait without a first token, five of them longer
    than the target: the pilot counts those five as misses at once and acts on them."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    waiting = [98.0, 98.5, 99.0, 99.2, 99.4, 99.7, 99.9]  # waits 2000 ... 100 ms at t=100
    asked_for: list[dict[str, Any]] = []

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        asked_for.extend(changes)
        return fixed(0.0, 0.9)(changes, window_s)

    assert pilot.tick(100.0, Knobs(), [], no_attribution, twin, waiting[:4]) is None
    assert pilot.note == MEASURED_TOO_FEW and not asked_for
    decision = pilot.tick(100.0, Knobs(), [], no_attribution, twin, waiting)
    assert asked_for and decision is not None and decision.action == "change"
    now = pilot.history[-1][1]
    assert (now.requests, now.attainment) == (5, 0.0)  # the two under 500 ms are not yet known
    assert now.ttft_p90_ms is not None and now.ttft_p90_ms > 1000
    assert decision.reason.startswith("p90 TTFT")


def counted(requests: int, current: int, better: int) -> Any:
    """An evaluate whose twin simulates `requests`, `current` of them attaining with the knobs
    as they are and `better` under every candidate."""

    def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        out = {"latencies_ms": [(100.0, 10.0)] * requests, "unfinished": 0}
        return [Trial(c, out, 1.0, (better if c else current) / requests) for c in changes]

    return run


def test_a_gain_of_one_simulated_request_is_within_the_twins_error() -> None:
    """One more of nine simulated requests attaining is a gain of 0.11, above `gain`, but
    whether one request makes its targets is within the twin's error; two more of eighteen,
    the same share, is a change."""
    misses = [record(95 + 0.4 * i, 600.0 if i % 2 else 100.0) for i in range(10)]
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    assert pilot.tick(100.0, Knobs(), misses, no_attribution, counted(9, 8, 9)) is None
    assert pilot.note == (
        "no candidate predicted to gain 0.22 in score (best +0.111); a gain must be worth 2 "
        "of the 9 requests simulated"
    )
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    decision = pilot.tick(100.0, Knobs(), misses, no_attribution, counted(18, 16, 18))
    assert decision is not None and decision.action == "change"


def test_a_gain_that_the_twins_error_could_undo_waits() -> None:
    """The twin predicts 40% -> 90% attainment for a change with its fit. With its steps one
    held-out error longer the change loses (40% -> 30%), or gains nothing either way: within
    its error, so the change waits. Neutral one way and a gain the other (40% -> 40% longer,
    90% shorter) is made, as is a gain that shrinks under the error (40% -> 42%): the need was
    cleared by the fit's prediction, and within its error the change does no harm."""
    misses = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    asked: list[float] = []

    def gives(longer: float, shorter: float = 0.9) -> Evaluate:
        def run(
            changes: list[dict[str, Any]], window_s: float, errors: float = 0.0, *_: Any
        ) -> list[Trial]:
            asked.append(errors)
            attained = {1.0: longer, -1.0: shorter}.get(errors, 0.9)
            return fixed(0.4, attained)(changes, window_s)

        return run

    def tick(evaluate: Evaluate) -> Decision | None:
        pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
        decision = pilot.tick(100.0, Knobs(), misses, no_attribution, evaluate)
        assert decision is not None or pilot.phase is Phase.HOLDING
        notes.append(pilot.note)
        return decision

    notes: list[str] = []
    assert tick(gives(0.3)) is None
    # the knobs as they are, the candidates, the runs under the twin's error
    assert asked == [0.0, 0.0, -1.0, 1.0]
    assert notes[-1].endswith(
        "is predicted to gain +0.500 in score, but -0.100 with the twin's steps one "
        "held-out error longer: within its error"
    )
    assert tick(gives(0.4, shorter=0.4)) is None
    assert notes[-1].endswith(
        "but +0.000 with the twin's steps one held-out error shorter: within its error"
    )
    for twin in (gives(0.4), gives(0.42)):
        decision = tick(twin)
        assert decision is not None and decision.action == "change"


def test_a_change_that_makes_attainment_worse_is_rolled_back_and_backed_off() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=4.0))
    knobs = Knobs(max_num_seqs=8)
    before = [record(95 + 0.4 * i, 600.0 if i % 2 else 100.0) for i in range(10)]
    decision = pilot.tick(100.0, knobs, before, no_attribution, fixed(0.5, 0.9))
    assert decision is not None and decision.action == "change"
    pilot.applied(decision, version=7)
    assert pilot.phase is Phase.ADJUSTING
    worse = before + [record(101 + 0.3 * i, 900.0) for i in range(10)]
    assert (
        pilot.tick(103.0, knobs, worse, no_attribution, fixed(0.5, 0.9)) is None
    )  # still observing
    moved = Knobs.model_validate({**knobs.model_dump(), **decision.knob_values()})
    undo = pilot.tick(106.0, moved, worse, no_attribution, fixed(0.5, 0.9))
    assert undo is not None and undo.action == "rollback"
    assert undo.changes == {k: [b, a] for k, (a, b) in decision.changes.items()}
    assert undo.reason.startswith(
        "rolled back: SLO attainment 0% of 10 requests after the change, 50% before"
    )
    assert pilot.phase is Phase.ROLLED_BACK
    pilot.applied(undo, version=8)
    # backed off: min_gap_s (4 s) after the rollback ten requests missed the TTFT target and
    # the twin offers a clear gain, yet no change comes until twice the gap has passed
    for t in (110.0, 113.5):
        assert pilot.tick(t, knobs, missed(t), no_attribution, fixed(0.5, 0.9)) is None
        assert pilot.phase is Phase.ROLLED_BACK  # held by the gap, before any check
    later = pilot.tick(114.0, knobs, missed(114), no_attribution, fixed(0.5, 0.9))
    assert later is not None and later.action == "change"
    assert later.changes != decision.changes  # the move rolled back is banned


def test_a_kept_change_after_a_rollback_halves_the_gap_again() -> None:
    """A rollback at 106 s doubles the 4 s gap; the change made at 114 s is kept when judged
    at 120 s, which halves it back: a gain the twin offers 6 s after that change is taken."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=4.0))
    moved = changed_at_100(pilot)
    worse = [record(101 + 0.3 * i, 900.0) for i in range(10)]
    undo = pilot.tick(106.0, moved, worse, no_attribution, fixed(0.5, 0.9))
    assert undo is not None and undo.action == "rollback" and pilot.change_backoff == 2.0
    pilot.applied(undo, version=8)
    knobs = Knobs(max_num_seqs=8)
    change = pilot.tick(114.0, knobs, missed(114), no_attribution, fixed(0.5, 0.9))
    assert change is not None and change.action == "change"
    pilot.applied(change, version=9)
    moved = Knobs.model_validate({**knobs.model_dump(), **change.knob_values()})
    # nothing attained before the change either (0% at 114 s): it is kept
    again = pilot.tick(120.0, moved, missed(120), no_attribution, fixed(0.5, 0.9))
    assert pilot.change_backoff == 1.0 and pilot.phase is not Phase.ROLLED_BACK
    assert again is not None and again.action == "change"


def changed_at_100(pilot: Autopilot) -> Knobs:
    """A change the twin predicts 50% -> 90% for, made at t=100 after ten requests of which
    half attained (arrived 95-98.6 s); the knobs it moved to."""
    knobs = Knobs(max_num_seqs=8)
    before = [record(95 + 0.4 * i, 600.0 if i % 2 else 100.0) for i in range(10)]
    decision = pilot.tick(100.0, knobs, before, no_attribution, fixed(0.5, 0.9))
    assert decision is not None and decision.action == "change"
    pilot.applied(decision, version=7)
    return Knobs.model_validate({**knobs.model_dump(), **decision.knob_values()})


def test_a_change_is_judged_on_arrivals_whose_outcome_is_known() -> None:
    """After the change, six requests ended late (arrived 102-104.5 s), and three still wait
    past the target; the one that arrived first (101 s) is still decoding, and so are others
    (in time, most likely). The ended and the waiting alone are 0% of nine: yet the requests
    after the change are not judged until the first of them is known, and it attained."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=4.0))
    moved = changed_at_100(pilot)
    late = [record(102 + 0.5 * i, 900.0) for i in range(6)]
    unstarted, started = [105.0, 105.1, 105.2], [101.0, 101.5, 103.2]
    for t in (106.0, 112.0):
        ticked = pilot.tick(t, moved, late, no_attribution, fixed(0.5, 0.9), unstarted, (), started)
        assert ticked is None
        assert (pilot.phase, pilot.note) == (
            Phase.ADJUSTING,
            "waiting for requests to judge the last change",
        )
    # the first ended in time, and so did the next two: 3 of 9 ended requests is within chance
    ended = [*late, record(101.0, 100.0), record(101.5, 100.0), record(103.2, 100.0)]
    assert pilot.tick(113.0, moved, ended, no_attribution, fixed(0.5, 0.9)) is None
    assert pilot.phase is not Phase.ROLLED_BACK and pilot.change_on_trial is None


@pytest.mark.parametrize(("attained", "rolled_back"), [(0, True), (1, False), (2, False)])
def test_a_fall_within_chance_of_a_few_requests_is_not_rolled_back(
    attained: int, rolled_back: bool
) -> None:
    """Before, half attained; after, `attained` of six: at 45% (the margin off 50%) none of
    six attains one time in 36 (0.55^6), one or fewer one time in six."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=4.0))
    moved = changed_at_100(pilot)
    after = [record(101 + 0.5 * i, 100.0 if i < attained else 900.0) for i in range(6)]
    judged = pilot.tick(106.0, moved, after, no_attribution, fixed(0.5, 0.9))
    assert (judged is not None and judged.action == "rollback") == rolled_back
    assert (pilot.phase is Phase.ROLLED_BACK) == rolled_back


def test_a_fall_the_twin_foresaw_without_the_change_is_not_rolled_back() -> None:
    """The twin predicted 10% attainment had the knobs stayed (a queue was building) and 90%
    with the change; 30% after it is worse than the 50% before, but not the change's doing."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=4.0))
    knobs = Knobs(max_num_seqs=8)
    before = [record(95 + 0.4 * i, 600.0 if i % 2 else 100.0) for i in range(10)]
    decision = pilot.tick(100.0, knobs, before, no_attribution, fixed(0.1, 0.9))
    assert decision is not None
    pilot.applied(decision, version=7)
    after = before + [record(101 + 0.3 * i, 900.0 if i % 10 > 2 else 100.0) for i in range(10)]
    moved = Knobs.model_validate({**knobs.model_dump(), **decision.knob_values()})
    judged = pilot.tick(106.0, moved, after, no_attribution, fixed(0.1, 0.9))
    assert judged is None or judged.action == "change"  # kept, and free to go on
    assert pilot.phase is not Phase.ROLLED_BACK and pilot.change_backoff == 1.0


def test_checks_that_find_nothing_space_out_until_a_target_is_newly_missed() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, look_s=5.0, min_gap_s=0.0))
    knobs = Knobs(max_num_seqs=8)
    checks: list[float] = []

    def ended(t: float, extra_ms: float = 0.0) -> list[dict[str, Any]]:
        """Ten requests that ended in the last 4 s, TTFT 900 ms, TPOT raised by `extra_ms`/10."""
        out = [record(t - 5 + 0.4 * i, 900.0) for i in range(10)]
        return [{**r, "e2e_ms": r["e2e_ms"] + extra_ms} for r in out]

    def nothing_better(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        if changes == [{}]:  # a check's first ask
            checks.append(t)
        return fixed(0.5, 0.5)(changes, window_s)

    for t in range(100, 160):
        assert pilot.tick(float(t), knobs, ended(t), no_attribution, nothing_better) is None
    assert checks == [100, 110, 130, 150]  # gaps 2x, then 4x look_s: no more
    # TPOT is missed too from now: a new miss is checked at once, at the first gap again
    for t in range(160, 171):
        pilot.tick(float(t), knobs, ended(t, 1000.0), no_attribution, nothing_better)
    assert checks[4:] == [160, 170]
    # TPOT met again: fewer misses are no reason to check sooner, the gaps go on growing
    for t in range(171, 196):
        pilot.tick(float(t), knobs, ended(t), no_attribution, nothing_better)
    assert checks[6:] == [190]
    # TPOT missed again: missed at a check since the gaps began growing, so no news (in a heavy
    # phase the two came and went in turn, and each return restarted the gaps)
    for t in range(196, 232):
        pilot.tick(float(t), knobs, ended(t, 1000.0), no_attribution, nothing_better)
    assert checks[7:] == [210, 230]


def test_checks_while_the_targets_hold_space_out_too() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, explore_s=10.0, min_gap_s=0.0))
    knobs = Knobs(max_num_seqs=8)
    checks: list[float] = []

    def nothing_better(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        checks.append(t)
        return fixed(1.0, 1.0)(changes, window_s)

    for t in range(100, 260):
        # every target met, but one request of ten missed: room for a gain, so the twin is asked
        met = [record(t - 5 + 0.4 * i, 100.0 if i else 1200.0) for i in range(10)]
        assert pilot.tick(float(t), knobs, met, no_attribution, nothing_better) is None
    assert checks == [100, 120, 160, 200, 240]  # gaps 2x, then 4x explore_s: no more


def missed(t: float) -> list[dict[str, Any]]:
    """Ten requests that ended in the 5 s before `t`, each with a TTFT of 900 ms."""
    return [record(t - 5 + 0.4 * i, 900.0) for i in range(10)]


def predicting(attainment: dict[int, float], current: int) -> Any:
    """An evaluate whose predicted attainment depends on max_num_seqs alone (now `current`)."""

    def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        seqs = [c.get("max_num_seqs", current) for c in changes]
        return [
            Trial(c, {"ttft_p90_ms": 100.0}, 1.0, attainment.get(n, 0.0))
            for c, n in zip(changes, seqs, strict=True)
        ]

    return run


def test_undoing_its_own_change_soon_needs_twice_the_gain() -> None:
    """max_num_seqs went 8 -> 16; half a minute later the twin predicts going back gains 0.07,
    over the 0.05 a change needs but under the 0.10 that undoing its own change needs. After
    REVERSE_S the same prediction is enough."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=0.0, look_s=1.0))
    up = pilot.tick(
        100.0, Knobs(max_num_seqs=8), missed(100), no_attribution, predicting({16: 0.5}, 8)
    )
    assert up is not None and up.changes == {"max_num_seqs": [8, 16]}
    pilot.applied(up, version=1)
    knobs = Knobs(max_num_seqs=16)
    met = [record(101 + 0.4 * i, 100.0) for i in range(10)]
    assert pilot.tick(106.0, knobs, met, no_attribution, predicting({}, 16)) is None  # kept
    assert pilot.change_on_trial is None and pilot.phase is not Phase.ROLLED_BACK
    back = predicting({8: 0.57, 16: 0.5}, 16)
    assert pilot.tick(130.0, knobs, missed(130), no_attribution, back) is None
    assert "undoing its own max_num_seqs change so soon needs 2x the gain" in pilot.note
    t = 101.0 + REVERSE_S
    undo = pilot.tick(t, knobs, missed(t), no_attribution, back)
    assert undo is not None and undo.changes == {"max_num_seqs": [16, 8]}


def scoring(predicted: dict[str, tuple[float, float]], current: tuple[float, float]) -> Any:
    """An evaluate predicting (attainment, goodput req/s) for each change by its values'
    text (`predicted`), `current` for the knobs as they are and (0, 0) for the rest."""

    def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        out = []
        for c in changes:
            attained, goodput = predicted.get(str(c), (0.0, 0.0)) if c else current
            out.append(Trial(c, {"ttft_p90_ms": 100.0}, goodput, attained))
        return out

    return run


def test_the_policy_is_weighed_only_when_allowed() -> None:
    """The twin predicts most for shortest_first: without allow_policy that flip is never
    offered and nothing else gains; with it the flip is among the candidates, and taken."""
    best = scoring({str({"policy": "shortest_first"}): (0.9, 0.0)}, (0.5, 0.0))
    knobs = Knobs(max_num_seqs=8)
    denied = settings(ttft_p90_ms=500, tpot_p90_ms=50)
    assert all("policy" not in c for c, _ in moves(knobs, denied, [], set()))
    assert Autopilot(denied).tick(100.0, knobs, missed(100), no_attribution, best) is None
    allowed = denied.model_copy(update={"allow_policy": True})
    assert ({"policy": "shortest_first"}, (("policy", 0),)) in moves(knobs, allowed, [], set())
    decision = Autopilot(allowed).tick(100.0, knobs, missed(100), no_attribution, best)
    assert decision is not None and decision.changes == {"policy": ["fcfs", "shortest_first"]}


def test_goodput_weight_can_change_which_candidate_scores_best() -> None:
    """More slots attain 90% at 4 req/s, fewer 80% at 8 req/s: attainment alone picks more
    slots; goodput weighed at 0.1 a req/s picks fewer."""
    twin = scoring(
        {str({"max_num_seqs": 16}): (0.9, 4.0), str({"max_num_seqs": 4}): (0.8, 8.0)}, (0.5, 4.0)
    )
    knobs = Knobs(max_num_seqs=8)
    picked = {}
    for weight in (0.0, 0.1):
        s = settings(ttft_p90_ms=500, tpot_p90_ms=50, goodput_weight=weight)
        decision = Autopilot(s).tick(100.0, knobs, missed(100), no_attribution, twin)
        assert decision is not None
        picked[weight] = decision.changes["max_num_seqs"][1]
    assert picked == {0.0: 16, 0.1: 4}


def test_with_goodput_in_the_score_full_attainment_leaves_room_to_gain() -> None:
    """Every request attains with the knobs as they are: by attainment nothing can gain, but
    twice the goodput can; no max_improvable_score holds the pilot back from checking it."""
    twin = scoring({str({"max_num_seqs": 16}): (1.0, 8.0)}, (1.0, 4.0))
    assert max_improvable_score(settings()) == 1.0 - settings().gain
    s = settings(ttft_p90_ms=500, tpot_p90_ms=50, goodput_weight=0.1)
    assert max_improvable_score(s) == math.inf
    knobs = Knobs(max_num_seqs=8)
    held = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    assert held.tick(100.0, knobs, missed(100), no_attribution, twin) is None
    assert held.note.startswith("the twin predicts 100% attainment as the knobs are")
    decision = Autopilot(s).tick(100.0, knobs, missed(100), no_attribution, twin)
    assert decision is not None and decision.changes == {"max_num_seqs": [8, 16]}


def test_when_nothing_attains_it_moves_only_to_drain_the_queue() -> None:
    """Every candidate is predicted at 0% attainment. One halves the p90 TTFT, which still
    misses: no change. One also leaves a shorter queue at the horizon: that one is taken."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=0.0, look_s=1.0))

    def hopeless(queue_at_end: dict[int, int]) -> Any:
        def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
            out = []
            for c in changes:
                n = c.get("max_num_seqs", 8)
                ttft = 4000.0 if n == 8 else 2000.0
                outcome = {"ttft_p90_ms": ttft, "queue_at_end": queue_at_end.get(n, 10)}
                out.append(Trial(c, {**outcome, "latencies_ms": [0] * 10}, 0.0, 0.0))
            return out

        return run

    knobs = Knobs(max_num_seqs=8)
    assert pilot.tick(100.0, knobs, missed(100), no_attribution, hopeless({})) is None
    assert pilot.note.startswith("the twin predicts no request meets both targets")
    drains = pilot.tick(110.0, knobs, missed(110), no_attribution, hopeless({16: 5}))
    assert drains is not None and drains.changes == {"max_num_seqs": [8, 16]}


def test_a_shift_in_the_arrivals_is_checked_at_once_on_the_new_load_alone() -> None:
    """Targets met, one change made at 100 s and being measured; at 104 s arrivals jump from 2
    to 10 a second. Before and after that change are no longer comparable, so it is not
    judged; the next check comes as soon as the gap between changes allows, not after
    explore_s, with the twin repeating only the arrivals since the shift, over a horizon
    that holds MIN_SIMULATED requests."""
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=6.0))
    knobs = Knobs(max_num_seqs=8)
    steady = [(80 + 0.5 * i, 100) for i in range(40)]  # 2 a second until 100 s
    burst = [(100 + 0.1 * i, 100) for i in range(41)]  # 10 a second from 100 s
    checks: list[tuple[float, float, float, int]] = []

    def twin(
        changes: list[dict[str, Any]], window_s: float, errors: float = 0.0, min_requests: int = 0
    ) -> list[Trial]:
        checks.append((t, window_s, errors, min_requests))
        return fixed(0.5, 0.9)(changes, window_s)

    met = [record(95 + 0.4 * i, 100.0) for i in range(10)]
    t = 100.0
    first = pilot.tick(t, knobs, met, no_attribution, twin, (), steady)
    assert first is not None and first.reason.startswith("targets met")
    pilot.applied(first, version=1)
    t = 104.0
    arrived = steady + [a for a in burst if a[0] <= t]
    assert pilot.tick(t, knobs, met, no_attribution, twin, (), arrived) is None
    assert pilot.change_on_trial is None and pilot.phase is not Phase.ROLLED_BACK  # not judged
    t = 106.0
    shifted = pilot.tick(t, knobs, met, no_attribution, twin, (), steady + burst)
    assert shifted is not None and shifted.action == "change"
    assert shifted.reason.startswith("load shifted: arrivals 1.9 → 8.6 req/s: max_num_seqs 8 → 16")
    # each change first checked with the twin's steps one held-out error shorter and longer
    assert checks == [(100.0, 20.0, e, 0) for e in (0, 0, -1, 1)] + [
        (106.0, 7.0, e, MIN_SIMULATED) for e in (0, 0, -1, 1)
    ]


def test_a_shift_to_long_prompts_weighs_a_smaller_chunk_first_once_the_twin_can() -> None:
    """From 100 s the prompts grow from 100 tokens to 1500; nothing has ended under them, so
    no attribution points anywhere. The shift itself hints at long chunks in decode steps: a
    smaller chunk is the first single step (the single steps of the other knobs alone leave it
    out), after the shift's two hinted steps together (chunk and budget down), which the twin
    here predicts less for. The twin cannot weigh the new load until its steps come in (here
    at its first two checks): the pilot asks again every look_s (ticking every 2 s: every
    6 s), and moves the chunk as soon as it can."""
    short = [(80 + 0.5 * i, 100) for i in range(40)]
    long = [(100 + 0.5 * i, 1500) for i in range(80)]
    refusals = 2
    asked: list[tuple[float, dict[str, Any]]] = []

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        asked.append((t, changes[0]))
        if len(asked) <= refusals:
            raise InvalidInput("not enough steps like this", "knobs")
        chunk = {"prefill_chunk_size": 256}
        return [Trial(c, {"tpot_p90_ms": 50.0}, 1.0, 0.9 if c == chunk else 0.5) for c in changes]

    pilot = Autopilot(settings(ttft_p90_ms=1000, tpot_p90_ms=60))
    decision, t = None, 100.0
    while decision is None and t <= 130:
        decision = pilot.tick(t, Knobs(), [], no_attribution, twin, (), short + long)
        assert decision is not None or pilot.phase is Phase.WAITING
        t += 2
    first = asked[0][0]
    assert [a for a, _ in asked] == [first, first + 6, *[first + 12] * 4]
    assert asked[3][1] == {"prefill_chunk_size": 256, "max_num_batched_tokens": 1024}
    assert decision is not None and decision.changes == {"prefill_chunk_size": [512, 256]}
    assert decision.reason.startswith("load shifted: mean prompt 100 → ")
    # a twin that never can: asked every look_s until arrivals_s (20 s) after the shift
    refusals, asked[:] = 1000, []
    pilot = Autopilot(settings(ttft_p90_ms=1000, tpot_p90_ms=60))
    for t in range(100, 160, 2):
        assert pilot.tick(t, Knobs(), [], no_attribution, twin, (), short + long) is None
    first = asked[0][0]
    assert [a for a, _ in asked] == [first + 6 * k for k in range(5)]


def test_a_shift_that_needs_two_steps_takes_them_in_one_change() -> None:
    """Prompts grow from 100 tokens to 1500 at 100 s, and the twin predicts most for a smaller
    chunk and a smaller budget together: the check the shift brings makes both in one change
    (one by one, the second would wait observe_s for the first to be judged). When the
    requests after it fare worse, one rollback undoes both, and that pair is not tried again
    for a while. Until then, undoing either knob soon counts as undoing its own change."""
    short = [(80 + 0.5 * i, 100) for i in range(40)]
    long = [(100 + 0.5 * i, 1500) for i in range(80)]
    both = {"prefill_chunk_size": 256, "max_num_batched_tokens": 1024}
    predicted = {frozenset(both.items()): 0.9, frozenset({("prefill_chunk_size", 256)}): 0.7}

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        return [
            Trial(c, {"tpot_p90_ms": 50.0}, 1.0, predicted.get(frozenset(c.items()), 0.5))
            for c in changes
        ]

    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=60))
    met = [record(99 + 0.4 * i, 100.0) for i in range(10)]
    decision = pilot.tick(104.0, Knobs(), met, no_attribution, twin, (), short + long)
    assert decision is not None and decision.reason.startswith("load shifted: mean prompt")
    assert decision.changes == {
        "prefill_chunk_size": [512, 256],
        "max_num_batched_tokens": [2048, 1024],
    }
    assert "max_num_batched_tokens 2048 → 1024, prefill_chunk_size 512 → 256" in decision.reason
    pilot.applied(decision, version=1)
    up = {"prefill_chunk_size": 1, "max_num_batched_tokens": 1}  # either undoes a knob it moved
    assert all(pilot._reversed_knob(((knob, d),), 110.0) == knob for knob, d in up.items())
    worse = met + [record(104 + 0.3 * i, 900.0) for i in range(10)]
    moved = Knobs(prefill_chunk_size=256, max_num_batched_tokens=1024)
    undo = pilot.tick(110.0, moved, worse, no_attribution, twin, (), short + long)
    assert undo is not None and undo.action == "rollback"
    assert undo.changes == {
        "prefill_chunk_size": [256, 512],
        "max_num_batched_tokens": [1024, 2048],
    }
    assert set(pilot.banned_until) == {(("prefill_chunk_size", -1), ("max_num_batched_tokens", -1))}


def test_longer_prompts_after_a_shift_seen_on_the_rate_are_checked_when_they_come() -> None:
    """Eight short prompts a second until 100 s, then none until long ones, one a second, from
    104.5 s: at 104 s the rate has fallen and no long prompt has come yet. That check has
    nothing that hints at a smaller chunk and leaves it out; the long prompts that follow are
    news of the same shift, checked as soon as two have come, and a smaller chunk is
    weighed first among the single steps."""
    short = [(60 + i / 8, 100 + 10 * (i % 5)) for i in range(320)]
    long = [(104.5 + i, 1500) for i in range(20)]
    asked: list[tuple[float, list[dict[str, Any]]]] = []
    chunk = {"prefill_chunk_size": 256}

    def twin(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        if changes != [{}]:  # the candidates, or the runs under its error
            asked.append((t, [c for c in changes if c]))
        return [Trial(c, {"tpot_p90_ms": 50.0}, 1.0, 0.9 if c == chunk else 0.5) for c in changes]

    pilot = Autopilot(settings(ttft_p90_ms=1000, tpot_p90_ms=60))
    decisions = {}
    for t in range(90, 112, 2):
        arrived = [a for a in short + long if a[0] <= t]
        decision = pilot.tick(float(t), Knobs(), [], no_attribution, twin, (), arrived)
        if decision is not None:
            decisions[t] = decision
    assert [a for a, _ in asked] == [104, 106, 106, 106]
    assert chunk not in asked[0][1] and asked[1][1][1] == chunk
    assert list(decisions) == [106] and decisions[106].changes == {"prefill_chunk_size": [512, 256]}
    assert decisions[106].reason.startswith(
        "load shifted: arrivals 8.0 → 1.6 req/s, then mean prompt 120 → 1500 tokens"
    )
    assert pilot.arrivals_window(106.0) == 7.0  # still the arrivals since the shift


def test_the_phases_are_the_states_the_api_shows() -> None:
    """GET /api/autopilot's `state` is the phase's value: the dashboard shows these words."""
    assert [p.value for p in Phase] == [
        "off",
        "waiting",
        "holding",
        "adjusting",
        "rolled back",
        "paused",
    ]
    state = Autopilot(settings()).status()["state"]
    assert type(state) is str and state == "waiting"


def test_a_persons_change_pauses_it_and_it_resumes_after() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, pause_s=30.0))
    knobs = Knobs(max_num_seqs=8)
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    pilot.person_changed(95.0, "dashboard")
    assert pilot.phase is Phase.PAUSED and "dashboard" in pilot.note
    assert pilot.tick(100.0, knobs, recent, no_attribution, fixed(0.0, 0.9)) is None
    assert pilot.status()["paused_until"] == 125.0
    decision = pilot.tick(126.0, knobs, [record(120, 900.0)] * 10, no_attribution, fixed(0.0, 0.9))
    assert decision is not None and decision.action == "change"


def test_a_refused_change_is_recorded_and_it_keeps_going() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=0.0, look_s=1.0))
    knobs = Knobs(max_num_seqs=8)
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    decision = pilot.tick(100.0, knobs, recent, no_attribution, fixed(0.0, 0.9))
    assert decision is not None
    pilot.refused(decision, "kv_capacity_blocks below a live request's need")
    assert pilot.status()["last_decision"]["refused"].startswith("kv_capacity_blocks")
    assert pilot.phase is Phase.HOLDING and pilot.change_on_trial is None
    assert pilot.tick(101.0, knobs, recent, no_attribution, fixed(0.0, 0.9)) is not None


def test_a_persons_change_while_the_engine_applies_ours_keeps_the_pause_shown() -> None:
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    for outcome in ("applied", "refused"):
        pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50, min_gap_s=0.0))
        decision = pilot.tick(100.0, Knobs(max_num_seqs=8), recent, no_attribution, fixed(0.0, 0.9))
        assert decision is not None
        pilot.person_changed(100.5, "dashboard")
        if outcome == "applied":
            pilot.applied(decision, 3)
        else:
            pilot.refused(decision, "refused")
        status = pilot.status()
        assert status["state"] == "paused" and status["paused_until"] == 160.5, outcome
        assert "dashboard" in status["note"]
        assert status["last_decision"]["changes"] == decision.changes


def test_settings_or_a_persons_change_while_the_twin_runs_stand() -> None:
    """The server lets go of the pilot while the twin runs; what came meanwhile is not
    overwritten by the check's outcome, and the check applies nothing."""
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))

    def switched_off(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        pilot.configure(AutopilotSettings())
        return fixed(0.0, 0.9)(changes, window_s)

    assert pilot.tick(100.0, Knobs(max_num_seqs=8), recent, no_attribution, switched_off) is None
    assert pilot.phase is Phase.OFF and pilot.change_on_trial is None

    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))

    def person(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        pilot.person_changed(100.0, "dashboard")
        return fixed(0.9, 0.9)(changes, window_s)  # nothing to gain: the check would say "holding"

    assert pilot.tick(100.0, Knobs(max_num_seqs=8), recent, no_attribution, person) is None
    assert pilot.phase is Phase.PAUSED and pilot.change_on_trial is None


def test_too_few_steps_for_the_twin_waits_and_says_so() -> None:
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]

    def unfit(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        raise InvalidInput("the live engine has seen too few steps: 12 of 40", "source")

    assert pilot.tick(100.0, Knobs(), recent, no_attribution, unfit) is None
    assert pilot.phase is Phase.WAITING and "too few steps" in pilot.note


def test_a_disabled_autopilot_does_nothing() -> None:
    pilot = Autopilot(AutopilotSettings())
    assert pilot.phase is Phase.OFF and pilot.status()["state"] == "off"
    recent = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    assert pilot.tick(100.0, Knobs(), recent, no_attribution, fixed(0.0, 1.0)) is None


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"ttft_p90_ms": 0}, "ttft_p90_ms"),
        ({"tpot_p90_ms": -5}, "tpot_p90_ms"),
        ({"knobs": {"kv_watermark": {"lo": 0, "hi": 1}}}, "knobs.kv_watermark"),
        ({"knobs": {"max_num_seqs": {"lo": 0, "hi": 8}}}, "knobs.max_num_seqs"),
        ({"knobs": {"max_num_seqs": {"lo": 9, "hi": 8}}}, "lo (9) must not exceed hi (8)"),
    ],
)
def test_bad_settings_name_the_field(values: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError, match=where.replace("(", r"\(").replace(")", r"\)")):
        AutopilotSettings.model_validate(values)


def test_serve_flag_targets_parse() -> None:
    got = parse_targets("ttft_p90_ms=800, tpot_p90_ms=60")
    assert (got.enabled, got.ttft_p90_ms, got.tpot_p90_ms) == (True, 800.0, 60.0)
    with pytest.raises(ValueError, match="ttft_p90_ms: 'fast' is not a number"):
        parse_targets("ttft_p90_ms=fast")
    with pytest.raises(ValueError, match="ttft_p90_ms"):
        parse_targets("ttft_p90_ms=-1")


def near_capacity(current: float, candidates: float) -> Any:
    """An evaluate predicting 40% attainment as the knobs are and 90% under every candidate,
    the queue building in a `current` and `candidates` share of the simulations."""

    def run(changes: list[dict[str, Any]], window_s: float, *_: Any) -> list[Trial]:
        out = []
        for c in changes:
            share = candidates if c else current
            builds = round(10 * share)
            text = f"within the noise of saturation: the queue builds in {builds} of 10 simulations"
            outcome = {"ttft_p90_ms": 100.0, "saturation": {"share": share, "text": text}}
            out.append(Trial(c, outcome, 1.0, 0.9 if c else 0.4))
        return out

    return run


def test_a_candidate_within_the_noise_of_saturation_is_skipped_as_risky() -> None:
    """Every candidate would gain 50 points, but its queue builds in 4 of 10 simulations where
    the knobs as they are never build one: no change, and the note says why. A candidate that
    builds one less often than the knobs as they are is a rescue, and is made."""
    misses = [record(95 + 0.4 * i, 900.0) for i in range(10)]
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    assert pilot.tick(100.0, Knobs(), misses, no_attribution, near_capacity(0.0, 0.4)) is None
    assert pilot.phase == Phase.HOLDING
    assert "risky: within the noise of saturation: the queue builds in 4 of 10" in pilot.note
    pilot = Autopilot(settings(ttft_p90_ms=500, tpot_p90_ms=50))
    decision = pilot.tick(100.0, Knobs(), misses, no_attribution, near_capacity(1.0, 0.4))
    assert decision is not None and decision.action == "change"
