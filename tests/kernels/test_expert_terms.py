"""gpt-oss's expert terms (biases after both projections, the clamped SwiGLU) on every MoE
backend equal transformers' formula, computed here per pair in float32."""

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err, routing

from kernels import moe_experts, native_moe
from kernels.swiglu import ExpertTerms
from kernels.triton_moe import fused_moe

# tokens, hidden, intermediate, experts, top_k, routing skew (skew leaves experts empty);
# intermediate sizes off the native kernel's 16-column halves (grouped_mm needs multiples of 4),
# hidden off its 32-column blocks
SHAPES = [
    (1, 24, 40, 8, 1, 0.0),
    (37, 40, 20, 8, 2, 1.0),
    (13, 48, 56, 32, 4, 0.5),
]
BACKENDS = ["torch", "loop", "onednn", "native", "triton"]
LIMIT = 0.6  # small, so that the clamp bites on both sides of the random sums


def gpt_oss_reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    order: torch.Tensor,
    weights: torch.Tensor,
    terms: ExpertTerms,
    experts_of_pairs: torch.Tensor,
) -> torch.Tensor:
    """transformers' GptOssExperts, gate and up de-interleaved (gate columns, then up)."""
    assert terms.b_gate_up is not None and terms.b_down is not None
    limit, alpha = terms.swiglu_limit, terms.swiglu_alpha
    top_k = weights.shape[1]
    out = torch.zeros_like(x)
    for pair in order.tolist():
        token, e = pair // top_k, int(experts_of_pairs[pair])
        gate_up = x[token] @ w_gate_up[e] + terms.b_gate_up[e]
        gate, up = gate_up.chunk(2)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = (up + 1) * (gate * torch.sigmoid(gate * alpha))
        out[token] += (act @ w_down[e] + terms.b_down[e]) * weights[token, pair % top_k]
    return out


def case(shape: tuple[int, int, int, int, int, float], seed: int):
    tokens, hidden, inter, experts, top_k, skew = shape
    gen = torch.Generator().manual_seed(seed)
    x = nonzero_randn(tokens, hidden, gen=gen)
    w_gate_up = nonzero_randn(experts, hidden, 2 * inter, gen=gen, scale=hidden**-0.5)
    w_down = nonzero_randn(experts, inter, hidden, gen=gen, scale=inter**-0.5)
    terms = ExpertTerms(
        nonzero_randn(experts, 2 * inter, gen=gen, scale=0.3),
        nonzero_randn(experts, hidden, gen=gen, scale=0.3),
        swiglu_limit=LIMIT,
    )
    order, per_expert, weights = routing(tokens, experts, top_k, gen, skew)
    flat = torch.repeat_interleave(torch.arange(experts, device=DEVICE), per_expert)
    experts_of_pairs = torch.empty_like(flat)
    experts_of_pairs[order] = flat
    return x, w_gate_up, w_down, order, per_expert, weights, terms, experts_of_pairs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_backends_match_gpt_oss_formula(
    shape: tuple[int, int, int, int, int, float], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "native" and not native_moe.available():
        pytest.skip("no C++ compiler")
    x, w_gate_up, w_down, order, per_expert, weights, terms, pair_experts = case(
        shape, SHAPES.index(shape)
    )
    expected = gpt_oss_reference(x, w_gate_up, w_down, order, weights, terms, pair_experts)
    gate_up = (x[order // shape[4]].unsqueeze(1) @ w_gate_up[pair_experts[order]]).squeeze(1)
    gate_up = gate_up + terms.b_gate_up[pair_experts[order]]  # type: ignore[index]
    gate, up = gate_up.chunk(2, dim=-1)
    assert (gate > LIMIT).any() and (up > LIMIT).any() and (up < -LIMIT).any()
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
    out = moe_experts(x, w_gate_up, w_down, order, per_expert, weights, terms)
    assert rel_err(out, expected) < 1e-5


def test_terms_change_the_output() -> None:
    """Each term counts: dropping any one of them moves the result."""
    x, w_gate_up, w_down, order, per_expert, weights, terms, _ = case(SHAPES[1], 3)
    full = fused_moe(x, w_gate_up, w_down, order, per_expert, weights, terms=terms)
    for partial in (
        ExpertTerms(None, terms.b_down, LIMIT),
        ExpertTerms(terms.b_gate_up, None, LIMIT),
        ExpertTerms(terms.b_gate_up, terms.b_down, None),
    ):
        out = fused_moe(x, w_gate_up, w_down, order, per_expert, weights, terms=partial)
        assert rel_err(out, full) > 1e-3


@pytest.mark.parametrize("backend", ["native", "triton"])
def test_bf16_weights_with_terms(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "native" and not native_moe.available():
        pytest.skip("no C++ compiler")
    x, w_gate_up, w_down, order, per_expert, weights, terms, pair_experts = case(SHAPES[2], 5)
    expected = gpt_oss_reference(
        x,
        w_gate_up.bfloat16().float(),
        w_down.bfloat16().float(),
        order,
        weights,
        terms,
        pair_experts,
    )
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
    bf16_terms = ExpertTerms(
        terms.b_gate_up.bfloat16(),  # type: ignore[union-attr]
        terms.b_down.bfloat16(),  # type: ignore[union-attr]
        LIMIT,
    )
    out = moe_experts(
        x.bfloat16(),
        w_gate_up.bfloat16(),
        w_down.bfloat16(),
        order,
        per_expert,
        weights,
        bf16_terms,
    )
    assert out.dtype == torch.bfloat16
    assert rel_err(out, expected) < 3e-2
