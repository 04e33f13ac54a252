"""Build a model from a synthetic preset or a local Hugging Face checkpoint directory."""

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig, ModelConfig
from engine.model.checkpoint import load_safetensors
from engine.model.hf_config import fp8_block, model_config_from_hf
from engine.model.hf_fields import read_config, refuse
from engine.model.tokenizer import ByteTokenizer, FileTokenizer, NoTokenizer, Tokenizer
from engine.model.transformer import MoETransformer

DSV2_LITE: dict[str, Any] = dict(
    family="deepseek_v2",
    hidden_size=256,
    num_layers=6,
    num_heads=16,
    num_kv_heads=16,
    head_dim=24,
    kv_lora_rank=64,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    rope_interleave=True,
    moe_intermediate_size=176,
    num_experts=64,
    top_k=6,
    shared_expert_intermediate_size=2 * 176,
    shared_expert_gated=False,
    first_k_dense_replace=1,
    dense_intermediate_size=1368,
    max_model_len=2048,
    router_skew=0.6,
)
SYNTHETIC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        moe_intermediate_size=96,
        num_experts=8,
        top_k=2,
        max_model_len=1024,
    ),
    "small": dict(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        moe_intermediate_size=384,
        num_experts=16,
        top_k=2,
        max_model_len=2048,
        router_skew=0.6,
    ),
    "medium": dict(
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        moe_intermediate_size=768,
        num_experts=64,
        top_k=4,
        max_model_len=4096,
        router_skew=0.6,
    ),
    # DeepSeek-V2-Lite's shape with every width divided by 8 and 6 of its 27 layers: MLA
    # (no q LoRA), 64 routed experts top-6, 2 ungated shared ones, a dense first layer
    "dsv2-lite": DSV2_LITE,
    # the same model with grouped-query attention in place of MLA (16 heads, 8 KV heads),
    # about as many parameters: what MLA's latent cache is measured against
    "dsv2-lite-gqa": {**DSV2_LITE, "kv_lora_rank": 0, "head_dim": 16, "num_kv_heads": 8},
}


# `demo` names the small MoE that models/train_demo.py trains on the standard library; it
# ships in the repository (models/demo/), next to the engine package
DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo"


def resolve_model_path(name: str) -> Path:
    """The checkpoint directory that model `name` (`demo` or a path) stands for."""
    return DEMO_MODEL if name == "demo" else Path(name)


def load_model(
    name: str, dtype: torch.dtype, device: str, seed: int = 0, router_skew: float | None = None
) -> tuple[MoETransformer, Tokenizer]:
    """`synthetic:<preset>`, `demo` or a path to a Hugging Face checkpoint directory."""
    if name.startswith("synthetic:"):
        return _synthetic(name.removeprefix("synthetic:"), dtype, device, seed, router_skew)
    path = _checkpoint_dir(name)
    config = read_config(path)
    cfg = model_config_from_hf(config)
    model = MoETransformer(cfg)
    load_safetensors(model, path, fp8_block(config))
    tok_path = path / "tokenizer.json"
    tokenizer = FileTokenizer(tok_path) if tok_path.is_file() else NoTokenizer(path)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def _checkpoint_dir(name: str) -> Path:
    path = resolve_model_path(name)
    if not (path / "config.json").is_file():
        presets = ", ".join(f"synthetic:{p}" for p in SYNTHETIC_PRESETS)
        raise ValueError(
            f"unknown model {name!r}: expected one of {presets}, demo "
            "or a directory with config.json"
        )
    return path


def model_config(name: str, router_skew: float | None = None) -> ModelConfig:
    """The architecture model `name` stands for, without loading its weights."""
    if name.startswith("synthetic:"):
        return _preset_config(name.removeprefix("synthetic:"), router_skew)
    return model_config_from_hf(read_config(_checkpoint_dir(name)))


def sized_by_kv_memory(config: EngineConfig) -> EngineConfig:
    """`config` with the KV blocks that `kv_cache_memory_mib` buys at the model's bytes per
    token (all layers), when it is set."""
    cache = config.cache
    if not cache.memory_mib:
        return config
    cfg = model_config(config.model, config.router_skew)
    per_block = (
        cfg.kv_elements_per_token * config.dtype.itemsize * cfg.num_layers * cache.block_size
    )
    blocks = int(cache.memory_mib * 2**20 // per_block)
    refuse(
        blocks < 1,
        f"kv_cache_memory_mib ({cache.memory_mib}) holds no block of {per_block} bytes",
    )
    return replace(config, cache=replace(cache, num_blocks=blocks))


def _preset_config(preset: str, router_skew: float | None) -> ModelConfig:
    if preset not in SYNTHETIC_PRESETS:
        raise ValueError(
            f"unknown synthetic preset {preset!r}: expected one of {sorted(SYNTHETIC_PRESETS)}"
        )
    tok = ByteTokenizer()
    kw = dict(SYNTHETIC_PRESETS[preset])
    if router_skew is not None:
        kw["router_skew"] = router_skew
    kw.setdefault("family", "mixtral")
    return ModelConfig(vocab_size=tok.vocab_size, eos_token_ids=(tok.eos_token_id,), **kw)


def _synthetic(
    preset: str, dtype: torch.dtype, device: str, seed: int, router_skew: float | None
) -> tuple[MoETransformer, Tokenizer]:
    cfg = _preset_config(preset, router_skew)
    tok = ByteTokenizer()
    model = MoETransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(
                    0.0,
                    1.0 / math.sqrt(p.shape[-2] if p.dim() == 3 else p.shape[-1]),
                    generator=gen,
                )
        skew = -cfg.router_skew * torch.log1p(torch.arange(cfg.num_experts, dtype=torch.float))
        for block in model.moe_blocks:
            block.router_bias.copy_(skew)
    return model.to(device=device, dtype=dtype).eval(), tok
