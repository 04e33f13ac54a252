"""moescope engine: continuous batching over a paged KV cache for MoE models."""

from engine.config import CacheConfig, EngineConfig, Knobs, ModelConfig, engine_config
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.outputs import RequestDelta, RequestOutput, StepResult
from engine.sampling_params import SamplingParams
from engine.telemetry import StepTelemetry

__all__ = [
    "LLM",
    "CacheConfig",
    "EngineConfig",
    "Knobs",
    "LLMEngine",
    "ModelConfig",
    "RequestDelta",
    "RequestOutput",
    "SamplingParams",
    "StepResult",
    "StepTelemetry",
    "engine_config",
]
