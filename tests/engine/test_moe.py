"""Grouped MoE computation equals the plain per-expert loop and a dense per-token reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model.context import ForwardContext
from engine.model.grouping import expert_capacity, group_by_expert
from engine.model.moe import MoEBlock, route
from kernels import expert_ffn, expert_ffn_loop

TOKENS, HIDDEN, INTER, EXPERTS = 37, 24, 40, 5


def nonzero_randn(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Gaussian values pushed away from zero, so no product can vanish by accident."""
    x = torch.randn(*shape, generator=gen)
    return (x + 0.1 * torch.sign(x) + (x == 0).float()) * scale


def expert_weights(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w_gate_up = nonzero_randn(EXPERTS, HIDDEN, 2 * INTER, gen=gen, scale=HIDDEN**-0.5)
    w_down = nonzero_randn(EXPERTS, INTER, HIDDEN, gen=gen, scale=INTER**-0.5)
    return w_gate_up, w_down


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


def dense_ffn(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    gate, up = (x @ w_gate_up).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down


# group sizes per expert, with empty experts first, in the middle and last
GROUPS = [
    [10, 0, 15, 0, 12],
    [0, 0, 37, 0, 0],
    [0, 7, 9, 21, 0],
    [37, 0, 0, 0, 0],
    [8, 8, 8, 8, 5],
]


@pytest.mark.parametrize("groups", GROUPS)
def test_grouped_equals_loop_fp32(groups: list[int]) -> None:
    gen = torch.Generator().manual_seed(sum(i * g for i, g in enumerate(groups)))
    x = nonzero_randn(TOKENS, HIDDEN, gen=gen)
    w_gate_up, w_down = expert_weights(gen)
    offsets = torch.cumsum(torch.tensor(groups), 0).to(torch.int32)
    grouped = expert_ffn(x, w_gate_up, w_down, offsets)
    loop = expert_ffn_loop(x, w_gate_up, w_down, offsets)
    assert grouped.shape == (TOKENS, HIDDEN)
    assert rel_err(grouped, loop) <= 1e-5
    start = 0
    for e, n in enumerate(groups):
        if n:
            rows = slice(start, start + n)
            assert rel_err(loop[rows], dense_ffn(x[rows], w_gate_up[e], w_down[e])) <= 1e-5
        start += n


@pytest.mark.parametrize("groups", GROUPS[:3])
def test_grouped_equals_loop_bf16(groups: list[int]) -> None:
    gen = torch.Generator().manual_seed(7)
    x = nonzero_randn(TOKENS, HIDDEN, gen=gen).bfloat16()
    w_gate_up, w_down = (w.bfloat16() for w in expert_weights(gen))
    offsets = torch.cumsum(torch.tensor(groups), 0).to(torch.int32)
    grouped = expert_ffn(x, w_gate_up, w_down, offsets)
    loop = expert_ffn_loop(x, w_gate_up, w_down, offsets)
    assert grouped.dtype == torch.bfloat16
    assert rel_err(grouped, loop) <= 1e-2


def test_grouped_with_no_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    w_gate_up, w_down = expert_weights(gen)
    offsets = torch.zeros(EXPERTS, dtype=torch.int32)
    out = expert_ffn(torch.empty(0, HIDDEN), w_gate_up, w_down, offsets)
    assert out.shape == (0, HIDDEN)


def moe_config(shared: int = 0, renormalize: bool = True) -> ModelConfig:
    return ModelConfig(
        family="qwen2_moe" if shared else "mixtral",
        vocab_size=32,
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=12,
        moe_intermediate_size=INTER,
        num_experts=EXPERTS,
        top_k=2,
        norm_topk_prob=renormalize,
        shared_expert_intermediate_size=shared,
    )


def moe_block(cfg: ModelConfig, seed: int) -> MoEBlock:
    block = MoEBlock(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]
            p.copy_(nonzero_randn(*p.shape, gen=gen, scale=fan_in**-0.5))
    return block.eval()


def context(num_tokens: int, capacity_factor: float | None = None) -> ForwardContext:
    return ForwardContext(
        kv_index=torch.empty(0, dtype=torch.long),
        prefills=[],
        decodes=[],
        token_rank=torch.zeros(num_tokens, dtype=torch.long),
        expert_capacity_factor=capacity_factor,
    )


def dense_moe(block: MoEBlock, x: torch.Tensor) -> torch.Tensor:
    """Per-token reference: each token through its top-k experts, weighted and summed."""
    weights, experts = route(block.gate(x) + block.router_bias, block.top_k, block.renormalize)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), experts[t].tolist(), strict=True):
            out[t] += w * dense_ffn(x[t], block.w_gate_up[e], block.w_down[e])
    if block.shared_expert is not None and block.shared_expert_gate is not None:
        out = out + torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return out


@pytest.mark.parametrize("shared", [0, 16])
@pytest.mark.parametrize("capacity_factor", [None, 0.6])
def test_moe_block_grouped_backends_equal_loop(
    monkeypatch: pytest.MonkeyPatch, shared: int, capacity_factor: float | None
) -> None:
    block = moe_block(moe_config(shared), seed=3)
    x = nonzero_randn(TOKENS, HIDDEN, gen=torch.Generator().manual_seed(4))
    outs = {}
    with torch.no_grad():
        for backend in ("loop", "torch", "native"):
            monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
            ctx = context(TOKENS, capacity_factor)
            outs[backend] = block(x, ctx)
            assert len(ctx.expert_counts) == len(ctx.expert_dropped) == 1
            assert int(ctx.expert_counts[0].sum()) == TOKENS * block.top_k
            assert (int(ctx.expert_dropped[0]) > 0) == (capacity_factor is not None)
        for backend in ("torch", "native"):
            assert rel_err(outs[backend], outs["loop"]) <= 1e-5
            if capacity_factor is None:
                assert rel_err(outs[backend], dense_moe(block, x)) <= 1e-5


def test_moe_block_refuses_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    block = moe_block(moe_config(), seed=3)
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "cuda-magic")
    with pytest.raises(ValueError, match="MOESCOPE_MOE_BACKEND"):
        block(torch.ones(2, HIDDEN), context(2))


def random_experts(num_tokens: int, top_k: int, seed: int) -> torch.Tensor:
    """Distinct experts per token, skewed so some experts overflow and one stays empty."""
    gen = torch.Generator().manual_seed(seed)
    popularity = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.0])
    return torch.stack(
        [torch.multinomial(popularity, top_k, generator=gen) for _ in range(num_tokens)]
    )


def test_group_by_expert_dropless() -> None:
    experts = random_experts(TOKENS, 2, seed=0)
    order, per_expert, routed, dropped = group_by_expert(experts, EXPERTS, None)
    flat = experts.flatten()
    assert int(dropped) == 0
    assert sorted(order.tolist()) == list(range(flat.numel()))
    assert torch.equal(per_expert, routed)
    assert routed.tolist() == [int((flat == e).sum()) for e in range(EXPERTS)]
    assert routed[4] == 0
    grouped = flat[order].tolist()
    assert grouped == sorted(grouped)


@pytest.mark.parametrize("capacity_factor", [0.3, 0.75, 1.0, 1.5, 10.0])
def test_group_by_expert_drops_pairs_beyond_capacity(capacity_factor: float) -> None:
    experts = random_experts(TOKENS, 2, seed=1)
    flat = experts.flatten().tolist()
    capacity = math.ceil(capacity_factor * len(flat) / EXPERTS)
    kept_expected: list[int] = []
    for e in range(EXPERTS):
        pairs = [i for i, x in enumerate(flat) if x == e]
        kept_expected.extend(pairs[:capacity])
    assert expert_capacity(capacity_factor, len(flat), EXPERTS) == capacity
    order, per_expert, routed, dropped = group_by_expert(experts, EXPERTS, capacity)
    assert order.tolist() == kept_expected
    assert per_expert.tolist() == [min(int(r), capacity) for r in routed]
    assert routed.tolist() == [flat.count(e) for e in range(EXPERTS)]
    assert int(dropped) == len(flat) - len(kept_expected)
    assert int(per_expert.sum()) == len(kept_expected)


def test_group_by_expert_small_capacity_drops_something() -> None:
    experts = random_experts(TOKENS, 2, seed=2)
    capacity = expert_capacity(0.5, experts.numel(), EXPERTS)
    _, per_expert, routed, dropped = group_by_expert(experts, EXPERTS, capacity)
    assert int(dropped) > 0
    assert int(dropped) == int((routed - per_expert).sum())


def test_route_renormalizes_only_when_asked() -> None:
    logits = nonzero_randn(TOKENS, EXPERTS, gen=torch.Generator().manual_seed(5))
    probs = torch.softmax(logits, dim=-1)
    raw_w, raw_e = route(logits, 2, renormalize=False)
    norm_w, norm_e = route(logits, 2, renormalize=True)
    assert torch.equal(raw_e, norm_e)
    assert torch.equal(raw_e, probs.topk(2, dim=-1).indices)
    torch.testing.assert_close(raw_w, probs.gather(1, raw_e))
    assert bool((raw_w.sum(-1) < 1 - 1e-3).all())
    torch.testing.assert_close(norm_w.sum(-1), torch.ones(TOKENS))
    torch.testing.assert_close(norm_w, raw_w / raw_w.sum(-1, keepdim=True))


def test_route_weights_are_float32_for_bf16_logits() -> None:
    logits = nonzero_randn(TOKENS, EXPERTS, gen=torch.Generator().manual_seed(6)).bfloat16()
    weights, experts = route(logits, 2, renormalize=True)
    assert weights.dtype == torch.float32
    assert torch.equal(experts, torch.softmax(logits.float(), -1).topk(2, -1).indices)
