"""Attention over a paged KV cache (torch reference implementation).

Caches are [num_blocks, block_size, num_kv_heads, head_dim]; block tables map a
sequence's logical blocks to physical ones.
"""

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_index: torch.Tensor,
) -> None:
    """Store new keys/values [T, Hkv, D] at flat cache indices (block * block_size + offset)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, kv_index, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, kv_index, v)


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., nb] block ids -> [..., nb * block_size, Hkv, D] tokens (index_select: one copy)."""
    g = cache.index_select(0, block_table.flatten())
    return g.view(*block_table.shape[:-1], -1, *cache.shape[2:])


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one sequence's last q.shape[0] tokens over its first ctx_len tokens."""
    n = q.shape[0]
    k = _gather(k_cache, block_table)[:ctx_len]
    v = _gather(v_cache, block_table)[:ctx_len]
    qi = torch.arange(ctx_len - n, ctx_len, device=q.device).unsqueeze(1)
    mask = torch.arange(ctx_len, device=q.device).unsqueeze(0) <= qi
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


def decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, H, D], block_tables [B, nb] (padded), lens [B]."""
    k = _gather(k_cache, block_tables)
    v = _gather(v_cache, block_tables)
    if q.device.type == "cpu" and q.dtype != torch.float32:
        # the CPU's SDPA kernel takes 4.5x as long for one query row in bf16 as in float32
        # (benchmarks/RESULTS.md, forward): the upcast copies cost far less
        return _decode_sdpa(q.float(), k.float(), v.float(), context_lens, scale).to(q.dtype)
    return _decode_sdpa(q, k, v, context_lens, scale)


def _decode_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [B, H, D] over gathered k, v [B, L, Hkv, D], masked to each sequence's length."""
    mask = torch.arange(k.shape[1], device=q.device).unsqueeze(0) < context_lens.unsqueeze(1)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)
