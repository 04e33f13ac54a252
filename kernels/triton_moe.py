"""Triton MoE experts: fused gate/up + SiLU-and-multiply, then down with the router weight.

Rows are token-expert pairs sorted by expert; `offsets` holds each expert's group end. Every
program finds its expert from the offsets itself, so the grid depends only on the shapes
(no host sync, CUDA-graph safe): tiles never straddle two experts, and there are at most
min(rows, cdiv(rows, BLOCK_M) + experts) of them; programs past the last tile return.
"""

import torch
import triton
import triton.language as tl

from kernels.gemm_configs import GemmConfig, MoEConfig, lookup
from kernels.swiglu import ExpertTerms
from kernels.triton_common import Launch, dot_types, rounds_by_hand, to_output
from kernels.triton_env import check_device


@triton.jit
def _moe_gemm(
    a_ptr,
    b_ptr,
    c_ptr,
    offsets_ptr,
    pairs_ptr,
    scale_ptr,
    bias_ptr,
    stride_bias,
    limit,
    alpha,
    num_experts,
    max_tiles,
    N,
    K,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    E_POW2: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CLAMP: tl.constexpr,
    TOP_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    """C[rows] = A[rows] @ B[expert] over rows sorted by expert, `pairs` giving each row's
    flat pair id (token * TOP_K + j). Gated: A rows are gathered (the pair's token) and C is
    SiLU(gate) * up over B's two column halves. Else C is scaled by the pair's router weight
    and scattered to the pair's row. HAS_BIAS: the expert's bias row (gated: gate's N, then
    up's) is added to the sums first; CLAMP: gpt-oss's clamped SwiGLU (kernels.swiglu)."""
    pid = tl.program_id(0)
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(max_tiles - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    idx = tl.arange(0, E_POW2)
    live = idx < num_experts
    ends = tl.load(offsets_ptr + idx, mask=live, other=0)
    starts = tl.load(offsets_ptr + idx - 1, mask=live & (idx > 0), other=0)
    tiles = tl.where(live, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
    expert = tl.sum((tl.cumsum(tiles, 0) <= pid_m).to(tl.int32), 0)
    if expert >= num_experts:
        return
    first_tile = tl.sum(tl.where(idx < expert, tiles, 0), 0)
    row0 = tl.load(offsets_ptr + expert - 1, mask=expert > 0, other=0)
    rows = row0 + (pid_m - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < tl.load(offsets_ptr + expert)
    pairs = tl.load(pairs_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    a_rows = pairs // TOP_K if GATED else rows.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = (
        b_ptr
        + expert.to(tl.int64) * stride_be
        + ks[:, None] * stride_bk
        + cols[None, :] * stride_bn
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a_ok = row_ok[:, None]
        b_ok = col_ok[None, :]
        if not EVEN_K:
            a_ok = a_ok & (ks[None, :] < K - k0)
            b_ok = b_ok & (ks[:, None] < K - k0)
        a = tl.load(a_ptrs, mask=a_ok, other=0.0).to(DOT_DTYPE)
        b = tl.load(b_ptrs, mask=b_ok, other=0.0).to(DOT_DTYPE)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if GATED:
            up = tl.load(b_ptrs + N * stride_bn, mask=b_ok, other=0.0).to(DOT_DTYPE)
            acc_up = tl.dot(a, up, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:
        bias_row = bias_ptr + expert.to(tl.int64) * stride_bias + cols
        acc += tl.load(bias_row, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias_row + N, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if CLAMP:
            gate = tl.minimum(acc, limit)
            up = tl.minimum(tl.maximum(acc_up, -limit), limit)
            acc = (up + 1.0) * (gate / (1.0 + tl.exp(-(gate * alpha))))
        else:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
        c_rows = rows.to(tl.int64)
    else:
        c_rows = pairs
        acc = acc * tl.load(scale_ptr + pairs, mask=row_ok, other=0.0)[:, None]
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + cols[None, :] * stride_cn
    out = to_output(acc, c_ptr.dtype.element_ty, ROUND_BY_HAND)
    tl.store(c_ptrs, out, mask=row_ok[:, None] & col_ok[None, :])


def gemm_launch(
    cfg: GemmConfig,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    offsets: torch.Tensor,
    pairs: torch.Tensor,
    scale: torch.Tensor | None,
    n: int,
    top_k: int,
    bias: torch.Tensor | None = None,
    limit: float | None = None,
    alpha: float = 1.702,
) -> Launch:
    """One grouped GEMM over `pairs.numel()` sorted rows: gated if no scale (see _moe_gemm),
    plus the experts' bias rows and, gated, the clamped SwiGLU when `limit` is set."""
    rows, k = pairs.numel(), a.shape[1]
    experts = b.shape[0]
    max_tiles = min(rows, triton.cdiv(rows, cfg.block_m) + experts)
    dot_dtype, precision = dot_types(a.dtype)
    return Launch(
        _moe_gemm,
        (max_tiles * triton.cdiv(n, cfg.block_n),),
        (
            a,
            b,
            c,
            offsets,
            pairs,
            scale if scale is not None else c,
            bias if bias is not None else c,
            0 if bias is None else bias.stride(0),
            0.0 if limit is None else limit,
            alpha,
            experts,
            max_tiles,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            b.stride(2),
            c.stride(0),
            c.stride(1),
        ),
        dict(
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            E_POW2=triton.next_power_of_2(experts),
            GATED=scale is None,
            HAS_BIAS=bias is not None,
            CLAMP=limit is not None,
            TOP_K=top_k,
            EVEN_K=k % cfg.block_k == 0,
            DOT_DTYPE=dot_dtype,
            PRECISION=precision,
            ROUND_BY_HAND=rounds_by_hand(c.dtype),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        ),
    )


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    order: torch.Tensor,
    per_expert: torch.Tensor,
    weights: torch.Tensor,
    config: MoEConfig | None = None,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """Routed expert output in token order: sum over a token's pairs of weight * FFN_e(x).

    x [T, H]; w_gate_up [E, H, 2I]; w_down [E, I, H]; order [N] flat pair ids (t*k + j)
    sorted by expert; per_expert [E] rows per expert (sums to N); weights [T, k] float32.
    Pairs missing from `order` (dropped by capacity) contribute nothing. terms: the experts'
    biases and clamped SwiGLU (kernels.swiglu).
    """
    t, h = x.shape
    top_k = weights.shape[1]
    experts, inter = w_down.shape[0], w_down.shape[1]
    rows = order.numel()
    if rows == 0:
        return torch.zeros_like(x)
    check_device(x.device)
    cfg = config or lookup(x.device, experts, h, inter, rows, x.dtype)
    offsets = torch.cumsum(per_expert, 0)
    act = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    terms = terms or ExpertTerms()
    gemm_launch(
        cfg.gate_up,
        x,
        w_gate_up,
        act,
        offsets,
        order,
        None,
        inter,
        top_k,
        _contiguous(terms.b_gate_up),
        terms.swiglu_limit,
        terms.swiglu_alpha,
    )()
    full = rows == t * top_k
    out = (torch.empty if full else torch.zeros)(t * top_k, h, dtype=x.dtype, device=x.device)
    scale = weights.float().flatten()
    b_down = _contiguous(terms.b_down)
    gemm_launch(cfg.down, act, w_down, out, offsets, order, scale, h, top_k, b_down)()
    return out if top_k == 1 else out.view(t, top_k, h).sum(1)


def _contiguous(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.contiguous()
