"""What the Triton kernels share: operand types for tl.dot and the cast of results.

Two interpreter gaps are bridged here, both only while interpreting: numpy holds bf16 as
uint16, so the interpreter can neither multiply bf16 nor round fp32 to bf16 (its cast
truncates). bf16 operands therefore go to fp32 for tl.dot (the same products: a bf16 product
is exact in fp32, and the GPU accumulates in fp32 too), and results are rounded to nearest
even by hand.
"""

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.triton_env import interpreting


@dataclass(frozen=True)
class Launch:
    """A kernel with its grid and arguments: call it to run, or compile it (compile_check)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    meta: dict[str, Any]

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)


def dot_types(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """(operand type, input precision) for tl.dot on inputs of `dtype`; fp32 is exact IEEE."""
    if dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting()):
        return tl.float32, "ieee"
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype], "tf32"


def rounds_by_hand(dtype: torch.dtype) -> bool:
    """Whether fp32 -> `dtype` results need `to_output`'s hand rounding."""
    return dtype == torch.bfloat16 and interpreting()


@triton.jit
def to_output(x, dtype: tl.constexpr, ROUND_BY_HAND: tl.constexpr):
    """Cast fp32 `x` to `dtype`, rounding to nearest even."""
    if ROUND_BY_HAND:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)
