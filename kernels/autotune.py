"""Fill the grouped-GEMM block-size table on the device in use.

    python -m kernels.autotune --experts 8 --hidden 4096 --inter 14336 --top-k 2 \
        --tokens 1 16 64 256 1024 4096

For each token count it routes random tokens uniformly, times every candidate config of the
fused gate/up launch and then of the down launch, and writes the fastest pair into the table
(kernels/configs/grouped_gemm.json, or --table / MOESCOPE_GEMM_CONFIGS) under this device's
name, the expert shape and the token bucket. Without CUDA it tunes the interpreter (useful
only to check the command itself).
"""

import argparse
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton

from kernels.gemm_configs import (
    GemmConfig,
    MoEConfig,
    device_name,
    load_table,
    save_table,
    shape_key,
    table_path,
    token_bucket,
)
from kernels.triton_env import interpreting
from kernels.triton_moe import gemm_launch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def candidates(rows: int, experts: int, quick: bool) -> list[GemmConfig]:
    """Block shapes worth trying: BLOCK_M up to twice the mean rows per expert."""
    limit = max(16, 2 * triton.next_power_of_2(max(1, rows // experts)))
    block_m = [m for m in (16, 32, 64, 128) if m <= limit]
    small = (32,) if block_m[0] == 16 else ()
    block_n, block_k = ((*small, 64, 128), (64,)) if quick else ((*small, 64, 128, 256), (64, 128))
    warps, stages = ((4, 8), (3, 4)) if quick else ((4, 8), (3, 4, 5))
    return [
        GemmConfig(m, n, k, 8, w, s)
        for m, n, k, w, s in itertools.product(block_m, block_n, block_k, warps, stages)
    ]


def measure(fn: Callable[[], None]) -> float:
    """Milliseconds per call: do_bench on the GPU, one timed call in the interpreter."""
    if not interpreting():
        return float(triton.testing.do_bench(fn, warmup=5, rep=25))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def fastest(configs: Sequence[GemmConfig], run: Callable[[GemmConfig], None]) -> GemmConfig:
    """The config with the lowest time; configs that fail to compile or launch are skipped."""
    best, best_ms = None, float("inf")
    for cfg in configs:
        try:
            ms = measure(functools.partial(run, cfg))
        except Exception as err:  # noqa: BLE001 - out of shared memory or registers on this device
            print(f"  skip {cfg}: {type(err).__name__}")
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    if best is None:
        raise RuntimeError("no candidate config ran")
    print(f"  {best} {best_ms:.4f} ms")
    return best


def tune(
    experts: int,
    hidden: int,
    inter: int,
    top_k: int,
    tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    quick: bool,
    max_candidates: int | None,
) -> MoEConfig:
    """The fastest gate/up config, then the fastest down config, for one token count."""
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(device, dtype)
    w_gate_up = (torch.randn(experts, hidden, 2 * inter, generator=gen) * hidden**-0.5).to(
        device, dtype
    )
    w_down = (torch.randn(experts, inter, hidden, generator=gen) * inter**-0.5).to(device, dtype)
    ids = torch.rand(tokens, experts, generator=gen).topk(top_k, -1).indices.flatten()
    order = torch.sort(ids, stable=True).indices.to(device)
    offsets = torch.cumsum(torch.bincount(ids, minlength=experts), 0).to(device)
    weights = torch.rand(tokens * top_k, generator=gen).to(device)
    rows = order.numel()
    act = torch.empty(rows, inter, dtype=dtype, device=device)
    out = torch.empty(rows, hidden, dtype=dtype, device=device)  # pair ids are < rows
    configs = candidates(rows, experts, quick)[:max_candidates]
    print(f"tokens {tokens}: gate/up over {len(configs)} configs")
    gate_up = fastest(
        configs, lambda c: gemm_launch(c, x, w_gate_up, act, offsets, order, None, inter, top_k)()
    )
    print(f"tokens {tokens}: down over {len(configs)} configs")
    down = fastest(
        configs,
        lambda c: gemm_launch(c, act, w_down, out, offsets, order, weights, hidden, top_k)(),
    )
    return MoEConfig(gate_up, down)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, object]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--inter", type=int, required=True, help="expert intermediate size")
    p.add_argument("--top-k", type=int, required=True)
    p.add_argument("--tokens", type=int, nargs="+", required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--table", type=Path, default=None, help="default: the committed table")
    p.add_argument("--quick", action="store_true", help="a smaller candidate space")
    p.add_argument("--max-candidates", type=int, default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = args.table or table_path()
    entries: dict[str, dict[str, object]] = {}
    for tokens in args.tokens:
        cfg = tune(
            args.experts,
            args.hidden,
            args.inter,
            args.top_k,
            tokens,
            DTYPES[args.dtype],
            device,
            args.quick,
            args.max_candidates,
        )
        entries[str(token_bucket(tokens * args.top_k))] = cfg.to_json()
    table = load_table(path)
    shapes = table.setdefault("devices", {}).setdefault(device_name(device), {})
    shapes.setdefault(shape_key(args.experts, args.hidden, args.inter), {}).update(entries)
    save_table(path, table)
    print(f"wrote {len(entries)} entries for {device_name(device)} to {path}")
    return entries


if __name__ == "__main__":
    main()
