"""Shared by the GPU benchmark scripts: device choice, timing, JSON files."""

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def pick_device(dry_run: bool) -> torch.device:
    """CUDA, or the CPU for a dry run (tiny shapes, Triton in its interpreter)."""
    if dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before kernels imports triton
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --dry-run to exercise the script on the CPU")
    return torch.device("cuda")


def time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds per call: triton's do_bench on CUDA (L2 flushed between calls), else one
    timed call after a warm-up (dry runs only check that the script works)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=50))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def save(path: Path | None, obj: Any) -> None:
    """Write obj as JSON when a path is given."""
    if path is not None:
        path.write_text(json.dumps(obj, indent=1) + "\n")


def load(path: Path) -> Any:
    return json.loads(path.read_text())
