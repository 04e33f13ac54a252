"""Attention over a paged KV cache (torch reference implementation).

Caches are [num_blocks, block_size, num_kv_heads, head_dim]; block tables map a
sequence's logical blocks to physical ones. Two gpt-oss terms are optional everywhere:
`sinks` [H], a learned logit per head that joins each softmax's denominator (and adds nothing
to the output), and `window`, the positions a sliding layer attends to, its own included
(0: every earlier one).
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
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of one sequence's last q.shape[0] tokens over its first ctx_len tokens."""
    n = q.shape[0]
    first = max(0, ctx_len - n - window + 1) if window else 0  # no query sees further back
    skip = first // k_cache.shape[1]  # whole blocks before it are not even gathered
    start, end = first - skip * k_cache.shape[1], ctx_len - skip * k_cache.shape[1]
    k = _gather(k_cache, block_table[skip:])[start:end]
    v = _gather(v_cache, block_table[skip:])[start:end]
    qi = torch.arange(ctx_len - n, ctx_len, device=q.device).unsqueeze(1)
    ki = torch.arange(first, ctx_len, device=q.device).unsqueeze(0)
    mask = ki <= qi
    if window:
        mask &= ki > qi - window
    if sinks is not None:
        out = _attend_with_sinks(q.transpose(0, 1), k, v, mask, scale, sinks)
        return out.transpose(0, 1)
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
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """One query token per sequence: q [B, H, D], block_tables [B, nb] (padded), lens [B]."""
    k = _gather(k_cache, block_tables)
    v = _gather(v_cache, block_tables)
    if q.device.type == "cpu" and q.dtype != torch.float32:
        # the CPU's SDPA kernel takes 4.5x as long for one query row in bf16 as in float32
        # (benchmarks/RESULTS.md, forward): the upcast copies cost far less
        out = _decode_sdpa(q.float(), k.float(), v.float(), context_lens, scale, sinks, window)
        return out.to(q.dtype)
    return _decode_sdpa(q, k, v, context_lens, scale, sinks, window)


def _decode_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """q [B, H, D] over gathered k, v [B, L, Hkv, D], masked to each sequence's length."""
    pos = torch.arange(k.shape[1], device=q.device).unsqueeze(0)
    mask = pos < context_lens.unsqueeze(1)
    if window:
        mask &= pos >= context_lens.unsqueeze(1) - window
    if sinks is not None:
        out = _attend_with_sinks(q.unsqueeze(2), k, v, mask[:, None, None, :], scale, sinks)
        return out.squeeze(2)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)


def _attend_with_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """q [..., H, Lq, D] over k, v [..., L, Hkv, D] (GQA), with a sink logit per head: the
    softmax runs over [scores, sink] and the sink's column is dropped. SDPA has no such term,
    so this is written out as transformers' eager attention is."""
    heads, kv_heads = q.shape[-3], k.shape[-2]
    k = k.transpose(-3, -2).repeat_interleave(heads // kv_heads, dim=-3)
    v = v.transpose(-3, -2).repeat_interleave(heads // kv_heads, dim=-3)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    logits = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
    return probs.to(v.dtype) @ v
