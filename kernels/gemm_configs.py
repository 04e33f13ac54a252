"""Block sizes for the Triton grouped GEMM: a committed per-shape table, else a heuristic.

The table (configs/grouped_gemm.json) is keyed by device name, then by the expert shape
`e{experts}_h{hidden}_i{intermediate}`, then by a token bucket: the grouped GEMM's rows
(tokens x top-k) rounded up to a power of two. `python -m kernels.autotune` fills it on the
device in use. A lookup takes the nearest bucket of the shape's entry.
"""

import json
import math
import os
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from kernels.triton_env import interpreting

TABLE_PATH = Path(__file__).resolve().parent / "configs" / "grouped_gemm.json"
INTERPRETER = "interpreter"


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes and launch options of one grouped-GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoEConfig:
    """One config per projection: the fused gate/up launch and the down launch."""

    gate_up: GemmConfig
    down: GemmConfig

    def to_json(self) -> dict[str, Any]:
        return {"gate_up": asdict(self.gate_up), "down": asdict(self.down)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "MoEConfig":
        return MoEConfig(GemmConfig(**d["gate_up"]), GemmConfig(**d["down"]))


def table_path() -> Path:
    """The table file: MOESCOPE_GEMM_CONFIGS if set, else the committed one."""
    return Path(os.environ.get("MOESCOPE_GEMM_CONFIGS", TABLE_PATH))


def device_name(device: torch.device) -> str:
    """The table's device key: the CUDA device's name, or `interpreter`."""
    return INTERPRETER if interpreting() else torch.cuda.get_device_name(device)


def shape_key(experts: int, hidden: int, inter: int) -> str:
    return f"e{experts}_h{hidden}_i{inter}"


def token_bucket(rows: int) -> int:
    """Rows of the grouped GEMM rounded up to a power of two."""
    return 1 << max(0, rows - 1).bit_length()


def load_table(path: Path) -> dict[str, Any]:
    """The whole table ({"devices": {device: {shape: {bucket: config}}}})."""
    return json.loads(path.read_text()) if path.exists() else {"devices": {}}


def save_table(path: Path, table: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    _entries.cache_clear()


@cache
def _entries(path: str, device: str, shape: str) -> dict[int, MoEConfig]:
    """One shape's buckets, read once per process (save_table forgets them)."""
    entry = load_table(Path(path))["devices"].get(device, {}).get(shape, {})
    return {int(b): MoEConfig.from_json(c) for b, c in entry.items()}


def default_config(rows: int, experts: int, dtype: torch.dtype, interpret: bool) -> MoEConfig:
    """Heuristic blocks from the mean rows per expert (small tiles for decode-sized groups)."""
    per_expert = rows / experts
    if interpret:  # few, large programs: the interpreter's cost is per program and per op
        wide = GemmConfig(16 if per_expert <= 16 else 32, 128, 128, group_m=1)
        return MoEConfig(wide, wide)
    block_m = next((m for m, most in ((16, 16), (32, 32), (64, 96)) if per_expert <= most), 128)
    block_k = 32 if dtype == torch.float32 else 64
    big = block_m >= 64
    warps, stages = (8, 3) if big else (4, 4)
    gate_up_n = 32 if block_m == 16 else 64  # decode: more column tiles keep every SM busy
    gate_up = GemmConfig(block_m, gate_up_n, block_k, num_warps=warps, num_stages=stages)
    down = GemmConfig(block_m, 128 if big else 64, block_k, num_warps=warps, num_stages=stages)
    return MoEConfig(gate_up, down)


def lookup(
    device: torch.device, experts: int, hidden: int, inter: int, rows: int, dtype: torch.dtype
) -> MoEConfig:
    """The table's config for the nearest token bucket of this shape, else the heuristic."""
    entries = _entries(str(table_path()), device_name(device), shape_key(experts, hidden, inter))
    if not entries:
        return default_config(rows, experts, dtype, interpreting())
    target = math.log2(token_bucket(rows))
    return entries[min(entries, key=lambda b: (abs(math.log2(b) - target), b))]
