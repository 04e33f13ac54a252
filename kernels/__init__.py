"""Compute kernels for moescope: expert grouped GEMM and paged attention.

Triton kernels (kernels.triton_moe, kernels.triton_attention, kernels.triton_mla) with
plain-torch references (kernels.grouped_gemm, kernels.paged_attention, kernels.mla_attention);
kernels.backend picks one per call.
"""

from kernels import triton_env  # noqa: F401  (first: settles TRITON_INTERPRET, see there)
from kernels.backend import (
    attn_backend,
    decode_attention,
    mla_decode,
    moe_backend,
    moe_experts,
)
from kernels.grouped_gemm import combine_experts, expert_ffn, expert_ffn_loop
from kernels.mla_attention import mla_decode_torch
from kernels.paged_attention import decode_attention_torch, prefill_attention, write_kv
from kernels.swiglu import ExpertTerms

__all__ = [
    "ExpertTerms",
    "attn_backend",
    "combine_experts",
    "decode_attention",
    "decode_attention_torch",
    "expert_ffn",
    "expert_ffn_loop",
    "mla_decode",
    "mla_decode_torch",
    "moe_backend",
    "moe_experts",
    "prefill_attention",
    "write_kv",
]
