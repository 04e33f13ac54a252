"""Backend selection, in one place, for the expert computation and for decode attention.

Default: Triton for CUDA tensors (when triton is installed); on the CPU, the native grouped
GEMM (kernels.native_moe) when it builds, else oneDNN for float32 (kernels.onednn_moe) and
torch otherwise.
MOESCOPE_MOE_BACKEND=triton|torch|native|onednn|loop and MOESCOPE_ATTN_BACKEND=triton|torch
override it; they are read at every call. `triton` on CPU tensors runs in Triton's
interpreter (slowly but exactly; see kernels.triton_env for how TRITON_INTERPRET is set).
"""

import importlib.util
import os
from functools import cache
from typing import Literal

import torch

import kernels.native_moe as native_moe
import kernels.onednn_moe as onednn_moe
from kernels.grouped_gemm import combine_experts, expert_ffn, expert_ffn_loop
from kernels.mla_attention import mla_decode_torch
from kernels.paged_attention import decode_attention_torch
from kernels.swiglu import ExpertTerms

MoEBackend = Literal["triton", "torch", "native", "onednn", "loop"]
AttnBackend = Literal["triton", "torch"]
MOE_BACKENDS: tuple[str, ...] = ("triton", "torch", "native", "onednn", "loop")
FFNS = {
    "torch": expert_ffn,
    "native": native_moe.expert_ffn_native,
    "onednn": onednn_moe.expert_ffn_onednn,
    "loop": expert_ffn_loop,
}
ATTN_BACKENDS: tuple[str, ...] = ("triton", "torch")


@cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _choose(var: str, allowed: tuple[str, ...], device: torch.device, cpu: str = "torch") -> str:
    """`var`'s backend if set (checked against `allowed`), else Triton on CUDA and `cpu`."""
    name = os.environ.get(var)
    if name is None:
        return "triton" if device.type == "cuda" and triton_installed() else cpu
    if name not in allowed:
        raise ValueError(f"{var}={name!r}; expected one of {allowed}")
    return name


def cpu_moe_backend(dtype: torch.dtype) -> MoEBackend:
    """The CPU's default for `dtype` experts. oneDNN is the fallback for float32 only: for
    bf16, grouped_mm is as fast (RESULTS.md)."""
    if dtype in native_moe.DTYPES and native_moe.available():
        return "native"
    return "onednn" if dtype == torch.float32 and onednn_moe.available() else "torch"


def moe_backend(device: torch.device, dtype: torch.dtype) -> MoEBackend:
    """The MoE backend for `dtype` tensors on `device` (MOESCOPE_MOE_BACKEND overrides)."""
    cpu = cpu_moe_backend(dtype) if device.type == "cpu" else "torch"
    return _choose("MOESCOPE_MOE_BACKEND", MOE_BACKENDS, device, cpu)  # type: ignore[return-value]


def attn_backend(device: torch.device) -> AttnBackend:
    """The decode-attention backend for tensors on `device` (MOESCOPE_ATTN_BACKEND overrides)."""
    return _choose("MOESCOPE_ATTN_BACKEND", ATTN_BACKENDS, device)  # type: ignore[return-value]


def moe_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    order: torch.Tensor,
    per_expert: torch.Tensor,
    weights: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """Routed expert output [T, H] in token order, on the selected backend.

    order [N]: flat pair ids (token * top_k + j) sorted by expert; per_expert [E]: rows per
    expert; weights [T, top_k] float32 router weights; terms: biases and clamped SwiGLU.
    """
    backend = moe_backend(x.device, x.dtype)
    if backend == "triton":
        from kernels.triton_moe import fused_moe

        return fused_moe(x, w_gate_up, w_down, order, per_expert, weights, terms=terms)
    ffn = FFNS[backend]
    return combine_experts(x, w_gate_up, w_down, order, per_expert, weights, ffn, terms)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """One query token per sequence over the paged cache, on the selected backend (sinks and
    window: kernels.paged_attention)."""
    args = (q, k_cache, v_cache, block_tables, context_lens, scale)
    if attn_backend(q.device) == "triton":
        from kernels.triton_attention import paged_decode_attention

        return paged_decode_attention(*args, sinks=sinks, window=window)
    return decode_attention_torch(*args, sinks, window)


def mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """MLA decode over the paged latent cache, in latent space (kernels.mla_attention), on
    the decode-attention backend."""
    args = (q_latent, q_pe, cache, block_tables, context_lens, scale)
    if attn_backend(q_latent.device) == "triton":
        from kernels.triton_mla import mla_decode_attention

        return mla_decode_attention(*args)
    return mla_decode_torch(*args)
