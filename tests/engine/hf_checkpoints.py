"""Tiny random-weight Hugging Face MoE checkpoints, written with `save_pretrained`, for tests.

Every checkpoint is float32 with a 128-token vocabulary and a word-level `tokenizer.json`
whose vocabulary is exactly that size, so generated ids always decode.
"""

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
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


def rewrite_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Let `edit` change the tensors of the checkpoint's model.safetensors in place."""
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
