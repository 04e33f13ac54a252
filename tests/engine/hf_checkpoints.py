"""Tiny random-weight Hugging Face MoE checkpoints, written with `save_pretrained`, for tests.

Every checkpoint is float32 with a 128-token vocabulary and a word-level `tokenizer.json`
whose vocabulary is exactly that size, so generated ids always decode.
"""

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from engine.model import mxfp4

VOCAB_SIZE = 128
BOS, EOS, UNK = 0, 1, 2
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "a",
    "dog",
    "ran",
    "to",
    "park",
    "and",
    "saw",
    "bird",
    "fly",
    "over",
    "tree",
    "red",
    "blue",
    "big",
    "small",
]
VOCAB = ["<s>", "</s>", "<unk>", *WORDS]
VOCAB += [f"w{i}" for i in range(VOCAB_SIZE - len(VOCAB))]

COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=None,
)

# name -> (config class, model class, family-specific config)
SPECS: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict[str, Any]]] = {
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(num_local_experts=4, intermediate_size=48)),
    "qwen2_moe": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(
            num_experts=8,
            moe_intermediate_size=24,
            intermediate_size=64,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
        ),
    ),
    "qwen2_moe_norm": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(
            num_experts=8,
            moe_intermediate_size=24,
            intermediate_size=64,
            shared_expert_intermediate_size=40,
            norm_topk_prob=True,
            qkv_bias=False,
        ),
    ),
    "olmoe": (
        OlmoeConfig,
        OlmoeForCausalLM,
        dict(num_experts=8, intermediate_size=24, clip_qkv=1.5, norm_topk_prob=False),
    ),
    "qwen3_moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(
            num_experts=8,
            moe_intermediate_size=24,
            intermediate_size=64,
            head_dim=16,
            norm_topk_prob=True,
        ),
    ),
    "qwen3_moe_tied": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(
            num_experts=4,
            moe_intermediate_size=24,
            intermediate_size=64,
            norm_topk_prob=False,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
    ),
}


def build_tokenizer() -> Tokenizer:
    """A whitespace word-level tokenizer that prepends <s>; <s> and </s> are special."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    return tok


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights big enough that routing, norms and biases all matter (HF init is near zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            else:
                fan_in = p.shape[-1]
                gain = 3.0 if name.endswith("mlp.gate.weight") else 1.0
                p.copy_(noise * gain / math.sqrt(fan_in))


def make_checkpoint(root: Path, name: str, seed: int = 0, tokenizer: bool = True) -> Path:
    """Write checkpoint `name` of SPECS under root/name and return its directory."""
    config_cls, model_cls, extra = SPECS[name]
    model = model_cls(config_cls(**COMMON, **extra))
    randomize_(model, seed)
    path = root / name
    model.save_pretrained(path)
    if tokenizer:
        build_tokenizer().save(str(path / "tokenizer.json"))
    return path


DELETE = object()  # as a config change: remove the key


def rewrite_config(path: Path, **changes: object) -> None:
    """Apply `changes` to the checkpoint's config.json (a change to DELETE removes the key)."""
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    cfg = {key: value for key, value in cfg.items() if value is not DELETE}
    (path / "config.json").write_text(json.dumps(cfg))


def rewrite_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    """Let `edit` change the tensors of the checkpoint's model.safetensors in place (what it
    returns, such as a popped tensor, is dropped)."""
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def load_reference(path: Path) -> PreTrainedModel:
    """The checkpoint loaded back by transformers itself, float32, eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@torch.inference_mode()
def reference_logits(model: PreTrainedModel, token_ids: list[int]) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of one full sequence, computed without a cache."""
    ids = torch.tensor([token_ids])
    return model(input_ids=ids, use_cache=False).logits[0].float()


# DeepSeek-V2 / V3 (MLA: every head reads the latent, so as many KV heads as heads)
DEEPSEEK_COMMON: dict[str, Any] = dict(
    COMMON,
    num_key_value_heads=COMMON["num_attention_heads"],
    n_routed_experts=8,
    moe_intermediate_size=24,
    intermediate_size=64,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=12,
)
YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.8,
    "mscale_all_dim": 1.0,
}
DEEPSEEK_SPECS: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict[str, Any]]] = {
    "deepseek_v2": (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        dict(
            q_lora_rank=None,
            topk_method="greedy",
            n_shared_experts=2,
            routed_scaling_factor=1.5,
        ),
    ),
    "deepseek_v2_group": (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        dict(
            q_lora_rank=None,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            attention_bias=True,
            first_k_dense_replace=1,
            num_hidden_layers=3,
        ),
    ),
    "deepseek_v3": (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        dict(
            q_lora_rank=20,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            num_hidden_layers=3,
            rope_parameters=YARN,
        ),
    ),
}


def make_deepseek_checkpoint(root: Path, name: str, seed: int = 0) -> Path:
    """Write DeepSeek checkpoint `name` of DEEPSEEK_SPECS under root/name, with a random
    (non-zero) `e_score_correction_bias` on V3's routers so that the bias's choices count."""
    config_cls, model_cls, extra = DEEPSEEK_SPECS[name]
    model = model_cls(config_cls(**{**DEEPSEEK_COMMON, **extra}))
    randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=gen))
    path = root / name
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    return path


# gpt-oss: a sliding layer between full ones, its window shorter than the test prompts; a
# SwiGLU limit low enough that the clamp bites on these weights
GPT_OSS_COMMON: dict[str, Any] = dict(
    COMMON,
    num_hidden_layers=3,
    head_dim=16,
    num_local_experts=8,
    intermediate_size=24,
    sliding_window=5,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    swiglu_limit=1.0,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
# MXFP4 packs 32 values along each projection's input: hidden and intermediate of 32s
GPT_OSS_MXFP4: dict[str, Any] = dict(hidden_size=64, intermediate_size=32)


def make_gpt_oss_checkpoint(
    root: Path, name: str = "gpt_oss", seed: int = 0, **changes: Any
) -> Path:
    """Write a gpt-oss checkpoint under root/name with random non-zero sinks, router bias,
    expert biases and q/k/v/o biases, each large enough to count."""
    model = GptOssForCausalLM(GptOssConfig(**{**GPT_OSS_COMMON, **changes}))
    randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 2000)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(("sinks", "router.bias", "_proj.bias", "proj_bias")):
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 if "sinks" in key else 0.5))
    path = root / name
    model.save_pretrained(path)
    build_tokenizer().save(str(path / "tokenizer.json"))
    return path


def quantize_gpt_oss_experts(path: Path, quantized: Path) -> None:
    """Write `quantized`, a copy of checkpoint `path` with its expert weights in MXFP4 as the
    released checkpoints store them, and round `path`'s own expert weights to what the MXFP4
    copy holds, so that transformers on `path` is the dequantized reference."""
    shutil.copytree(path, quantized)
    tensors = load_file(path / "model.safetensors")
    packed = {}
    for key in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = mxfp4.quantize(tensors[key])
        tensors[key] = mxfp4.dequantize(blocks, scales)
        packed[key + "_blocks"], packed[key + "_scales"] = blocks, scales
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    rest = {k: v for k, v in tensors.items() if k + "_blocks" not in packed}
    save_file({**rest, **packed}, quantized / "model.safetensors", metadata={"format": "pt"})
    rewrite_config(quantized, quantization_config={"quant_method": "mxfp4"})
