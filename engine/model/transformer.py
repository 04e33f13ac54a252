"""A Mixtral-shaped MoE decoder over a flat batch of tokens from many sequences; DeepSeek's
layouts swap in latent attention (MLA) and dense MLPs on the first layers."""

from typing import cast

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model.attention import Attention
from engine.model.context import ForwardContext
from engine.model.layers import RMSNorm, Rotary
from engine.model.mla import MLAttention
from engine.model.moe import MLP, MoEBlock


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: Rotary, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn: Attention | MLAttention = (
            MLAttention(cfg, rotary) if cfg.kv_lora_rank else Attention(cfg, rotary, index)
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        # placement and telemetry count MoE layers only: a MoE block's index is its place
        # among them (equal to the layer index when every layer has experts)
        dense = index < cfg.first_k_dense_replace
        self.mlp: MoEBlock | MLP = (
            MLP(cfg.hidden_size, cfg.dense_intermediate_size)
            if dense
            else MoEBlock(cfg, index - cfg.first_k_dense_replace)
        )

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, ctx) if isinstance(self.mlp, MoEBlock) else self.mlp(h))


class MoETransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        rope_dim = cfg.qk_rope_head_dim if cfg.kv_lora_rank else cfg.head_dim
        self.rotary = Rotary(rope_dim, cfg.rope_theta, cfg.max_model_len, cfg.rope_scaling)
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

    @property
    def moe_blocks(self) -> list[MoEBlock]:
        """The MoE blocks in layer order (dense layers have none)."""
        return [layer.mlp for layer in self.decoder_layers if isinstance(layer.mlp, MoEBlock)]

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

    def allocate_kv_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        """Give every attention layer its paged cache: K and V, or MLA's latents; sliding
        layers get `window_blocks` blocks (their own pool, engine.window_pool) when > 0.
        Zeros: a released window entry's block is read under a mask, so values must be
        finite."""
        cfg = self.cfg
        weight = self.embed_tokens.weight
        dtype, device = weight.dtype, weight.device
        latent = (num_blocks, block_size, cfg.kv_elements_per_token)
        layers = zip(self.decoder_layers, self.window_pool_layers(window_blocks), strict=True)
        for layer, in_window in layers:
            attn = layer.self_attn
            if isinstance(attn, MLAttention):
                attn.kv_cache = torch.zeros(latent, dtype=dtype, device=device)
            else:
                blocks = window_blocks if in_window else num_blocks
                shape = (blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
                attn.k_cache = torch.zeros(shape, dtype=dtype, device=device)
                attn.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    def window_pool_layers(self, window_blocks: int) -> list[bool]:
        """Per layer: whether its cache is in the sliding layers' pool (of `window_blocks`)."""
        return [bool(window_blocks) and bool(self.cfg.window(i)) for i in range(len(self.layers))]

    def kv_caches(self) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's cache tensors, blocks first (what a swap copies block by block)."""
        return [
            (attn.kv_cache,) if isinstance(attn, MLAttention) else (attn.k_cache, attn.v_cache)
            for attn in (layer.self_attn for layer in self.decoder_layers)
        ]
