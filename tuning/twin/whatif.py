"""What if: a recorded session's trace run again in simulation, under its own knobs and under
candidate ones, with the cost model fitted from its own steps."""

from dataclasses import dataclass
from typing import Any

from engine.config import CacheConfig
from engine.ep.placement import Placement
from engine.errors import InvalidInput
from engine.knobs import Knobs, validate_knobs
from tuning.twin.cost_model import CostModel, fit
from tuning.twin.experts import ExpertDraw, routing
from tuning.twin.outcome import StepTotals, outcome
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

    def run(
        self, knobs: Knobs, horizon_s: float | None = None, keep_steps: bool = False
    ) -> SimResult:
        self.experts.restart()  # runs then differ by their knobs, not by the draw
        return simulate(
            self.trace, knobs, self.setup, self.model, self.experts, horizon_s, keep_steps
        )

    def candidate(self, changes: dict[str, Any]) -> Knobs:
        """The session's knobs with `changes`, validated as the engine validates them."""
        return validate_knobs({**self.knobs.model_dump(), **changes}, self.context)

    def predict(self, changes: dict[str, Any], horizon_s: float | None = None) -> dict[str, Any]:
        """The outcome under the twin's knobs with `changes`; InvalidInput for bad knobs or a
        candidate far beyond the recorded steps."""
        knobs = self.candidate(changes)
        result = self.run(knobs, horizon_s)
        refuse_outside(result)
        return {"knobs": knobs.model_dump(), **sim_outcome(result)}

    def compare(self, changes: dict[str, Any], horizon_s: float | None = None) -> dict[str, Any]:
        """Current and candidate knobs side by side, with the fit error; InvalidInput for
        bad knobs or a candidate far beyond the recorded steps."""
        candidate = self.predict(changes, horizon_s)
        current = self.run(self.knobs, horizon_s)
        return {
            "current": {"knobs": self.knobs.model_dump(), **sim_outcome(current)},
            "candidate": candidate,
            "fit": {"mape": round(self.model.mape, 4), "steps": self.model.num_steps},
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
    placement = Placement.contiguous(model_cfg["num_layers"], model_cfg["num_experts"], ep)
    row_bytes = model_cfg["hidden_size"] * ELEMENT_BYTES.get(engine_cfg["dtype"], 4)
    setup = Setup(cache, engine_cfg["batching"], placement, row_bytes, model_cfg["max_model_len"])
    context = {
        "total_blocks": cache.num_blocks,
        "min_blocks": 1,
        "max_model_len": model_cfg["max_model_len"],
        "ep_size": ep,
        "num_experts": model_cfg["num_experts"],
    }
    return setup, context


def twin_from_recording(
    session: dict[str, Any], steps: list[dict[str, Any]], records: list[dict[str, Any]]
) -> Twin:
    """The twin of a recorded session (as `storage.queries` returns it: its `config` and
    `knobs`, its StepTelemetry dicts and its request records)."""
    if not records:
        raise InvalidInput("the session recorded no requests to replay", "source")
    setup, context = engine_setup(session["config"])
    trace = trace_of(records)
    # a KV capacity below a request's need would leave it queued forever in the simulation
    context["min_blocks"] = blocks_needed(trace, setup.cache.block_size, setup.max_model_len)
    knobs = validate_knobs(session["knobs"], context)
    model = fit(steps, session["knobs"])
    return Twin(setup, knobs, trace, model, ExpertDraw(routing(steps)), context)
