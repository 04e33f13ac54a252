"""The live twin's cost model seeded from a recorded session of the same engine (`--fit-from`),
so that from the start it predicts the step shapes that session ran (long prompts, full
batches) instead of refusing them until this run has shown each: after a shift to long
prompts the autopilot otherwise waits for the new steps to be fitted."""

import json
from dataclasses import MISSING, fields
from typing import Any

from engine.config import ModelConfig
from engine.errors import InvalidInput
from engine.loop import EngineLoop
from server.engine_info import engine_description
from server.live_window import LiveWindow
from storage import Store
from storage import queries as q
from tuning.twin.fit_rows import FitRows

# what a step's cost depends on besides its batch: the model, and these engine settings
ENGINE_FIELDS = ("dtype", "device", "batching")
PARALLEL_FIELDS = ("ep_size", "distributed")


def differences(recorded: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """How the engine description `recorded` (a session's config) differs from `live`'s in what
    a step's cost depends on, one "field recorded (here live)" each."""
    live = json.loads(json.dumps(live))  # as stored: tuples are lists
    rec_model, rec_engine = recorded["model_config"], recorded["engine_config"]
    model, engine = live["model_config"], live["engine_config"]
    # a field the recording predates held its default then (as stored: tuples are lists)
    defaults = json.loads(
        json.dumps({f.name: f.default for f in fields(ModelConfig) if f.default is not MISSING})
    )
    pairs = [(f"model_config.{k}", rec_model.get(k, defaults.get(k)), v) for k, v in model.items()]
    pairs += [(f"engine_config.{k}", rec_engine.get(k), engine[k]) for k in ENGINE_FIELDS]
    pairs += [
        (f"engine_config.parallel.{k}", rec_engine["parallel"].get(k), engine["parallel"][k])
        for k in PARALLEL_FIELDS
    ]
    return [f"{name} {old!r} (here {new!r})" for name, old, new in pairs if old != new]


def recorded_rows(store: Store, session_id: str, engine_loop: EngineLoop) -> FitRows:
    """The cost-model rows of session `session_id`'s steps, read a page at a time.

    Raises SessionNotFound, or InvalidInput (`fit_from`) when the session ran another engine
    or no busy steps."""
    session = q.get_session(store, session_id)
    differ = differences(session["config"], engine_description(engine_loop))
    if differ:
        raise InvalidInput(
            f"session {session_id!r} ran another engine, whose steps cost otherwise: "
            + "; ".join(differ),
            "fit_from",
        )
    rows = FitRows(session["knobs"])
    for step in q.iter_steps(store, session_id):
        rows.add(step)
    if not rows.recent:
        raise InvalidInput(f"session {session_id!r} ran no busy steps to fit from", "fit_from")
    return rows


def seed(
    window: LiveWindow, store: Store | None, session_id: str, engine_loop: EngineLoop
) -> dict[str, Any]:
    """Seed the live twin's cost model from a recorded session (`recorded_rows`); what it took."""
    if store is None:
        raise InvalidInput("--fit-from reads a recorded session: it needs --db", "fit_from")
    rows = recorded_rows(store, session_id, engine_loop).rows()
    window.fit_rows.seed(rows)
    return {"session": session_id, "rows": len(rows)}
