"""Expert FFN through a grouped GEMM compiled for this CPU (kernels/native_moe.cpp).

Decode routes a few rows to each expert, so the experts' step is bound by reading their
weights. oneDNN runs one small GEMM per expert and its threads meet after each; this kernel
reads each expert's weights once, packed in column blocks, and splits (expert, block) tiles
over the threads, which meet once per projection (benchmarks/RESULTS.md, "MoE layer").

The library is built with the C++ compiler (`$CXX`, else g++) on first use, for this CPU
(-march=native), into ~/.cache/moescope (or $XDG_CACHE_HOME/moescope), named by a hash of
the source, the flags and the CPU. It links the OpenMP runtime torch has already loaded, so
both share one thread pool. Without a compiler, or if the build fails, `available()` is
False and the backend choice falls back (kernels.backend), with one warning.
"""

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from kernels.packing import PackedWeights
from kernels.swiglu import ExpertTerms

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("native_moe.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-Wno-psabi")
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
KINDS = ("grouped_gemm", "grouped_gate_up")


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "moescope"


def _cpu() -> str:
    """This CPU's model and feature flags: a library built for one CPU may not run on another."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    keep = ("model name", "flags")
    return "".join(sorted({line for line in text.splitlines() if line.startswith(keep)}))


def _build(compiler: str, target: Path) -> None:
    """Compile SOURCE into `target`, atomically: servers started at once may build together."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (after one warning) if it cannot be."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        log.warning("no C++ compiler: the native MoE kernel is off")
        return None
    key = hashlib.sha256(
        b"\0".join(
            [SOURCE.read_bytes(), " ".join(FLAGS).encode(), compiler.encode(), _cpu().encode()]
        )
    ).hexdigest()[:16]
    target = cache_dir() / f"native_moe-{key}.so"
    if not target.exists():
        try:
            _build(compiler, target)
        except subprocess.CalledProcessError as e:
            log.warning("native MoE kernel build failed, kernel off:\n%s", e.stderr.decode())
            return None
    lib = ctypes.CDLL(str(target))
    ptr, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    for name in [f"{kind}_{t}" for kind in KINDS for t in DTYPES.values()]:
        fn = getattr(lib, name)
        # x, M, K, w, E, N, offsets, y, threads; the epilogue: bias, stride, clamp, limit, alpha
        fn.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, ptr, i32, ptr, i64, i32, f32, f32]
        fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    return library() is not None


@cache
def block() -> int:
    """Columns per packed block."""
    lib = library()
    assert lib is not None
    return int(lib.native_moe_block())


@cache
def bf16_lanes() -> int:
    """bfloat16 weights per column in one packed row: 2 where the CPU has AVX512-BF16's dot
    product (pairs along K), else 1."""
    lib = library()
    assert lib is not None
    return int(lib.native_moe_bf16_lanes())


def _pack(w: torch.Tensor) -> torch.Tensor:
    """w [E, K, N] as [E, N / block, K / lanes, block, lanes], N padded with zeros to whole
    blocks and K to whole lanes (lanes: `bf16_lanes()` for bfloat16 weights, else 1)."""
    experts, k, n = w.shape
    nb, lanes = block(), bf16_lanes() if w.dtype == torch.bfloat16 else 1
    blocks, depth = -(-n // nb), -(-k // lanes)
    padded = torch.zeros(experts, depth * lanes, blocks * nb, dtype=w.dtype)
    padded[:, :k, :n] = w
    return padded.view(experts, depth, lanes, blocks, nb).permute(0, 3, 1, 4, 2).contiguous()


def _pack_gate_up(w: torch.Tensor) -> torch.Tensor:
    """w [E, K, 2I] (gate columns, then up) packed so that each block holds half a block of
    gate columns and the same up columns, each half padded with zeros to whole halves."""
    experts, k, two_i = w.shape
    half = block() // 2
    i = two_i // 2
    halves = -(-i // half)
    padded = torch.zeros(experts, k, 2, halves * half, dtype=w.dtype)
    padded[:, :, :, :i] = w.view(experts, k, 2, i)
    pairs = padded.view(experts, k, 2, halves, half).transpose(2, 3)
    return _pack(pairs.reshape(experts, k, 2 * halves * half))


def _pad_gate_up_bias(b: torch.Tensor) -> torch.Tensor:
    """b [E, 2I] (gate, then up) as float32 [E, 2, I rounded up to half blocks]: the gate and up
    biases of a packed gate/up block's columns at the same offsets in each half."""
    experts, two_i = b.shape
    half, i = block() // 2, two_i // 2
    padded = torch.zeros(experts, 2, -(-i // half) * half)
    padded[:, :, :i] = b.float().view(experts, 2, i)
    return padded.view(experts, -1)


packed = PackedWeights(_pack)
packed_gate_up = PackedWeights(_pack_gate_up)
padded_gate_up_bias = PackedWeights(_pad_gate_up_bias)
float_bias = PackedWeights(lambda b: b.float().contiguous())


def _run(
    kind: str,
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    n: int,
    bias: torch.Tensor | None = None,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """The library's `kind` kernel over x [M, K] sorted by expert: float32 [M, n]; `bias`
    [E, n] (gate/up: [E, 2n]) is added to the sums, and gate/up takes `terms`' activation."""
    lib = library()
    assert lib is not None, "the native MoE kernel is not available"
    if w.dtype not in DTYPES:
        raise TypeError(f"native MoE kernel: weights {w.dtype}; expected one of {list(DTYPES)}")
    if x.device.type != "cpu" or x.shape[1] != w.shape[1] or offsets.shape != w.shape[:1]:
        raise ValueError(f"native MoE kernel: x {x.shape}, w {w.shape}, offsets {offsets.shape}")
    x = x.float().contiguous()
    offsets = offsets.to(torch.int32).contiguous()
    y = torch.empty(x.shape[0], n)
    gated = kind == "grouped_gate_up"
    pack = packed_gate_up if gated else packed
    if bias is not None:
        bias = (padded_gate_up_bias if gated else float_bias)(bias)
    limit = None if terms is None else terms.swiglu_limit
    status = getattr(lib, f"{kind}_{DTYPES[w.dtype]}")(
        x.data_ptr(),
        x.shape[0],
        x.shape[1],
        pack(w).data_ptr(),
        w.shape[0],
        n,
        offsets.data_ptr(),
        y.data_ptr(),
        torch.get_num_threads(),
        None if bias is None else bias.data_ptr(),
        0 if bias is None else bias.shape[1],
        int(limit is not None),
        0.0 if limit is None else limit,
        1.702 if terms is None else terms.swiglu_alpha,
    )
    if status != 0:
        raise ValueError(f"native MoE kernel: offsets {offsets.tolist()} outside {x.shape[0]} rows")
    return y


def grouped_gemm(
    x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] sorted by expert times w [E, K, N] per expert (plus its bias row [E, N]):
    float32 [M, N] (offsets [E]: group ends). x is taken as float32; w is float32 or bfloat16."""
    return _run("grouped_gemm", x, w, offsets, w.shape[2], bias)


def gate_up(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    offsets: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """SiLU(x W_gate) * (x W_up) per expert, float32 [M, I], where w_gate_up [E, K, 2I] holds
    W_gate's columns then W_up's (with `terms`: their biases added, and the clamped SwiGLU
    if it has a limit); as `grouped_gemm` otherwise."""
    bias = None if terms is None else terms.b_gate_up
    return _run("grouped_gate_up", x, w_gate_up, offsets, w_gate_up.shape[2] // 2, bias, terms)


def expert_ffn_native(
    x_sorted: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    offsets: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """`expert_ffn` (kernels.grouped_gemm) on the native kernels: x_sorted [N, H] sorted by
    expert; w_gate_up [E, H, 2I]; w_down [E, I, H]; offsets [E] group ends. The hidden
    activations stay float32 between the projections whatever the weights' dtype."""
    hidden = gate_up(x_sorted, w_gate_up, offsets, terms)
    b_down = None if terms is None else terms.b_down
    return grouped_gemm(hidden, w_down, offsets, b_down).to(x_sorted.dtype)
