"""What if: a recorded session's trace run again in simulation, under its own knobs and under
candidate ones, with the cost model fitted from its own steps (or those of several sessions of
the same engine), each answer a median and a band over several simulations
(tuning.twin.bands)."""

from dataclasses import dataclass
from typing import Any

from engine.config import CacheConfig
from engine.ep.placement import Placement
from engine.errors import InvalidInput
from engine.knobs import Knobs, validate_knobs
from tuning.twin.bands import DRAWS, Draw, banded, builds, draws, restart
from tuning.twin.cost_model import CostModel, fit_pooled
from tuning.twin.experts import ExpertDraw, routing
from tuning.twin.outcome import METRICS, StepTotals, outcome
from tuning.twin.simulator import Setup, SimResult, simulate
from tuning.twin.trace import TraceItem, blocks_needed, trace_of

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OUTSIDE_SHARE = 0.10  # refuse when more simulated steps than this lie beyond the fit
PREFIX_NOTE = (
    "requests share no prefix (as reruns send them); a request preempted by recompute finds "
    "its own cached blocks again, as in the engine"
)


@dataclass
class Twin:
    """A session's twin: its engine setup, knobs, trace, cost model and expert routing."""

    setup: Setup
    knobs: Knobs
    trace: list[TraceItem]
    model: CostModel
    experts: ExpertDraw
    context: dict[str, Any]  # what knob ranges depend on (validate_knobs)
    sessions: int = 1  # recorded sessions pooled in its cost model
    num_draws: int = DRAWS

    def run(
        self,
        knobs: Knobs,
        horizon_s: float | None = None,
        keep_steps: bool = False,
        draw: Draw | None = None,
    ) -> SimResult:
        """One simulation: the nominal one, or `draw`'s."""
        restart(self.experts, None if draw is None else draw.seed)
        trace, model = (self.trace, self.model) if draw is None else (draw.trace, draw.model)
        return simulate(trace, knobs, self.setup, model, self.experts, horizon_s, keep_steps)

    def _runs(self, knobs: Knobs, horizon_s: float | None) -> list[tuple[SimResult, Draw]]:
        """A simulation per draw (the same draws for every knob set of this twin); InvalidInput
        when the nominal one lies far beyond the fit."""
        nominal, *drawn = draws(self.model, self.trace, self.num_draws)
        first = self.run(knobs, horizon_s, draw=nominal)
        refuse_outside(first)  # before the other draws are paid for
        return [(first, nominal), *((self.run(knobs, horizon_s, draw=d), d) for d in drawn)]

    def outcomes(
        self, knobs: Knobs, horizon_s: float | None = None
    ) -> tuple[list[dict[str, Any]], list[bool]]:
        """Each draw's outcome (`sim_outcome`, the nominal one first) and whether its queue
        built; InvalidInput for a knob set far beyond the recorded steps."""
        runs = self._runs(knobs, horizon_s)
        return [sim_outcome(r) for r, _ in runs], [builds(r, d.trace) for r, d in runs]

    def answer(self, knobs: Knobs, horizon_s: float | None = None) -> dict[str, Any]:
        """One side of a what-if: METRICS and `unfinished` as medians over the draws with
        their bands, and the saturation."""
        outcomes, built = self.outcomes(knobs, horizon_s)
        side = banded(outcomes, built, (*METRICS, "unfinished"))
        return {"knobs": knobs.model_dump(), **side}

    def candidate(self, changes: dict[str, Any]) -> Knobs:
        """The session's knobs with `changes`, validated as the engine validates them."""
        return validate_knobs({**self.knobs.model_dump(), **changes}, self.context)

    def predict(self, changes: dict[str, Any], horizon_s: float | None = None) -> dict[str, Any]:
        """The banded outcome under the twin's knobs with `changes` (`answer`); InvalidInput
        for bad knobs or a candidate far beyond the recorded steps."""
        return self.answer(self.candidate(changes), horizon_s)

    def compare(self, changes: dict[str, Any], horizon_s: float | None = None) -> dict[str, Any]:
        """Current and candidate knobs side by side, each banded, with the fit and its
        residuals; InvalidInput for bad knobs or a candidate far beyond the recorded steps."""
        candidate = self.predict(changes, horizon_s)
        current = self.answer(self.knobs, horizon_s)
        return {
            "current": current,
            "candidate": candidate,
            "fit": {
                "mape": round(self.model.mape, 4),
                "steps": self.model.num_steps,
                "sessions": self.sessions,
                "residuals": self.model.residuals.describe(),
            },
            "draws": self.num_draws,
            "requests": len(self.trace),
            "prefix_cache": PREFIX_NOTE,
        }


def sim_outcome(result: SimResult) -> dict[str, Any]:
    totals = StepTotals(
        result.peak_kv_blocks,
        result.preemptions,
        result.queue_at_end,
        result.routed_pairs,
        result.dropped_pairs,
    )
    records = [r.model_dump() for r in result.records]
    cut = [list(c) for c in result.cut]
    return {**outcome(records, totals), "unfinished": result.unfinished, "cut_ms": cut}


def refuse_outside(result: SimResult) -> None:
    """InvalidInput (`knobs`) when too many simulated steps lie beyond the fitted ones."""
    if result.num_steps and result.outside_steps > OUTSIDE_SHARE * result.num_steps:
        worst = max(result.outside, key=result.outside.get)  # type: ignore[arg-type]
        raise InvalidInput(
            f"not enough steps like this: {result.outside_steps} of {result.num_steps} "
            f"simulated steps lie far beyond the recorded ones (most often in {worst}); "
            "record a session that runs such batches first (`moescope serve --fit-from "
            "SESSION` fits the live twin on its steps from the start)",
            "knobs",
        )


def engine_setup(config: dict[str, Any]) -> tuple[Setup, dict[str, Any]]:
    """The simulated engine and the knob validation context (`validate_knobs`) of an engine
    description: `config` as a session row and /api/status hold it (`model_config`,
    `engine_config`). The context's `min_blocks` is 1 until the caller knows its requests."""
    model_cfg, engine_cfg = config["model_config"], config["engine_config"]
    cache = CacheConfig(**engine_cfg["cache"])
    ep = engine_cfg["parallel"]["ep_size"]
    moe_layers = model_cfg["num_layers"] - model_cfg.get("first_k_dense_replace", 0)
    placement = Placement.contiguous(moe_layers, model_cfg["num_experts"], ep)
    row_bytes = model_cfg["hidden_size"] * ELEMENT_BYTES.get(engine_cfg["dtype"], 4)
    setup = Setup(
        cache,
        engine_cfg["batching"],
        placement,
        row_bytes,
        model_cfg["max_model_len"],
        model_cfg.get("sliding_window", 0),
    )
    context = {
        "total_blocks": cache.num_blocks,
        "min_blocks": 1,
        "max_model_len": model_cfg["max_model_len"],
        "ep_size": ep,
        "num_experts": model_cfg["num_experts"],
    }
    return setup, context


Recording = tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]


def twin_from_recording(
    session: dict[str, Any], steps: list[dict[str, Any]], records: list[dict[str, Any]]
) -> Twin:
    """The twin of a recorded session (as `storage.queries` returns it: its `config` and
    `knobs`, its StepTelemetry dicts and its request records)."""
    return twin_from_recordings([(session, steps, records)])


def twin_from_recordings(recordings: list[Recording]) -> Twin:
    """The twin of the first recording's trace and knobs, its cost model fitted on the steps of
    all of them and its expert loads drawn from all of them; InvalidInput (`source`) when
    they ran different engines (`model_config`, `engine_config`)."""
    first, steps, records = recordings[0]
    if not records:
        raise InvalidInput("the session recorded no requests to replay", "source")
    engine = ("model_config", "engine_config")
    for other, _, _ in recordings[1:]:
        if any(other["config"].get(k) != first["config"].get(k) for k in engine):
            raise InvalidInput(
                f"sessions {first.get('id')!r} and {other.get('id')!r} ran different engines "
                "(model_config, engine_config): their steps cost otherwise",
                "source",
            )
    setup, context = engine_setup(first["config"])
    trace = trace_of(records)
    # a KV capacity below a request's need would leave it queued forever in the simulation
    context["min_blocks"] = blocks_needed(trace, setup.cache.block_size, setup.max_model_len)
    knobs = validate_knobs(first["knobs"], context)
    model = fit_pooled([(s, info["knobs"]) for info, s, _ in recordings])
    loads = ExpertDraw(routing([step for _, s, _ in recordings for step in s]))
    return Twin(setup, knobs, trace, model, loads, context, len(recordings))
