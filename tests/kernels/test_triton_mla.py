"""The Triton MLA decode kernel equals the torch reference over the paged latent cache, and
the absorbed latent attention equals attention over latents expanded to per-head K and V."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err

from kernels import mla_decode, mla_decode_torch
from kernels.triton_mla import mla_decode_attention

NUM_BLOCKS = 40
Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def case(
    lens: list[int],
    heads: int,
    rank: int,
    rope: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    extra_width: int = 1,
) -> Case:
    """Random absorbed and rope queries and a latent cache; each sequence gets distinct random
    blocks, tables padded with block 0 (and `extra_width` columns past the longest)."""
    gen = torch.Generator().manual_seed(seed)
    cache = nonzero_randn(NUM_BLOCKS, block_size, rank + rope, gen=gen, dtype=dtype)
    width = max(-(-n // block_size) for n in lens) + extra_width
    tables = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(lens):
        need = -(-n // block_size)
        tables[i, :need] = torch.randperm(NUM_BLOCKS, generator=gen)[:need]
    q_latent = nonzero_randn(len(lens), heads, rank, gen=gen, scale=0.2, dtype=dtype)
    q_pe = nonzero_randn(len(lens), heads, rope, gen=gen, scale=0.2, dtype=dtype)
    return q_latent, q_pe, cache, tables.to(DEVICE), torch.tensor(lens, device=DEVICE)


def reference(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return mla_decode_torch(q_latent.float(), q_pe.float(), cache.float(), tables, lens, scale)


# context lengths, heads, kv_lora_rank, rope dim, block size, splits
CASES = [
    ([1, 17, 70], 3, 40, 8, 16, 1),  # rank not a power of two, ragged contexts
    ([33, 2], 20, 24, 16, 5, 1),  # two head tiles, the second part-full; block size 5
    ([130], 4, 48, 12, 16, 3),  # split-K over one long context
    ([9, 64, 100, 1], 17, 36, 4, 8, 4),  # splits past some contexts; rope narrower than 16
    ([31, 6], 2, 72, 8, 1, 2),  # one position per block
    ([45, 20], 16, 512, 64, 16, 2),  # DeepSeek's own widths: 512 + 64
]


@pytest.mark.parametrize("lens,heads,rank,rope,block_size,splits", CASES)
def test_fp32_matches_reference(
    lens: list[int], heads: int, rank: int, rope: int, block_size: int, splits: int
) -> None:
    args = case(lens, heads, rank, rope, block_size, torch.float32, seed=len(lens) + heads)
    scale = (rank + rope) ** -0.5
    out = mla_decode_attention(*args, scale, num_splits=splits)
    assert out.shape == args[0].shape and out.dtype == torch.float32
    assert rel_err(out, reference(*args, scale)) < 1e-5


@pytest.mark.parametrize("splits", [1, 2])
def test_bf16_matches_reference(splits: int) -> None:
    args = case([5, 47, 90], 18, 40, 8, 16, torch.bfloat16, seed=3)
    out = mla_decode_attention(*args, 0.1, num_splits=splits)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, reference(*args, 0.1)) < 1e-2


def test_a_padding_row_stays_finite() -> None:
    """Decode graphs pad a batch with rows of context 0: they must not poison the output."""
    args = case([12, 1], 4, 24, 8, 16, torch.float32, seed=5)
    lens = torch.tensor([12, 0], device=DEVICE)
    for splits in (1, 2):
        out = mla_decode_attention(*args[:4], lens, 0.2, num_splits=splits)
        assert torch.isfinite(out).all()
        assert rel_err(out[:1], reference(*args[:4], lens, 0.2)[:1]) < 1e-5


def test_absorbed_equals_expanded_attention() -> None:
    """Attention in latent space, projected through kv_b_proj's value half, is attention with
    per-head keys [W_k latent, k_pe] and values W_v latent: what the absorption relies on."""
    heads, nope, v_dim, rank, rope = 3, 12, 10, 40, 8
    q_latent, q_pe, cache, tables, lens = case([7, 30], heads, rank, rope, 16, torch.float32, 6)
    gen = torch.Generator().manual_seed(7)
    w_k = nonzero_randn(heads, nope, rank, gen=gen, scale=0.2)
    w_v = nonzero_randn(heads, v_dim, rank, gen=gen, scale=0.2)
    q_nope = nonzero_randn(2, heads, nope, gen=gen)
    q_latent = torch.einsum("bhn,hnl->bhl", q_nope, w_k)
    scale = (nope + rope) ** -0.5
    ours = mla_decode_attention(q_latent, q_pe, cache, tables, lens, scale, num_splits=2)
    ours = torch.einsum("bhl,hvl->bhv", ours, w_v)
    for b, n in enumerate(lens.tolist()):
        rows = cache[tables[b]].flatten(0, 1)[:n]
        latent, k_pe = rows.split([rank, rope], dim=-1)
        k = torch.cat(
            [torch.einsum("hnl,sl->hsn", w_k, latent), k_pe.expand(heads, n, rope)], dim=-1
        )
        v = torch.einsum("hvl,sl->hsv", w_v, latent)
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).unsqueeze(1)  # [H, 1, nope + rope]
        probs = ((q @ k.transpose(1, 2)) * scale).softmax(-1)
        assert rel_err(ours[b], (probs @ v).squeeze(1)) < 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_backends_agree(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    args = case([20, 7], 4, 24, 8, 8, torch.float32, seed=2)
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", backend)
    assert rel_err(mla_decode(*args, 0.25), reference(*args, 0.25)) < 1e-5


def test_engine_decodes_through_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DeepSeek-V2-Lite-shaped preset on the Triton attention backend decodes through the
    MLA kernel and generates the torch backend's tokens, with the same log-probabilities."""
    import kernels.triton_mla
    from engine import LLM, SamplingParams

    calls = 0
    kernel = kernels.triton_mla.mla_decode_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(kernels.triton_mla, "mla_decode_attention", counted)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)
    prompts = [list(range(3, 30)), [5, 9, 3]]
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", backend)
        llm = LLM(model="synthetic:dsv2-lite", device=str(DEVICE), num_kv_blocks=16, block_size=8)
        outs[backend] = llm.generate(prompts, params, use_tqdm=False)
        assert (calls > 0) == (backend == "triton")
    for a, b in zip(outs["torch"], outs["triton"], strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 5
        assert a.logprobs is not None and b.logprobs is not None
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t] - pb[t]) < 1e-4 for t in pa)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, run_all.sh runs it for real")
def test_benchmark_dry_run(tmp_path: Path) -> None:
    """benchmarks/gpu/mla_decode.py runs on the CPU and its kernel agrees with the expanded
    path (bf16, so the bound is loose)."""
    from benchmarks.gpu import mla_decode

    rows = mla_decode.main(["--dry-run", "--json", str(tmp_path / "mla.json")])
    assert json.loads((tmp_path / "mla.json").read_text()) == rows
    assert [(r["name"], r["batch"], r["ctx"]) for r in rows] == [("deepseek-v3", 2, 37)]
    assert set(rows[0]["ms"]) == {"triton", "absorbed", "expanded", "triton_again"}
    assert all(v > 0 for v in rows[0]["ms"].values()) and rows[0]["rel_err"] < 2e-2
