"""What the server says about its engine: the model and engine configs, as recorded with a
session and shown by /api/status (the twin compares them to tell sessions apart)."""

from dataclasses import asdict
from typing import Any

from engine.loop import EngineLoop


def engine_description(engine_loop: EngineLoop) -> dict[str, Any]:
    """The model and engine configs as JSON-ready dicts."""
    cfg = engine_loop.engine.config
    return {
        "model_config": asdict(engine_loop.engine.model_config),
        "engine_config": {
            "model": cfg.model,
            "dtype": str(cfg.dtype).removeprefix("torch."),
            "device": cfg.device,
            "seed": cfg.seed,
            "batching": cfg.batching,
            "cache": asdict(cfg.cache),
            "parallel": asdict(cfg.parallel),
        },
    }
