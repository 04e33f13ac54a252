"""Configs fixed at start: model, cache, parallel and engine (the live knobs are in knobs.py)."""

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engine.knobs import Knobs
from engine.threads import Threads

Family = Literal["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
QKNorm = Literal["none", "head", "full"]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Mixtral-shaped MoE transformer (every supported family maps onto it)."""

    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    moe_intermediate_size: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    qkv_bias: bool = False
    o_proj_bias: bool = False
    qk_norm: QKNorm = "none"
    clip_qkv: float | None = None
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_model_len: int = 2048
    tie_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    router_skew: float = 0.0


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing: `num_blocks` on the device, `num_host_blocks` for swap."""

    block_size: int = 16
    num_blocks: int = 1024
    num_host_blocks: int = 512
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class ParallelConfig:
    """Expert parallel: `ep_size` ranks; `distributed` starts them as processes (gloo/NCCL)
    and measures the all-to-all, otherwise one process models it."""

    ep_size: int = 1
    distributed: bool = False
    timeout_s: float = 300.0  # a collective that waits longer fails the step


Batching = Literal["continuous", "static"]


@dataclass(frozen=True)
class EngineConfig:
    """Everything fixed when an engine starts."""

    model: str = "synthetic:tiny"
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    seed: int = 0
    batching: Batching = "continuous"
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    knobs: Knobs = field(default_factory=Knobs)
    router_skew: float | None = None
    threads: Threads = None  # the engine thread's torch threads (engine.threads)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHE_ARGS = {
    "block_size": "block_size",
    "num_kv_blocks": "num_blocks",
    "num_host_blocks": "num_host_blocks",
    "enable_prefix_caching": "enable_prefix_caching",
}


def engine_config(model: str = "synthetic:tiny", **kwargs: Any) -> EngineConfig:
    """Build an EngineConfig from flat engine arguments (vLLM style), refusing unknown ones."""
    knob_args = {k: kwargs.pop(k) for k in list(kwargs) if k in Knobs.model_fields}
    if "max_num_batched_tokens" in knob_args and "prefill_chunk_size" not in knob_args:
        default_chunk = Knobs.model_fields["prefill_chunk_size"].default
        knob_args["prefill_chunk_size"] = min(default_chunk, knob_args["max_num_batched_tokens"])
    cache_args = {CACHE_ARGS[k]: kwargs.pop(k) for k in list(kwargs) if k in CACHE_ARGS}
    parallel = ParallelConfig(
        ep_size=kwargs.pop("ep_size", 1), distributed=kwargs.pop("ep_distributed", False)
    )
    dtype = kwargs.pop("dtype", torch.float32)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        dtype = DTYPES[dtype]
    allowed = {"device", "seed", "batching", "router_skew", "threads"}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ValueError(f"unknown engine argument(s) {unknown}")
    skew = kwargs.get("router_skew")
    if skew is not None and not math.isfinite(skew):
        raise ValueError(f"router_skew must be a finite number, got {skew}")
    batching = kwargs.get("batching", "continuous")
    if batching not in ("continuous", "static"):
        raise ValueError(f"batching {batching!r} must be 'continuous' or 'static'")
    threads = kwargs.get("threads")
    if not (threads is None or threads == "auto" or (type(threads) is int and threads >= 1)):
        raise ValueError(f"threads must be a positive integer or 'auto', got {threads!r}")
    cache = CacheConfig(**cache_args)
    if cache.block_size < 1 or cache.num_blocks < 1 or cache.num_host_blocks < 0:
        raise ValueError("block_size and num_kv_blocks must be positive, num_host_blocks >= 0")
    return EngineConfig(
        model=model, dtype=dtype, cache=cache, parallel=parallel, knobs=Knobs(**knob_args), **kwargs
    )
