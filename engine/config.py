"""Configs fixed at start: model, cache, parallel and engine (the live knobs are in knobs.py)."""

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engine.knobs import Knobs
from engine.threads import Threads

Family = Literal[
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2", "deepseek_v3"
]
QKNorm = Literal["none", "head", "full"]
TopkMethod = Literal["greedy", "group_limited_greedy", "noaux_tc"]


@dataclass(frozen=True)
class RopeScaling:
    """A checkpoint's rope scaling (`rope_scaling` / `rope_parameters`), as transformers reads
    it: `linear` and `llama3` change the frequencies; `yarn` also scales cos/sin and, with
    `mscale_all_dim`, the softmax (DeepSeek)."""

    rope_type: Literal["linear", "llama3", "yarn"]
    factor: float
    original_max_position_embeddings: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float = 0.0  # yarn; 0 = unset
    mscale_all_dim: float = 0.0  # yarn; 0 = unset
    attention_factor: float | None = None  # yarn
    truncate: bool = True  # yarn


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
    rope_scaling: RopeScaling | None = None
    # DeepSeek-V2/V3: multi-head latent attention (kv_lora_rank > 0), routing, dense layers
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    topk_method: TopkMethod = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_expert_gated: bool = True  # Qwen2-MoE's sigmoid gate; DeepSeek's are always added
    first_k_dense_replace: int = 0  # the first k layers have a dense MLP, not experts
    dense_intermediate_size: int = 0
    # gpt-oss
    attention_sinks: bool = False  # a learned per-head logit in each softmax's denominator
    sliding_window: int = 0  # positions a sliding layer attends to, its own included
    layer_types: tuple[str, ...] = ()  # per layer: "sliding_attention" | "full_attention"
    gate_bias: bool = False  # a learned bias on the router logits
    softmax_after_topk: bool = False  # router weights: softmax over the top-k logits only
    expert_bias: bool = False  # a bias after each expert projection
    swiglu_limit: float | None = None  # clamped SwiGLU: (clamp(up) + 1) * g * sigmoid(alpha * g)
    swiglu_alpha: float = 1.702

    def window(self, layer: int) -> int:
        """Positions layer `layer` attends to, its own included (0: every earlier one)."""
        kinds = self.layer_types
        sliding = layer < len(kinds) and kinds[layer] == "sliding_attention"
        return self.sliding_window if sliding else 0

    @property
    def moe_layers(self) -> list[int]:
        """The real indices of the layers with experts (telemetry and placement cover these)."""
        return list(range(self.first_k_dense_replace, self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_replace

    @property
    def kv_elements_per_token(self) -> int:
        """KV cache elements one token takes in one layer: the normed latent and the rotated
        key for MLA, K and V of every KV head otherwise (x the dtype's size for bytes)."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing: `num_blocks` on the device, `num_host_blocks` for swap."""

    block_size: int = 16
    num_blocks: int = 1024
    num_host_blocks: int = 512
    enable_prefix_caching: bool = True
    # > 0: the device cache's MiB decide num_blocks, at the model's KV bytes per token (so an
    # MLA model's latent cache holds more tokens than a GQA model's in the same memory)
    memory_mib: float = 0.0
    # blocks of the sliding layers' own pool (engine.window_pool; 0: the model has none),
    # sized by the engine from the window and the knobs it starts with
    window_blocks: int = 0


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
    record_prompts: bool = False  # end records carry prompt token ids (a rerun replays them)
    overlap: bool = False  # plan each step while the step before runs (engine.launched)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHE_ARGS = {
    "block_size": "block_size",
    "num_kv_blocks": "num_blocks",
    "num_host_blocks": "num_host_blocks",
    "enable_prefix_caching": "enable_prefix_caching",
    "kv_cache_memory_mib": "memory_mib",
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
    allowed = {"device", "seed", "batching", "router_skew", "threads", "record_prompts", "overlap"}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ValueError(f"unknown engine argument(s) {unknown}")
    skew = kwargs.get("router_skew")
    if skew is not None and not math.isfinite(skew):
        raise ValueError(f"router_skew must be a finite number, got {skew}")
    batching = kwargs.get("batching", "continuous")
    if batching not in ("continuous", "static"):
        raise ValueError(f"batching {batching!r} must be 'continuous' or 'static'")
    overlap = kwargs.get("overlap", False)
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be true or false, got {overlap!r}")
    threads = kwargs.get("threads")
    if not (threads is None or threads == "auto" or (type(threads) is int and threads >= 1)):
        raise ValueError(f"threads must be a positive integer or 'auto', got {threads!r}")
    if "num_blocks" in cache_args and "memory_mib" in cache_args:
        raise ValueError("give num_kv_blocks or kv_cache_memory_mib, not both")
    memory = cache_args.get("memory_mib", 0.0)
    number = isinstance(memory, int | float) and not isinstance(memory, bool)
    if not number or not 0 <= memory < math.inf:
        raise ValueError(f"kv_cache_memory_mib must be a non-negative number, got {memory!r}")
    cache = CacheConfig(**cache_args)
    if cache.block_size < 1 or cache.num_blocks < 1 or cache.num_host_blocks < 0:
        raise ValueError("block_size and num_kv_blocks must be positive, num_host_blocks >= 0")
    return EngineConfig(
        model=model, dtype=dtype, cache=cache, parallel=parallel, knobs=Knobs(**knob_args), **kwargs
    )
