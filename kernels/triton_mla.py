"""Triton decode attention for multi-head latent attention (DeepSeek-V2/V3) over a paged
latent cache: one query row per sequence, every head against one shared latent per position.

A program serves one (sequence, tile of heads, split). All heads read the same cache entry
(the latent is a single "KV head"), so a tile of HEAD_TILE heads is the rows of each tl.dot
and every latent tile is loaded once per head tile. A score is the absorbed query against the
latent plus the rope query against the shared rotated key, both halves of one cache row; the
latent is also the value, so the output stays in the latent space (the caller projects it
through kv_b_proj's value half). kv_lora_rank and the rope width are padded to powers of two
and masked, so DeepSeek's 512 + 64 and awkward test sizes run alike. As in
kernels.triton_attention, the context is cut into `num_splits` page ranges (split-K, for few
long sequences), merged in torch by log-sum-exp, and loop bounds come from the context
lengths on the device (no host sync, so decode graphs can capture it).
"""

import torch
import triton
import triton.language as tl

from kernels.triton_attention import default_splits
from kernels.triton_common import Launch, dot_types, rounds_by_hand, to_output
from kernels.triton_env import check_device

HEAD_TILE = 16  # tl.dot's smallest row count; DeepSeek-V3's 128 heads are 8 tiles
TILE_N = 32  # positions per step: a [32, 512] bf16 latent tile is 32 KiB of shared memory


@triton.jit
def _mla_decode(
    q_ptr,
    q_pe_ptr,
    cache_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    lse_ptr,
    scale,
    block_size,
    heads,
    pages_per_split,
    rank,
    rope,
    stride_qb,
    stride_qh,
    stride_pb,
    stride_ph,
    stride_cb,
    stride_cs,
    stride_tb,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    L_POW2: tl.constexpr,
    R_POW2: tl.constexpr,
    HEADS: tl.constexpr,
    TILE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    """HEADS query heads of one sequence over its latents at positions [start, end)."""
    b = tl.program_id(0)
    head_tile = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    start = split * pages_per_split * block_size
    end = tl.minimum(ctx, start + pages_per_split * block_size)

    h = head_tile * HEADS + tl.arange(0, HEADS)
    lat = tl.arange(0, L_POW2)
    r = tl.arange(0, R_POW2)
    h_ok = h < heads
    lat_ok = lat < rank
    r_ok = r < rope
    q = tl.load(
        q_ptr + b * stride_qb + h[:, None] * stride_qh + lat[None, :],
        mask=h_ok[:, None] & lat_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)
    q_pe = tl.load(
        q_pe_ptr + b * stride_pb + h[:, None] * stride_ph + r[None, :],
        mask=h_ok[:, None] & r_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full((HEADS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((HEADS,), dtype=tl.float32)
    acc = tl.zeros((HEADS, L_POW2), dtype=tl.float32)
    table = table_ptr + b.to(tl.int64) * stride_tb
    for pos0 in range(start, end, TILE):
        pos = pos0 + tl.arange(0, TILE)
        pos_ok = pos < end
        block = tl.load(table + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        row = cache_ptr + block * stride_cb + (pos % block_size) * stride_cs
        latent = tl.load(
            row[:, None] + lat[None, :], mask=pos_ok[:, None] & lat_ok[None, :], other=0.0
        ).to(DOT_DTYPE)
        k_pe = tl.load(
            row[:, None] + rank + r[None, :], mask=pos_ok[:, None] & r_ok[None, :], other=0.0
        ).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(latent), input_precision=PRECISION)
        s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PRECISION) * scale
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), latent, input_precision=PRECISION)
        m_i = m_new

    has = l_i > 0  # false for a split past the context and for a padding row (context 0)
    acc = acc / tl.where(has, l_i, 1.0)[:, None]
    out = out_ptr + b * stride_ob + h[:, None] * stride_oh + split * stride_os + lat[None, :]
    o_ok = h_ok[:, None] & lat_ok[None, :]
    if SPLIT:
        tl.store(out, acc, mask=o_ok)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + h * stride_lh + split, lse, mask=h_ok)
    else:
        tl.store(out, to_output(acc, out_ptr.dtype.element_ty, ROUND_BY_HAND), mask=o_ok)


def mla_decode_launch(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    splits: int,
) -> Launch:
    """The kernel over (sequences, head tiles, splits); out is [B, H, L] or [B, H, splits, L]."""
    batch, heads, rank = q_latent.shape
    rope = q_pe.shape[-1]
    if cache.shape[-1] != rank + rope:
        raise ValueError(f"cache rows hold {cache.shape[-1]} values, not {rank} + {rope}")
    if any(t.stride(-1) != 1 for t in (q_latent, q_pe, cache, out)):
        raise ValueError("MLA decode needs contiguous last dimensions")
    out_strides = (out.stride(0), out.stride(1), out.stride(2) if splits > 1 else 0)
    dot_dtype, precision = dot_types(q_latent.dtype)
    return Launch(
        _mla_decode,
        (batch, triton.cdiv(heads, HEAD_TILE), splits),
        (
            q_latent,
            q_pe,
            cache,
            block_tables,
            context_lens,
            out,
            lse,
            scale,
            cache.shape[1],
            heads,
            triton.cdiv(block_tables.shape[1], splits),
            rank,
            rope,
            q_latent.stride(0),
            q_latent.stride(1),
            q_pe.stride(0),
            q_pe.stride(1),
            cache.stride(0),
            cache.stride(1),
            block_tables.stride(0),
            *out_strides,
            lse.stride(0),
            lse.stride(1),
        ),
        dict(
            L_POW2=max(16, triton.next_power_of_2(rank)),
            R_POW2=max(16, triton.next_power_of_2(rope)),
            HEADS=HEAD_TILE,
            TILE=TILE_N,
            SPLIT=splits > 1,
            DOT_DTYPE=dot_dtype,
            PRECISION=precision,
            ROUND_BY_HAND=rounds_by_hand(q_latent.dtype),
            num_warps=4,
            num_stages=2,
        ),
    )


def mla_decode_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q_latent [B, H, L] (absorbed), q_pe [B, H, R]; cache [blocks, block_size, L + R];
    block_tables [B, nb]; lens [B]. Returns the attention output in latent space [B, H, L]."""
    check_device(q_latent.device)
    batch, heads, rank = q_latent.shape
    width = block_tables.shape[1]
    splits = num_splits or default_splits(
        batch, triton.cdiv(heads, HEAD_TILE), width * cache.shape[1], q_latent.device
    )
    q_latent, q_pe = q_latent.contiguous(), q_pe.contiguous()
    args = (q_latent, q_pe, cache, block_tables, context_lens, scale)
    if splits == 1:
        out = torch.empty_like(q_latent)
        mla_decode_launch(*args, out, out, 1)()
        return out
    out = torch.empty(batch, heads, splits, rank, dtype=torch.float32, device=q_latent.device)
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q_latent.device)
    mla_decode_launch(*args, out, lse, splits)()
    weights = torch.softmax(lse, dim=-1).nan_to_num_(0.0)
    return (weights.unsqueeze(-1) * out).sum(2).to(q_latent.dtype)
