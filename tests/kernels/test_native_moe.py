"""The native CPU grouped GEMM: exact against per-expert matmuls, bf16 within tolerance, its
input checks, its build and its fallback."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err
from test_grouped_gemm import SHAPES, case, reference

from kernels import moe_backend, moe_experts, native_moe

pytestmark = [
    pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="x86 CPU"),
    pytest.mark.skipif(DEVICE.type == "cuda", reason="the native kernel is the CPU's"),
]


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """library() rebuilt under a cache of its own; the shared one again afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_moe.library.cache_clear()
    yield tmp_path
    native_moe.library.cache_clear()


def per_expert(x: torch.Tensor, w: torch.Tensor, rows: list[int]) -> torch.Tensor:
    starts = [sum(rows[:e]) for e in range(len(rows))]
    return torch.cat(
        [x[s : s + n] @ w[e] for e, (s, n) in enumerate(zip(starts, rows, strict=True))]
    )


# rows per expert (empty ones, more than a tile's rows: 3 with AVX2, 8 with AVX-512), K, N (not
# whole 32-column blocks)
@pytest.mark.parametrize(
    "rows,k,n",
    [([3, 0, 1, 19], 40, 72), ([0, 0, 9], 7, 33), ([1], 512, 31), ([8, 16, 0, 2, 5], 64, 96)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_gemm_equals_per_expert_matmuls(
    rows: list[int], k: int, n: int, dtype: torch.dtype
) -> None:
    """bf16 weights too (in pairs along K where the CPU has AVX512-BF16; K odd here and
    there), with rows that bf16 holds exactly, so both ways of reading them are exact."""
    gen = torch.Generator().manual_seed(len(rows) * k + n)
    x = nonzero_randn(sum(rows), k, gen=gen).to(dtype).float()
    w = nonzero_randn(len(rows), k, n, gen=gen, scale=k**-0.5).to(dtype)
    offsets = torch.tensor(rows).cumsum(0)
    out = native_moe.grouped_gemm(x, w, offsets)
    assert out.shape == (sum(rows), n) and out.dtype == torch.float32
    assert rel_err(out, per_expert(x, w.float(), rows)) < 1e-6


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_weights_match_the_float32_reference(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int, int, float]
) -> None:
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "native")
    args = case(shape, torch.bfloat16, seed=12)
    out = moe_experts(*args)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, reference(*args)) < 1e-2


def test_bad_inputs_are_refused_before_anything_is_read() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = nonzero_randn(6, 16, gen=gen), nonzero_randn(3, 16, 40, gen=gen)
    with pytest.raises(ValueError, match="outside 6 rows"):
        native_moe.grouped_gemm(x, w, torch.tensor([2, 4, 7]))
    with pytest.raises(ValueError, match="x"):
        native_moe.grouped_gemm(x[:, :15], w, torch.tensor([2, 4, 6]))
    with pytest.raises(ValueError, match="offsets"):
        native_moe.grouped_gemm(x, w, torch.tensor([2, 6]))
    with pytest.raises(TypeError, match="float16"):
        native_moe.grouped_gemm(x, w.half(), torch.tensor([2, 4, 6]))


def test_it_shares_torchs_openmp_runtime() -> None:
    """A second OpenMP runtime would bring a second pool of threads spinning on the same cores."""
    assert native_moe.available()
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) == 1, runtimes


def test_it_is_built_once_into_the_cache(fresh_library: Path) -> None:
    lib = native_moe.library()
    assert lib is not None
    built = list((fresh_library / "moescope").glob("native_moe-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native_moe.library.cache_clear()
    assert native_moe.library() is not None
    assert built[0].stat().st_mtime_ns == stamp


@pytest.mark.parametrize("cxx", ["no-such-compiler", "false"])
def test_without_a_working_compiler_the_cpu_falls_back(
    fresh_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cxx: str,
) -> None:
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.delenv("MOESCOPE_MOE_BACKEND", raising=False)
    with caplog.at_level(logging.WARNING, logger="kernels.native_moe"):
        assert not native_moe.available()
    assert "native MoE kernel" in caplog.text
    cpu = torch.device("cpu")
    assert moe_backend(cpu, torch.float32) == "onednn"
    assert moe_backend(cpu, torch.bfloat16) == "torch"
    assert not list(fresh_library.rglob("*.so"))


def test_gate_up_applies_silu_across_the_float_range() -> None:
    """Each gate value through the kernel's own exp: tiny, large, past where exp overflows."""
    gate = torch.cat([torch.linspace(-120, 120, 481), torch.tensor([0.0, -1e-30, 1e-30, 88.7])])
    i = gate.numel()
    w = torch.cat([gate, torch.full((i,), 3.0)]).view(1, 1, 2 * i)  # K = 1: the sums are w
    out = native_moe.gate_up(torch.ones(1, 1), w, torch.tensor([1]))
    expected = torch.nn.functional.silu(gate.double()) * 3.0
    assert torch.isfinite(out).all()
    assert ((out[0].double() - expected).abs() <= 1e-6 * expected.abs().clamp(min=1.0)).all()


def test_bf16_weights_go_in_pairs_where_the_cpu_has_its_dot_product() -> None:
    flags = Path("/proc/cpuinfo").read_text().split()
    assert native_moe.bf16_lanes() == (2 if "avx512_bf16" in flags else 1)
