"""Our Triton MoE kernel against torch grouped_mm and a per-expert torch loop.

    python -m benchmarks.gpu.moe_kernels --roofline roofline.json --json moe.json [--dry-run]

Each implementation computes the whole routed expert output from the same inputs (tokens,
expert order, router weights): gather by expert, gate/up, SiLU-and-multiply, down, weight,
scatter back. Shapes: Mixtral-like (8 experts, top-2, hidden 4096, intermediate 14336) and
fine-grained (128 experts, top-8, hidden 2048, intermediate 768), bf16, uniform random
routing, at decode-sized and prefill-sized token counts.
"""

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.bench_util import load, pick_device, save, time_ms


@dataclass(frozen=True)
class Shape:
    name: str
    experts: int
    top_k: int
    hidden: int
    inter: int


SHAPES = [Shape("mixtral", 8, 2, 4096, 14336), Shape("fine-grained", 128, 8, 2048, 768)]
DRY_SHAPES = [Shape("mixtral", 8, 2, 64, 112), Shape("fine-grained", 16, 8, 32, 24)]
TOKENS = {"decode": (1, 16, 64), "prefill": (1024, 4096)}
DRY_TOKENS = {"decode": (3,), "prefill": (24,)}


def inputs(shape: Shape, tokens: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """bf16 tokens and experts, float32 router weights, pairs ordered by expert."""
    gen = torch.Generator().manual_seed(tokens)
    e, h, i = shape.experts, shape.hidden, shape.inter
    x = torch.randn(tokens, h, generator=gen).to(device, torch.bfloat16)
    w_gate_up = (torch.randn(e, h, 2 * i, generator=gen) * h**-0.5).to(device, torch.bfloat16)
    w_down = (torch.randn(e, i, h, generator=gen) * i**-0.5).to(device, torch.bfloat16)
    probs = torch.softmax(torch.randn(tokens, e, generator=gen), -1)
    weights, ids = probs.topk(shape.top_k, -1)
    flat = ids.flatten()
    order = torch.sort(flat, stable=True).indices.to(device)
    per_expert = torch.bincount(flat, minlength=e).to(device)
    return x, w_gate_up, w_down, order, per_expert, weights.to(device)


def timed(name: str, fn: Callable[[], Any], device: torch.device) -> float | None:
    """time_ms, or None (reported as n/a) where a baseline does not run on this build."""
    try:
        return time_ms(fn, device)
    except (RuntimeError, NotImplementedError) as err:
        if name == "ours":
            raise
        print(f"{name} failed: {str(err).splitlines()[0]}")
        return None


def measure(shape: Shape, phase: str, tokens: int, device: torch.device) -> dict[str, Any]:
    """Times of the three implementations, with the work they do."""
    from kernels.gemm_configs import lookup
    from kernels.grouped_gemm import combine_experts, expert_ffn, expert_ffn_loop
    from kernels.triton_moe import fused_moe

    args = inputs(shape, tokens, device)
    per_expert = args[4]
    rows = tokens * shape.top_k
    impls = {
        "ours": lambda: fused_moe(*args),
        "grouped_mm": lambda: combine_experts(*args, expert_ffn),
        "loop": lambda: combine_experts(*args, expert_ffn_loop),
    }
    ours, ref = impls["ours"](), impls["loop"]()
    err = float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())
    ms = {name: timed(name, fn, device) for name, fn in impls.items()}
    active = int((per_expert > 0).sum())
    cfg = lookup(device, shape.experts, shape.hidden, shape.inter, rows, torch.bfloat16)
    return {
        **asdict(shape),
        "phase": phase,
        "tokens": tokens,
        "rows": rows,
        "active": active,
        "flop": 6 * rows * shape.hidden * shape.inter,
        "weight_bytes": active * 3 * shape.hidden * shape.inter * 2,
        "ms": ms,
        "rel_err": err,
        "config": cfg.to_json(),
    }


def describe(row: dict[str, Any], roof: dict[str, Any]) -> str:
    ms = row["ms"]
    tflops = row["flop"] / ms["ours"] / 1e9
    gbps = row["weight_bytes"] / ms["ours"] / 1e6
    base = ", ".join(
        f"{k} {'n/a' if v is None else f'{v:.3f} ms'}" for k, v in ms.items() if k != "ours"
    )
    return (
        f"{row['name']:>12} {row['phase']:>7} {row['tokens']:>5} tokens: ours "
        f"{ms['ours']:.3f} ms ({tflops:.1f} TFLOP/s = {tflops / roof['matmul_tflops']:.0%}, "
        f"{gbps:.0f} GB/s = {gbps / roof['copy_gbps']:.0%}); {base}; "
        f"rel err {row['rel_err']:.1e}"
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--roofline", type=Path, required=True, help="roofline.py's JSON")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = p.parse_args(argv)
    device = pick_device(args.dry_run)
    roof = load(args.roofline)
    shapes, tokens = (DRY_SHAPES, DRY_TOKENS) if args.dry_run else (SHAPES, TOKENS)
    rows = []
    for shape in shapes:
        for phase, counts in tokens.items():
            for n in counts:
                rows.append(measure(shape, phase, n, device))
                print(describe(rows[-1], roof), flush=True)
                save(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
