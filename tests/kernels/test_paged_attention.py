"""The Triton paged decode attention equals the torch reference over gathered blocks."""

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err

from kernels import attn_backend, decode_attention, decode_attention_torch
from kernels.triton_attention import paged_decode_attention

NUM_BLOCKS = 48


def case(
    lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    extra_width: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Random q and caches; each sequence gets distinct random blocks, tables padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, block_size, kv_heads, head_dim)
    k_cache = nonzero_randn(*shape, gen=gen, dtype=dtype)
    v_cache = nonzero_randn(*shape, gen=gen, dtype=dtype)
    width = max(-(-n // block_size) for n in lens) + extra_width
    tables = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(lens):
        need = -(-n // block_size)
        tables[i, :need] = torch.randperm(NUM_BLOCKS, generator=gen)[:need]
    q = nonzero_randn(len(lens), heads, head_dim, gen=gen, dtype=dtype)
    return q, k_cache, v_cache, tables.to(DEVICE), torch.tensor(lens, device=DEVICE)


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return decode_attention_torch(q.float(), k_cache.float(), v_cache.float(), tables, lens, scale)


# context lengths, heads, kv heads, head dim, block size, splits
CASES = [
    ([1, 17, 70], 4, 2, 12, 5, 1),
    ([33, 2], 8, 1, 32, 16, 1),
    ([130], 4, 4, 16, 16, 3),
    ([9, 64, 100, 1], 6, 2, 20, 8, 4),
]


@pytest.mark.parametrize("lens,heads,kv_heads,head_dim,block_size,splits", CASES)
def test_fp32_matches_reference(
    lens: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int, splits: int
) -> None:
    args = case(
        lens, heads, kv_heads, head_dim, block_size, torch.float32, seed=len(lens), extra_width=1
    )
    scale = head_dim**-0.5
    out = paged_decode_attention(*args, scale, num_splits=splits)
    assert out.shape == args[0].shape
    assert rel_err(out, reference(*args, scale)) < 1e-5


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_reference(dtype: torch.dtype, splits: int) -> None:
    args = case([5, 47, 90], 8, 2, 16, 16, dtype, seed=3)
    out = paged_decode_attention(*args, 0.25, num_splits=splits)
    assert out.dtype == dtype
    assert rel_err(out, reference(*args, 0.25)) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_half_precision_is_float32_rounded(dtype: torch.dtype) -> None:
    """On the CPU the torch backend computes half-precision decode attention in float32."""
    args = case([5, 47, 90, 1], 8, 2, 16, 16, dtype, seed=4, extra_width=2)
    args = tuple(a.cpu() for a in args)
    out = decode_attention_torch(*args, 0.25)
    assert out.dtype == dtype
    assert torch.equal(out, reference(*args, 0.25).to(dtype))


def test_splits_past_the_context_are_ignored() -> None:
    args = case([3, 40], 4, 2, 16, 4, torch.float32, seed=9, extra_width=6)
    out = paged_decode_attention(*args, 0.3, num_splits=8)
    assert rel_err(out, reference(*args, 0.3)) < 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_backends_agree(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    args = case([20, 7], 4, 2, 16, 8, torch.float32, seed=2)
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", backend)
    assert attn_backend(DEVICE) == backend
    assert rel_err(decode_attention(*args, 0.25), reference(*args, 0.25)) < 1e-5


def test_backend_default_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESCOPE_ATTN_BACKEND", raising=False)
    assert attn_backend(torch.device("cpu")) == "torch"
    assert attn_backend(torch.device("cuda")) == "triton"
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", "loop")
    with pytest.raises(ValueError, match="MOESCOPE_ATTN_BACKEND"):
        attn_backend(DEVICE)
