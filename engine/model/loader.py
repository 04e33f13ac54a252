"""Build a model from a synthetic preset or a local Hugging Face checkpoint directory."""

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.config import Family, ModelConfig
from engine.model.tokenizer import ByteTokenizer, FileTokenizer, NoTokenizer, Tokenizer
from engine.model.transformer import MoETransformer

SYNTHETIC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 moe_intermediate_size=96, num_experts=8, top_k=2, max_model_len=1024),
    "small": dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
                  moe_intermediate_size=384, num_experts=16, top_k=2, max_model_len=2048,
                  router_skew=0.6),
    "medium": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
                   moe_intermediate_size=768, num_experts=64, top_k=4, max_model_len=4096,
                   router_skew=0.6),
}

FAMILIES: dict[str, Family] = {
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe",
}

MAX_ROPE_TABLE = 32768


def load_model(
    name: str, dtype: torch.dtype, device: str, seed: int = 0, router_skew: float | None = None
) -> tuple[MoETransformer, Tokenizer]:
    """`synthetic:<preset>` or a path to a Hugging Face checkpoint directory."""
    if name.startswith("synthetic:"):
        return _synthetic(name.removeprefix("synthetic:"), dtype, device, seed, router_skew)
    path = Path(name)
    if not (path / "config.json").is_file():
        presets = ", ".join(f"synthetic:{p}" for p in SYNTHETIC_PRESETS)
        raise ValueError(
            f"unknown model {name!r}: expected one of {presets} or a directory with config.json"
        )
    cfg = model_config_from_hf(json.loads((path / "config.json").read_text()))
    model = MoETransformer(cfg)
    load_safetensors(model, path)
    tok_path = path / "tokenizer.json"
    tokenizer = FileTokenizer(tok_path) if tok_path.is_file() else NoTokenizer(path)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def _synthetic(
    preset: str, dtype: torch.dtype, device: str, seed: int, router_skew: float | None
) -> tuple[MoETransformer, Tokenizer]:
    if preset not in SYNTHETIC_PRESETS:
        raise ValueError(
            f"unknown synthetic preset {preset!r}: expected one of {sorted(SYNTHETIC_PRESETS)}"
        )
    tok = ByteTokenizer()
    kw = dict(SYNTHETIC_PRESETS[preset])
    if router_skew is not None:
        kw["router_skew"] = router_skew
    cfg = ModelConfig(family="mixtral", vocab_size=tok.vocab_size,
                      eos_token_ids=(tok.eos_token_id,), **kw)
    model = MoETransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-2] if p.dim() == 3 else p.shape[-1]),
                          generator=gen)
        skew = -cfg.router_skew * torch.log1p(torch.arange(cfg.num_experts, dtype=torch.float))
        for layer in model.layers:
            layer.mlp.router_bias.copy_(skew)
    return model.to(device=device, dtype=dtype).eval(), tok


def _refuse(cond: bool, message: str) -> None:
    if cond:
        raise ValueError(message)


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    """Map a Hugging Face config.json onto ModelConfig, refusing what the model cannot run."""
    model_type = c.get("model_type")
    family = FAMILIES.get(str(model_type))
    _refuse(family is None, f"unsupported model family {model_type!r}: "
            f"moescope runs {sorted(FAMILIES)}")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _refuse(rope_type != "default", f"unsupported rope scaling {rope_type!r}")
    sliding = c["use_sliding_window"] if "use_sliding_window" in c else c.get("sliding_window")
    _refuse(bool(sliding), "sliding-window attention is not supported")
    _refuse(c.get("decoder_sparse_step", 1) != 1 or bool(c.get("mlp_only_layers")),
            "checkpoints with dense (non-MoE) layers are not supported")
    heads = c["num_attention_heads"]
    eos = c.get("eos_token_id")
    moe_inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    return ModelConfig(
        family=family,  # type: ignore[arg-type]
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        moe_intermediate_size=moe_inter,
        num_experts=c.get("num_local_experts") or c["num_experts"],
        top_k=c["num_experts_per_tok"],
        norm_topk_prob=True if family == "mixtral" else bool(c.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=(c.get("shared_expert_intermediate_size") or 0)
        if family == "qwen2_moe" else 0,
        qkv_bias=_qkv_bias(family, c),
        o_proj_bias=family in ("olmoe", "qwen3_moe") and bool(c.get("attention_bias", False)),
        qk_norm={"olmoe": "full", "qwen3_moe": "head"}.get(family, "none"),  # type: ignore[arg-type]
        clip_qkv=c.get("clip_qkv"),
        rms_eps=c.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        max_model_len=min(c.get("max_position_embeddings", 4096), MAX_ROPE_TABLE),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )


def _qkv_bias(family: Family | None, c: dict[str, Any]) -> bool:
    """Qwen2-MoE reads `qkv_bias` (default on); OLMoE and Qwen3-MoE read `attention_bias`."""
    if family == "qwen2_moe":
        return bool(c.get("qkv_bias", True))
    return family != "mixtral" and bool(c.get("attention_bias", False))


EXPERT_KEY = re.compile(
    r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight"
)
EXPERT_ROLE = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up",
               "w2": "down", "down_proj": "down"}


def load_safetensors(model: MoETransformer, path: Path) -> None:
    """Copy every tensor of the checkpoint into the model; experts are stacked per layer."""
    files = sorted(path.glob("*.safetensors"))
    _refuse(not files, f"{path} holds no *.safetensors weights")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    inter = model.cfg.moe_intermediate_size
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    name = key.removeprefix("model.").replace("block_sparse_moe", "mlp")
                    tensor = f.get_tensor(key)
                    m = EXPERT_KEY.fullmatch(name)
                    if m:
                        layer, expert, role = int(m[1]), int(m[2]), EXPERT_ROLE[m[3]]
                        _copy_expert(model, layer, expert, role, tensor, inter)
                        loaded.add(f"layers.{layer}.experts.{expert}.{role}")
                    elif name == "lm_head.weight" and model.cfg.tie_embeddings:
                        continue
                    elif name in params:
                        params[name].copy_(tensor)
                        loaded.add(name)
                    else:
                        raise ValueError(f"unexpected tensor {key!r} in {file.name}")
    expected = {n for n in params if ".w_" not in n}
    cfg = model.cfg
    expected |= {f"layers.{i}.experts.{e}.{r}" for i in range(cfg.num_layers)
                 for e in range(cfg.num_experts) for r in ("gate", "up", "down")}
    if cfg.tie_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    _refuse(bool(missing), f"checkpoint {path} is missing tensors: {missing[:8]}")


def _copy_expert(
    model: MoETransformer, layer: int, expert: int, role: str, w: torch.Tensor, inter: int
) -> None:
    mlp = model.layers[layer].mlp
    if role == "gate":
        mlp.w_gate_up[expert, :, :inter].copy_(w.T)
    elif role == "up":
        mlp.w_gate_up[expert, :, inter:].copy_(w.T)
    else:
        mlp.w_down[expert].copy_(w.T)
