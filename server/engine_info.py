"""What the server says about its engine: the model and engine configs, as recorded with a
session and shown by /api/status (the twin compares them to tell sessions apart)."""

from dataclasses import asdict
from typing import Any

from engine.loop import EngineLoop


def engine_description(engine_loop: EngineLoop) -> dict[str, Any]:
    """The model and engine configs as JSON-ready dicts."""
    cfg = engine_loop.engine.config
    model = engine_loop.engine.model_config
    per_layer = model.kv_elements_per_token * cfg.dtype.itemsize
    return {
        "model_config": asdict(model),
        # what one token costs in the KV cache: MLA's latent against GQA's K and V
        "kv_bytes_per_token": {
            "per_layer": per_layer,
            "all_layers": per_layer * model.num_layers,
            "layout": "latent" if model.kv_lora_rank else "kv",
        },
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
