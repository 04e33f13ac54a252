"""Compute kernels for moescope: expert grouped GEMM and paged attention, with torch references."""

from kernels.backend import moe_backend
from kernels.grouped_gemm import expert_ffn, expert_ffn_loop
from kernels.paged_attention import decode_attention, prefill_attention, write_kv

__all__ = [
    "decode_attention",
    "expert_ffn",
    "expert_ffn_loop",
    "moe_backend",
    "prefill_attention",
    "write_kv",
]
