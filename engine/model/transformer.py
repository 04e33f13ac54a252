"""A Mixtral-shaped MoE decoder over a flat batch of tokens from many sequences."""

from typing import cast

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model.attention import Attention
from engine.model.context import ForwardContext
from engine.model.layers import RMSNorm, Rotary
from engine.model.moe import MoEBlock


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: Rotary, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MoEBlock(cfg, index)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx)
        return x + self.mlp(self.post_attention_layernorm(x), ctx)


class MoETransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_model_len)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, self.rotary, i) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers with their type (iterating an nn.ModuleList gives plain Modules)."""
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] for the flat batch."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, ctx)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Give every attention layer its paged K and V cache."""
        cfg = self.cfg
        weight = self.embed_tokens.weight
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        for layer in self.decoder_layers:
            attn = layer.self_attn
            attn.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            attn.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
