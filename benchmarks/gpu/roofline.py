"""The card's ceilings: device-to-device copy bandwidth and the bf16 matmul rate.

python -m benchmarks.gpu.roofline --json out.json [--dry-run]
"""

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.bench_util import pick_device, save, time_ms
from benchmarks.harness.machine import measure


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s counting bytes read and bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / ms / 1e6


def matmul_tflops(device: torch.device, n: int) -> float:
    """Dense bf16 n x n x n products, on random data."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b, device)
    return 2 * n**3 / ms / 1e9


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure the ceilings; with them, the machine (`machine.measure`) for the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    args = p.parse_args(argv)
    device = pick_device(args.dry_run)
    nbytes, n = (1 << 22, 128) if args.dry_run else (1 << 31, 8192)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "copy_gbps": copy_bandwidth(device, nbytes),
        "matmul_tflops": matmul_tflops(device, n),
        "machine": measure(),
    }
    print(
        f"{result['device']}: copy {result['copy_gbps']:.0f} GB/s (read + written), "
        f"bf16 matmul {result['matmul_tflops']:.1f} TFLOP/s"
    )
    save(args.json, result)
    return result


if __name__ == "__main__":
    main()
