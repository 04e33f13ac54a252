"""The MoE transformer, its loaders (Hugging Face checkpoints, synthetic presets) and tokenizers."""

from engine.model.loader import load_model
from engine.model.transformer import MoETransformer

__all__ = ["MoETransformer", "load_model"]
