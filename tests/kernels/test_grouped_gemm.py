"""The MoE kernels (Triton, the native CPU grouped GEMM, oneDNN) equal the plain-torch
per-expert reference."""

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err, routing

from kernels import (
    combine_experts,
    expert_ffn_loop,
    moe_backend,
    moe_experts,
    native_moe,
)
from kernels.gemm_configs import GemmConfig, MoEConfig
from kernels.triton_moe import fused_moe

# tokens, hidden, intermediate, experts, top_k, routing skew (skew leaves experts empty)
SHAPES = [
    (1, 24, 40, 8, 1, 0.0),
    (37, 40, 24, 8, 2, 1.0),
    (13, 48, 56, 64, 8, 0.5),
    (5, 32, 20, 256, 4, 0.0),
    (70, 24, 36, 16, 3, 2.0),
]


def weights(
    experts: int, hidden: int, inter: int, gen: torch.Generator, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    w_gate_up = nonzero_randn(experts, hidden, 2 * inter, gen=gen, scale=hidden**-0.5, dtype=dtype)
    w_down = nonzero_randn(experts, inter, hidden, gen=gen, scale=inter**-0.5, dtype=dtype)
    return w_gate_up, w_down


def reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    order: torch.Tensor,
    per_expert: torch.Tensor,
    w: torch.Tensor,
) -> torch.Tensor:
    """The per-expert torch loop in float32, whatever the inputs' dtype."""
    return combine_experts(
        x.float(), w_gate_up.float(), w_down.float(), order, per_expert, w, expert_ffn_loop
    )


def case(shape: tuple[int, int, int, int, int, float], dtype: torch.dtype, seed: int):
    tokens, hidden, inter, experts, top_k, skew = shape
    gen = torch.Generator().manual_seed(seed)
    x = nonzero_randn(tokens, hidden, gen=gen, dtype=dtype)
    w_gate_up, w_down = weights(experts, hidden, inter, gen, dtype)
    return (x, w_gate_up, w_down, *routing(tokens, experts, top_k, gen, skew))


@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_matches_reference(shape: tuple[int, int, int, int, int, float]) -> None:
    args = case(shape, torch.float32, seed=SHAPES.index(shape))
    order, per_expert = args[3], args[4]
    if shape[3] > shape[0] * shape[4]:
        assert int((per_expert == 0).sum()) > 0
    out = fused_moe(*args)
    assert out.shape == args[0].shape and out.dtype == torch.float32
    assert rel_err(out, reference(*args)) < 1e-5
    assert order.numel() == shape[0] * shape[4]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2]])
def test_half_precision_matches_reference(
    shape: tuple[int, int, int, int, int, float], dtype: torch.dtype
) -> None:
    args = case(shape, dtype, seed=11)
    out = fused_moe(*args)
    assert out.dtype == dtype
    assert rel_err(out, reference(*args)) < 1e-2


# ragged K and N, several column tiles, grouped tile order; then K a multiple of the block
@pytest.mark.parametrize(
    "config,shape",
    [
        (GemmConfig(16, 16, 16, group_m=4), (37, 40, 24, 8, 2, 1.0)),
        (GemmConfig(32, 32, 32, group_m=2), (29, 64, 32, 4, 2, 0.0)),
    ],
)
def test_small_blocks(config: GemmConfig, shape: tuple[int, int, int, int, int, float]) -> None:
    args = case(shape, torch.float32, seed=5)
    out = fused_moe(*args, config=MoEConfig(config, config))
    assert rel_err(out, reference(*args)) < 1e-5


def test_dropped_pairs_contribute_nothing() -> None:
    x, w_gate_up, w_down, order, per_expert, w = case(SHAPES[1], torch.float32, seed=3)
    capacity = 4
    starts = torch.cumsum(per_expert, 0) - per_expert
    keep = torch.cat(
        [
            order[s : s + min(int(n), capacity)]
            for s, n in zip(starts.tolist(), per_expert.tolist(), strict=True)
        ]
    )
    kept = per_expert.clamp(max=capacity)
    assert keep.numel() < order.numel()
    out = fused_moe(x, w_gate_up, w_down, keep, kept, w)
    assert rel_err(out, reference(x, w_gate_up, w_down, keep, kept, w)) < 1e-5


def test_no_rows_gives_zeros() -> None:
    x, w_gate_up, w_down, _, per_expert, w = case(SHAPES[0], torch.float32, seed=4)
    empty = torch.empty(0, dtype=torch.long, device=DEVICE)
    out = fused_moe(x, w_gate_up, w_down, empty, torch.zeros_like(per_expert), w)
    assert out.shape == x.shape and not out.any()


CPU_ONLY = {
    "torch": "torch grouped_mm on CUDA is bf16 only",
    "native": "the native kernel is the CPU's",
    "onednn": "oneDNN is the CPU's",
}
# Triton on one shape only: test_fp32_matches_reference runs it on every shape
BACKEND_CASES = [
    ("triton", SHAPES[1]),
    *[(b, shape) for b in ("loop", *CPU_ONLY) for shape in SHAPES],
]


@pytest.mark.parametrize(
    ("backend", "shape"),
    [
        pytest.param(
            b,
            shape,
            id=f"{b}-{shape}",
            marks=pytest.mark.skipif(
                b in CPU_ONLY and DEVICE.type == "cuda", reason=CPU_ONLY.get(b, "")
            ),
        )
        for b, shape in BACKEND_CASES
    ],
)
def test_backends_agree(
    monkeypatch: pytest.MonkeyPatch, backend: str, shape: tuple[int, ...]
) -> None:
    args = case(shape, torch.float32, seed=8)
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
    assert moe_backend(DEVICE, torch.float32) == backend
    assert rel_err(moe_experts(*args), reference(*args)) < 1e-5


@pytest.fixture(params=["native", "onednn"])
def packed_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each CPU backend that packs the weights once, selected."""
    if DEVICE.type == "cuda":
        pytest.skip("packed weights are the CPU's")
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", request.param)
    return str(request.param)


@pytest.mark.usefixtures("packed_backend")
def test_packed_weights_are_repacked_when_written_in_place() -> None:
    """A checkpoint loaded into the same parameters must not leave the old packing behind."""
    x, w_gate_up, w_down, order, per_expert, w = case(SHAPES[4], torch.float32, seed=9)
    before = moe_experts(x, w_gate_up, w_down, order, per_expert, w)
    with torch.no_grad():
        w_gate_up.mul_(0.5)
        w_down.copy_(w_down.flip(0))
    after = moe_experts(x, w_gate_up, w_down, order, per_expert, w)
    assert rel_err(after, reference(x, w_gate_up, w_down, order, per_expert, w)) < 1e-5
    assert rel_err(after, before) > 0.1


@pytest.mark.usefixtures("packed_backend")
def test_packed_weights_made_in_inference_mode() -> None:
    with torch.inference_mode():
        args = case(SHAPES[1], torch.float32, seed=10)
        assert args[1].is_inference()
        assert rel_err(moe_experts(*args), reference(*args)) < 1e-5


def test_backend_default_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESCOPE_MOE_BACKEND", raising=False)
    cpu = torch.device("cpu")
    assert native_moe.available()  # g++ is part of the environment (README)
    assert moe_backend(cpu, torch.float32) == "native"
    assert moe_backend(cpu, torch.bfloat16) == "native"
    assert moe_backend(cpu, torch.float16) == "torch"
    assert moe_backend(torch.device("cuda"), torch.float32) == "triton"
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "cutlass")
    with pytest.raises(ValueError, match="MOESCOPE_MOE_BACKEND"):
        moe_backend(DEVICE, torch.float32)
