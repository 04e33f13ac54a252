"""Grouped-query attention over the paged KV cache for a flat batch of prefill and decode rows.

gpt-oss adds a learned sink logit per head (`sinks`) and sliding layers that attend only to
their last `window` positions (kernels.paged_attention).
"""

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model.context import ForwardContext
from engine.model.layers import RMSNorm, Rotary
from kernels import decode_attention, prefill_attention, write_kv


class Attention(nn.Module):
    sinks: torch.Tensor | None

    def __init__(self, cfg: ModelConfig, rotary: Rotary, index: int = 0) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm != "none":
            full = cfg.qk_norm == "full"
            self.q_norm = RMSNorm(q_dim if full else cfg.head_dim, cfg.rms_eps)
            self.k_norm = RMSNorm(kv_dim if full else cfg.head_dim, cfg.rms_eps)
        self.clip_qkv = cfg.clip_qkv
        self.rotary = rotary
        self.scale = cfg.head_dim**-0.5
        self.window = cfg.window(index)
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:  # after OLMoE's full-width QK norm, as transformers does
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        shape = (x.shape[0], -1, self.head_dim)
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        q, k, v = self._qkv(x)
        q, k = self.rotary(positions, q, k)
        # a sliding layer's cache is in the window pool when the model has one
        window_index = ctx.window_kv_index if self.window else None
        own_pool = window_index is not None
        write_kv(
            self.k_cache, self.v_cache, k, v, ctx.kv_index if window_index is None else window_index
        )
        out = torch.empty_like(q)
        for g in ctx.decodes:
            tables = g.window_tables if own_pool else g.block_tables
            assert tables is not None
            out[g.rows] = decode_attention(
                q[g.rows],
                self.k_cache,
                self.v_cache,
                tables,
                g.ctx_lens,
                self.scale,
                self.sinks,
                self.window,
            )
        for p in ctx.prefills:
            rows = slice(p.q_start, p.q_start + p.q_len)
            table = p.window_table if own_pool else p.block_table
            assert table is not None
            out[rows] = prefill_attention(
                q[rows],
                self.k_cache,
                self.v_cache,
                table,
                p.ctx_len,
                self.scale,
                self.sinks,
                self.window,
            )
        return self.o_proj(out.flatten(1))
