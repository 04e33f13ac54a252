"""Compute kernels for moescope: expert grouped GEMM and paged attention.

Triton kernels (kernels.triton_moe, kernels.triton_attention) with plain-torch references
(kernels.grouped_gemm, kernels.paged_attention); kernels.backend picks one per call.
"""

from kernels import triton_env  # noqa: F401  (first: settles TRITON_INTERPRET, see there)
from kernels.backend import attn_backend, decode_attention, moe_backend, moe_experts
from kernels.grouped_gemm import combine_experts, expert_ffn, expert_ffn_loop
from kernels.paged_attention import decode_attention_torch, prefill_attention, write_kv

__all__ = [
    "attn_backend",
    "combine_experts",
    "decode_attention",
    "decode_attention_torch",
    "expert_ffn",
    "expert_ffn_loop",
    "moe_backend",
    "moe_experts",
    "prefill_attention",
    "write_kv",
]
