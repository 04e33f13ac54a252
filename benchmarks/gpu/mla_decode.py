"""MLA decode attention: our Triton kernel over the latent cache against the torch paths.

    python -m benchmarks.gpu.mla_decode [--json mla.json] [--dry-run]

Each implementation turns the same no-rope and rope queries [B, H, *] and the same paged
latent cache (kv_lora_rank + rope per position, bf16, block size 16) into the attention
output per head [B, H, v_head_dim], as engine/model/mla.py's decode does:
- triton: the query absorbed through kv_b_proj's key half, kernels.triton_mla over the
  latents, the output projected through the value half;
- absorbed: the same with the torch reference (kernels.mla_attention, the CPU's path);
- expanded: the latents gathered and expanded to per-head K and V through kv_b_proj, then
  SDPA (what a cache of expanded K and V would do, minus the memory it needs);
- triton again: an A/A control, whose ratio to the first says what noise looks like.
Shapes: DeepSeek-V3's attention (128 heads) and V2-Lite's (16 heads), kv_lora_rank 512, rope
64, no-rope and value heads 128, at a few batch sizes and context lengths.
"""

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu.bench_util import pick_device, save, time_ms

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    rank: int
    rope: int
    nope: int
    v_dim: int


SHAPES = [Shape("deepseek-v3", 128, 512, 64, 128, 128), Shape("v2-lite", 16, 512, 64, 128, 128)]
DRY_SHAPES = [Shape("deepseek-v3", 20, 40, 8, 12, 10)]
LOADS = [(1, 8192), (16, 2048), (64, 1024)]  # (sequences, context length)
DRY_LOADS = [(2, 37)]


def inputs(shape: Shape, batch: int, ctx: int, device: torch.device) -> dict[str, Any]:
    """bf16 queries, kv_b_proj halves and a latent cache in shuffled blocks."""
    gen = torch.Generator().manual_seed(batch * ctx)
    h, rank = shape.heads, shape.rank
    pages = -(-ctx // BLOCK_SIZE)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=gen) * scale).to(device, torch.bfloat16)

    return {
        "q_nope": randn(batch, h, shape.nope),
        "q_pe": randn(batch, h, shape.rope),
        "w_k": randn(h, shape.nope, rank, scale=rank**-0.5),
        "w_v": randn(h, shape.v_dim, rank, scale=rank**-0.5),
        "cache": randn(batch * pages, BLOCK_SIZE, rank + shape.rope),
        "tables": torch.randperm(batch * pages, generator=gen).view(batch, pages).to(device),
        "lens": torch.full((batch,), ctx, device=device),
        "scale": (shape.nope + shape.rope) ** -0.5,
    }


def absorbed(a: dict[str, Any], attend: Callable[..., torch.Tensor]) -> torch.Tensor:
    q_latent = torch.einsum("bhn,hnl->bhl", a["q_nope"], a["w_k"])
    out = attend(q_latent, a["q_pe"], a["cache"], a["tables"], a["lens"], a["scale"])
    return torch.einsum("bhl,hvl->bhv", out, a["w_v"])


def expanded(a: dict[str, Any]) -> torch.Tensor:
    """Every sequence's latents expanded to per-head K and V (lens are equal here: no mask)."""
    rank = a["w_k"].shape[-1]
    rows = a["cache"][a["tables"]].flatten(1, 2)[:, : int(a["lens"][0])]
    latent, k_pe = rows.split([rank, rows.shape[-1] - rank], dim=-1)
    k_nope = torch.einsum("bsl,hnl->bhsn", latent, a["w_k"])
    k = torch.cat([k_nope, k_pe[:, None].expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
    v = torch.einsum("bsl,hvl->bhsv", latent, a["w_v"])
    q = torch.cat([a["q_nope"], a["q_pe"]], dim=-1).unsqueeze(2)  # [B, H, 1, nope + rope]
    return F.scaled_dot_product_attention(q, k, v, scale=a["scale"]).squeeze(2)


def measure(shape: Shape, batch: int, ctx: int, device: torch.device) -> dict[str, Any]:
    from kernels.mla_attention import mla_decode_torch
    from kernels.triton_mla import mla_decode_attention

    a = inputs(shape, batch, ctx, device)
    impls = {
        "triton": lambda: absorbed(a, mla_decode_attention),
        "absorbed": lambda: absorbed(a, mla_decode_torch),
        "expanded": lambda: expanded(a),
        "triton_again": lambda: absorbed(a, mla_decode_attention),
    }
    ours, ref = impls["triton"]().float(), expanded(a).float()
    err = float((ours - ref).abs().max() / ref.abs().max())
    ms = {name: time_ms(fn, device) for name, fn in impls.items()}
    cache_bytes = batch * ctx * (shape.rank + shape.rope) * 2
    return {
        **asdict(shape),
        "batch": batch,
        "ctx": ctx,
        "cache_bytes": cache_bytes,
        "ms": ms,
        "rel_err": err,
    }


def describe(row: dict[str, Any]) -> str:
    ms = row["ms"]
    gbps = row["cache_bytes"] / ms["triton"] / 1e6
    others = ", ".join(f"{k} {v:.3f} ms ({v / ms['triton']:.2f}x)" for k, v in ms.items())
    return (
        f"mla {row['name']:>11} {row['batch']:>3} x {row['ctx']:>5}: {others}; triton reads "
        f"{gbps:.0f} GB/s of latents; rel err {row['rel_err']:.1e}"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = p.parse_args(argv)
    device = pick_device(args.dry_run)
    shapes, loads = (DRY_SHAPES, DRY_LOADS) if args.dry_run else (SHAPES, LOADS)
    rows = []
    for shape in shapes:
        for batch, ctx in loads:
            rows.append(measure(shape, batch, ctx, device))
            print(describe(rows[-1]), flush=True)
            save(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
