"""gpt-oss's attention terms, a sink logit per head and a sliding window, in the torch and
Triton paged attention, against attention written out per sequence and head."""

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err
from test_paged_attention import case

from kernels import decode_attention, decode_attention_torch, prefill_attention
from kernels.triton_attention import paged_decode_attention


def naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: list[int],
    scale: float,
    sinks: torch.Tensor | None,
    window: int,
) -> torch.Tensor:
    """q [n, H, D] at `positions` over one sequence's k, v [L, Hkv, D], head by head."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, pos in enumerate(positions):
        first = max(0, pos - window + 1) if window else 0
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = k[first : pos + 1, kv].double() @ q[i, h].double() * scale
            if sinks is not None:
                scores = torch.cat([scores, sinks[h].double().view(1)])
            p = torch.softmax(scores, 0)[: pos + 1 - first]
            out[i, h] = p @ v[first : pos + 1, kv].double()
    return out


def gathered(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    return cache[table].flatten(0, 1)[:length]


def decode_reference(args: tuple[torch.Tensor, ...], scale: float, sinks, window: int):
    q, k_cache, v_cache, tables, lens = args
    rows = []
    for b, n in enumerate(lens.tolist()):
        k, v = gathered(k_cache, tables[b], n), gathered(v_cache, tables[b], n)
        rows.append(naive(q[b : b + 1], k, v, [n - 1], scale, sinks, window))
    return torch.cat(rows)


# context lengths, heads, kv heads, head dim, block size, window
CASES = [
    ([1, 17, 70], 4, 2, 12, 5, 8),
    ([33, 2, 40], 8, 1, 32, 16, 16),
    ([130, 9], 4, 4, 16, 16, 0),
]


def sinks_for(heads: int, seed: int) -> torch.Tensor:
    return nonzero_randn(heads, gen=torch.Generator().manual_seed(seed), scale=2.0)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("lens,heads,kv_heads,head_dim,block_size,window", CASES)
def test_decode_with_sinks_and_window(
    lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    window: int,
    splits: int,
) -> None:
    args = case(lens, heads, kv_heads, head_dim, block_size, torch.float32, seed=7, extra_width=1)
    sinks, scale = sinks_for(heads, len(lens)), head_dim**-0.5
    expected = decode_reference(args, scale, sinks, window)
    triton_out = paged_decode_attention(*args, scale, splits, sinks=sinks, window=window)
    assert rel_err(triton_out, expected) < 1e-5
    torch_out = decode_attention_torch(*args, scale, sinks, window)
    assert rel_err(torch_out, expected) < 1e-5
    without = decode_attention_torch(*args, scale)
    assert rel_err(without, expected) > 1e-3, "the sinks and window changed nothing"


def test_window_alone_and_backends_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    args = case([20, 7, 31], 4, 2, 16, 4, torch.float32, seed=2, extra_width=2)
    expected = decode_reference(args, 0.25, None, 6)
    for backend in ("triton", "torch"):
        monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", backend)
        assert rel_err(decode_attention(*args, 0.25, None, 6), expected) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sinks(dtype: torch.dtype) -> None:
    args = case([5, 47, 90], 8, 2, 16, 16, dtype, seed=3)
    sinks = sinks_for(8, 1)
    expected = decode_reference(tuple(a.float() for a in args[:3]) + args[3:], 0.25, sinks, 32)
    for splits in (1, 2):
        out = paged_decode_attention(*args, 0.25, splits, sinks=sinks, window=32)
        assert out.dtype == dtype
        assert rel_err(out, expected) < 1e-2


@pytest.mark.parametrize("window", [0, 1, 6])
def test_prefill_with_sinks_and_window(window: int) -> None:
    """A chunk of 9 queries at positions 14..22 over 23 cached tokens in blocks of 4."""
    gen = torch.Generator().manual_seed(window)
    heads, kv_heads, head_dim, block, ctx, n = 6, 2, 8, 4, 23, 9
    k_cache = nonzero_randn(12, block, kv_heads, head_dim, gen=gen)
    v_cache = nonzero_randn(12, block, kv_heads, head_dim, gen=gen)
    table = torch.randperm(12, generator=gen)[: -(-ctx // block)].to(DEVICE)
    q = nonzero_randn(n, heads, head_dim, gen=gen)
    sinks = sinks_for(heads, window)
    k, v = gathered(k_cache, table, ctx), gathered(v_cache, table, ctx)
    expected = naive(q, k, v, list(range(ctx - n, ctx)), 0.3, sinks, window)
    out = prefill_attention(q, k_cache, v_cache, table, ctx, 0.3, sinks, window)
    assert rel_err(out, expected) < 1e-5
    plain = prefill_attention(q, k_cache, v_cache, table, ctx, 0.3, None, window)
    assert rel_err(plain, naive(q, k, v, list(range(ctx - n, ctx)), 0.3, None, window)) < 1e-5
