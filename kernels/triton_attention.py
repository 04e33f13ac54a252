"""Triton paged decode attention: one query token per sequence, K/V read through block tables.

A program serves one (sequence, KV head, split): the query heads sharing that KV head (GQA)
are the rows of its tile, so each K/V position is loaded once per group. The context is cut
into `num_splits` page ranges (flash-decoding) so that few long sequences still fill the GPU;
each split writes a normalised partial output and its log-sum-exp, and the splits are merged
in torch. Loop bounds come from the context lengths on the device: no host sync, and work
follows the real context, not the padded block-table width. gpt-oss's terms: a sliding
window starts the loop at the window's first position (pages before it are never read), and a
per-head sink logit joins the softmax's denominator: in the kernel without splits, in the
merge with them (as one more split that holds no values).
"""

import torch
import triton
import triton.language as tl

from kernels.triton_common import Launch, dot_types, rounds_by_hand, to_output
from kernels.triton_env import check_device, interpreting

TILE_N = 64
FULL = 1 << 30  # the window of a full-attention layer: longer than any context


@triton.jit
def _paged_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    lse_ptr,
    sinks_ptr,
    scale,
    window,
    block_size,
    group,
    pages_per_split,
    head_dim,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_tb,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    D_POW2: tl.constexpr,
    G_PAD: tl.constexpr,
    TILE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Attention of G query heads over positions [start, end) of one sequence's context,
    within its last `window` positions (a full layer passes a window longer than any context)."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    start = split * pages_per_split * block_size
    end = tl.minimum(ctx, start + pages_per_split * block_size)
    start = tl.maximum(start, ctx - window)

    g = tl.arange(0, G_PAD)
    heads = kv_head * group + g
    d = tl.arange(0, D_POW2)
    g_ok = g < group
    d_ok = d < head_dim
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_POW2), dtype=tl.float32)
    table = table_ptr + b.to(tl.int64) * stride_tb
    for pos0 in range(start, end, TILE):
        pos = pos0 + tl.arange(0, TILE)
        pos_ok = pos < end
        block = tl.load(table + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        kv = block * stride_kb + (pos % block_size) * stride_ks + kv_head * stride_kh
        kv_ok = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv[:, None] + d[None, :], mask=kv_ok, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv[:, None] + d[None, :], mask=kv_ok, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        m_i = m_new

    if HAS_SINKS and not SPLIT:  # the sink's exp joins the sum, with no value
        sink = tl.load(sinks_ptr + heads, mask=g_ok, other=0.0).to(tl.float32)
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.exp(sink - m_new)
        acc = acc * alpha[:, None]
        m_i = m_new
    has = l_i > 0
    acc = acc / tl.where(has, l_i, 1.0)[:, None]
    out = out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    o_ok = g_ok[:, None] & d_ok[None, :]
    if SPLIT:
        tl.store(out, acc, mask=o_ok)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_ok)
    else:
        tl.store(out, to_output(acc, out_ptr.dtype.element_ty, ROUND_BY_HAND), mask=o_ok)


def default_splits(batch: int, kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Enough splits for about two programs per SM, each with at least 256 positions."""
    if interpreting():
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(2 * sms, batch * kv_heads)
    return max(1, min(want, triton.cdiv(max_tokens, 256)))


def decode_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    splits: int,
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> Launch:
    """The kernel over (sequences, KV heads, splits); out is [B, H, D] or [B, H, splits, D]."""
    batch, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    if k_cache.stride(-1) != 1 or q.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("paged decode attention needs a contiguous head dimension")
    out_strides = (out.stride(0), out.stride(1), out.stride(2) if splits > 1 else 0)
    dot_dtype, precision = dot_types(q.dtype)
    return Launch(
        _paged_decode,
        (batch, kv_heads, splits),
        (
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            out,
            lse,
            out if sinks is None else sinks,
            scale,
            window or FULL,
            block_size,
            group,
            triton.cdiv(block_tables.shape[1], splits),
            head_dim,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.stride(0),
            *out_strides,
            lse.stride(0),
            lse.stride(1),
        ),
        dict(
            D_POW2=max(16, triton.next_power_of_2(head_dim)),
            G_PAD=max(16, triton.next_power_of_2(group)),
            TILE=TILE_N,
            SPLIT=splits > 1,
            DOT_DTYPE=dot_dtype,
            PRECISION=precision,
            ROUND_BY_HAND=rounds_by_hand(q.dtype),
            HAS_SINKS=sinks is not None,
        ),
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """q [B, H, D]; caches [blocks, block_size, Hkv, D]; block_tables [B, nb]; lens [B] >= 1;
    sinks [H] (a logit per head) or None; window 0 (all) or the positions attended to."""
    check_device(q.device)
    batch, heads, head_dim = q.shape
    width = block_tables.shape[1]
    splits = num_splits or default_splits(
        batch, k_cache.shape[2], width * k_cache.shape[1], q.device
    )
    q = q.contiguous()
    if splits == 1:
        out = torch.empty_like(q)
        decode_launch(
            q, k_cache, v_cache, block_tables, context_lens, scale, out, out, 1, sinks, window
        )()
        return out
    out = torch.empty(batch, heads, splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
    decode_launch(
        q, k_cache, v_cache, block_tables, context_lens, scale, out, lse, splits, sinks, window
    )()
    if sinks is not None:  # one more split: the sink's logit, no values
        lse = torch.cat([lse, sinks.float().view(1, heads, 1).expand(batch, heads, 1)], dim=-1)
        out = torch.cat([out, out.new_zeros(batch, heads, 1, head_dim)], dim=2)
    weights = torch.softmax(lse, dim=-1).nan_to_num_(0.0)
    return (weights.unsqueeze(-1) * out).sum(2).to(q.dtype)
