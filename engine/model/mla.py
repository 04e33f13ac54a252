"""Multi-head latent attention (DeepSeek-V2/V3) over a paged cache of compressed latents.

Per token and layer the cache holds the normed KV latent (`kv_lora_rank`) and the rotated
shared key (`qk_rope_head_dim`), not expanded K and V. Decode rows attend over the latent
directly: the query's no-rope part is absorbed through the key half of `kv_b_proj` and the
attention output through its value half (as vLLM and FlashMLA do), on the decode-attention
backend (kernels.triton_mla on CUDA, its torch reference kernels.mla_attention on the CPU).
Prefill rows expand the sequence's latents to per-head K and V, where the work per query row
is what pays.
"""

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model.context import DecodeGroup, ForwardContext, PrefillSeq
from engine.model.layers import RMSNorm, Rotary
from engine.model.rope import softmax_scale_factor
from kernels import mla_decode

LORA_NORM_EPS = 1e-6  # DeepSeek's q_a / kv_a norms keep their default eps, not rms_norm_eps


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: Rotary) -> None:
        super().__init__()
        h, heads = cfg.hidden_size, cfg.num_heads
        self.num_heads, self.kv_lora_rank = heads, cfg.kv_lora_rank
        self.nope, self.rope, self.v_dim = (
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
        )
        q_dim = heads * (self.nope + self.rope)
        bias = cfg.qkv_bias
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(h, q_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=bias)
        self.rotary = rotary
        self.interleaved = cfg.rope_interleave
        self.scale = (self.nope + self.rope) ** -0.5 * softmax_scale_factor(cfg.rope_scaling)
        self.kv_cache = torch.empty(0)  # [blocks, block_size, kv_lora_rank + rope]

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            return self.q_proj(x)
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        assert self.q_b_proj is not None
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def _deinterleave(self, x: torch.Tensor) -> torch.Tensor:
        """DeepSeek's rope pairs are (x0, x1), (x2, x3), ...: lay them out as rotate-half
        expects. q and k get the same permutation, so their dot product is unchanged."""
        return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1) if self.interleaved else x

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        rows = x.shape[0]
        q = self._query(x).view(rows, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        q_pe, k_pe = self.rotary(
            positions, self._deinterleave(q_pe), self._deinterleave(k_pe).unsqueeze(1)
        )
        entry = torch.cat([self.kv_a_layernorm(latent), k_pe.squeeze(1)], dim=-1)
        self.kv_cache.view(-1, entry.shape[-1]).index_copy_(0, ctx.kv_index, entry)
        out = x.new_empty(rows, self.num_heads, self.v_dim)
        for g in ctx.decodes:
            out[g.rows] = self._decode(q_nope[g.rows], q_pe[g.rows], g)
        for p in ctx.prefills:
            span = slice(p.q_start, p.q_start + p.q_len)
            out[span] = self._prefill(q_nope[span], q_pe[span], p)
        return self.o_proj(out.flatten(1))

    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj as its key half [H, nope, L] and value half [H, v, L]."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        return w[:, : self.nope], w[:, self.nope :]

    def _decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, g: DecodeGroup) -> torch.Tensor:
        """One query row per sequence [B, H, *] against its latents, projections absorbed."""
        w_k, w_v = self._kv_b()
        q_latent = torch.einsum("bhn,hnl->bhl", q_nope, w_k)
        latent_out = mla_decode(
            q_latent, q_pe, self.kv_cache, g.block_tables, g.ctx_lens, self.scale
        )
        return torch.einsum("bhl,hvl->bhv", latent_out, w_v)

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, p: PrefillSeq) -> torch.Tensor:
        """The chunk's query rows [Q, H, *] against the sequence's latents expanded to K, V."""
        cache = self.kv_cache[p.block_table].flatten(0, 1)[: p.ctx_len]
        latent, k_pe = cache.split([self.kv_lora_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(latent).view(p.ctx_len, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, self.num_heads, -1)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        first = p.ctx_len - p.q_len  # the chunk's first position
        query_pos = torch.arange(first, p.ctx_len, device=q.device)
        visible = torch.arange(p.ctx_len, device=q.device) <= query_pos[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), visible, scale=self.scale
        )
        return out.transpose(0, 1)
