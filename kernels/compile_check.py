"""Compile every Triton kernel for a GPU target without a GPU, and report what came out.

    TRITON_INTERPRET=0 python -m kernels.compile_check [--arch 90]

Builds each launch the engine makes (grouped GEMM: gated and down, decode- and prefill-sized
configs, and gpt-oss's with biases and the clamped SwiGLU; decode attention: one split and
several, and gpt-oss's with sinks and a sliding window; DeepSeek's MLA decode over the
latent cache: one split and several) on meta tensors, specialises its arguments
as the JIT would (integers equal to 1 become constants, pointers and multiples of 16 are
marked divisible by 16), compiles it down to the GPU binary with Triton's bundled ptxas, and
prints the shared memory it needs and whether its loads became asynchronous copies (the sign
that the main loop was software-pipelined). Exits non-zero if any kernel fails to compile.
"""

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.gemm_configs import default_config
from kernels.triton_attention import decode_launch
from kernels.triton_common import Launch
from kernels.triton_env import interpreting
from kernels.triton_mla import mla_decode_launch
from kernels.triton_moe import gemm_launch

POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int32: "*i32",
    torch.int64: "*i64",
}
OPTIONS = ("num_warps", "num_stages")


def _source(launch: Launch) -> ASTSource:
    """The launch's kernel with its arguments specialised as triton's JIT would."""
    fn = launch.kernel
    names = fn.arg_names
    constexprs = {k: v for k, v in launch.meta.items() if k not in OPTIONS}
    signature: dict[str, str] = {}
    values: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    args = iter(launch.args)
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name], values[(i,)] = "constexpr", constexprs[name]
            continue
        arg = next(args)
        if isinstance(arg, torch.Tensor):
            signature[name] = POINTER_TYPES[arg.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(arg, bool | float):
            signature[name] = "fp32"
        elif arg == 1:
            signature[name], values[(i,)] = "constexpr", 1
        else:
            signature[name] = "i32" if -(2**31) <= arg < 2**31 else "i64"
            if arg % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, signature, constexprs=values, attrs=attrs)


def compile_launch(launch: Launch, arch: int) -> dict[str, Any]:
    """Compile for sm_{arch}: shared bytes and the count of asynchronous copies."""
    options = {k: launch.meta[k] for k in OPTIONS if k in launch.meta}
    kernel = triton.compile(_source(launch), target=GPUTarget("cuda", arch, 32), options=options)
    ttgir = kernel.asm["ttgir"]
    copies = ttgir.count("async_copy_global_to_local") + ttgir.count("async_tma_copy")
    return {"shared": kernel.metadata.shared, "async_copies": copies}


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def moe_launches(
    experts: int,
    hidden: int,
    inter: int,
    top_k: int,
    tokens: int,
    dtype: torch.dtype,
    terms: bool = False,
) -> list[tuple[str, Launch]]:
    """The gated and the down launch of one MoE layer call, with the heuristic config (terms:
    with expert biases and the clamped SwiGLU, as gpt-oss)."""
    rows = tokens * top_k
    cfg = default_config(rows, experts, dtype, interpret=False)
    offsets = _meta(experts, dtype=torch.int64)
    pairs = _meta(rows, dtype=torch.int64)
    x, act = _meta(tokens, hidden, dtype=dtype), _meta(rows, inter, dtype=dtype)
    out = _meta(rows, hidden, dtype=dtype)
    name = f"moe e{experts} h{hidden} i{inter} k{top_k} t{tokens} {dtype}"
    b_gate_up, b_down, limit = (
        (_meta(experts, 2 * inter, dtype=dtype), _meta(experts, hidden, dtype=dtype), 7.0)
        if terms
        else (None, None, None)
    )
    name += " +terms" if terms else ""
    return [
        (
            f"{name} gate_up",
            gemm_launch(
                cfg.gate_up,
                x,
                _meta(experts, hidden, 2 * inter, dtype=dtype),
                act,
                offsets,
                pairs,
                None,
                inter,
                top_k,
                b_gate_up,
                limit,
            ),
        ),
        (
            f"{name} down",
            gemm_launch(
                cfg.down,
                act,
                _meta(experts, inter, hidden, dtype=dtype),
                out,
                offsets,
                pairs,
                _meta(rows, dtype=torch.float32),
                hidden,
                top_k,
                b_down,
            ),
        ),
    ]


def attention_launches(dtype: torch.dtype, gpt_oss: bool = False) -> list[tuple[str, Launch]]:
    """Decode attention (32 query heads over 8 KV heads, head dim 128), one split and four;
    gpt_oss: 64 heads over 8 of head dim 64, with sinks and a window of 128."""
    batch, heads, kv_heads, head_dim, width = 8, 32, 8, 128, 64
    if gpt_oss:
        heads, head_dim = 64, 64
    q = _meta(batch, heads, head_dim, dtype=dtype)
    cache = _meta(512, 16, kv_heads, head_dim, dtype=dtype)
    tables = _meta(batch, width, dtype=torch.int64)
    lens = _meta(batch, dtype=torch.int64)
    split_out = _meta(batch, heads, 4, head_dim, dtype=torch.float32)
    lse = _meta(batch, heads, 4, dtype=torch.float32)
    sinks, window = (_meta(heads, dtype=dtype), 128) if gpt_oss else (None, 0)
    name = f"decode attention {dtype}" + (" sinks window" if gpt_oss else "")
    return [
        (
            f"{name} 1 split",
            decode_launch(q, cache, cache, tables, lens, 0.088, q, q, 1, sinks, window),
        ),
        (
            f"{name} 4 splits",
            decode_launch(q, cache, cache, tables, lens, 0.088, split_out, lse, 4, sinks, window),
        ),
    ]


def mla_launches(dtype: torch.dtype) -> list[tuple[str, Launch]]:
    """MLA decode as DeepSeek-V3 (128 heads, kv_lora_rank 512, rope 64), one split and four."""
    batch, heads, rank, rope, width = 8, 128, 512, 64, 64
    q_latent, q_pe = _meta(batch, heads, rank, dtype=dtype), _meta(batch, heads, rope, dtype=dtype)
    cache = _meta(512, 16, rank + rope, dtype=dtype)
    tables = _meta(batch, width, dtype=torch.int64)
    lens = _meta(batch, dtype=torch.int64)
    split_out = _meta(batch, heads, 4, rank, dtype=torch.float32)
    lse = _meta(batch, heads, 4, dtype=torch.float32)
    args = (q_latent, q_pe, cache, tables, lens, 0.072)
    return [
        (f"mla decode {dtype} 1 split", mla_decode_launch(*args, q_latent, q_latent, 1)),
        (f"mla decode {dtype} 4 splits", mla_decode_launch(*args, split_out, lse, 4)),
    ]


def all_launches() -> list[tuple[str, Launch]]:
    bf16 = torch.bfloat16
    return [
        *moe_launches(8, 4096, 14336, 2, 4, bf16),
        *moe_launches(8, 4096, 14336, 2, 2048, bf16),
        *moe_launches(128, 2048, 768, 8, 1, bf16),
        *moe_launches(128, 2048, 768, 8, 2048, bf16),
        *moe_launches(8, 64, 96, 2, 16, torch.float32),
        *moe_launches(32, 2880, 2880, 4, 1, bf16, terms=True),  # gpt-oss-20b
        *attention_launches(bf16),
        *attention_launches(bf16, gpt_oss=True),
        *mla_launches(bf16),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for H100/H200")
    args = p.parse_args(argv)
    if interpreting():
        print("triton is in interpreter mode: run with TRITON_INTERPRET=0", file=sys.stderr)
        return 2
    failed = 0
    for name, launch in all_launches():
        try:
            info = compile_launch(launch, args.arch)
        except Exception as err:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[0]}")
            continue
        print(f"ok   {name}: shared {info['shared']} B, async copies {info['async_copies']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
