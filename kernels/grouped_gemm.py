"""Expert FFN over tokens grouped by expert: SiLU(x W_gate) * (x W_up), then W_down.

Plain torch: one `grouped_mm` per projection, a per-expert loop (the reference), and the
combine step around either. kernels.triton_moe fuses all of it into two Triton launches.
Every FFN takes optional `ExpertTerms` (kernels.swiglu): biases and gpt-oss's clamped SwiGLU.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.swiglu import ExpertTerms, add_bias, glu

# F.grouped_mm is recent; builds without it have the same op as torch._grouped_mm
grouped_mm: Callable[..., torch.Tensor] = getattr(F, "grouped_mm", None) or torch._grouped_mm


def expert_ffn(
    x_sorted: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    offsets: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """One grouped GEMM per projection over tokens sorted by expert.

    x_sorted [N, H]; w_gate_up [E, H, 2I]; w_down [E, I, H]; offsets [E] int32 group ends.
    """
    gate_up = grouped_mm(x_sorted, w_gate_up, offs=offsets)
    if terms is None:
        gate, up = gate_up.chunk(2, dim=-1)
        return grouped_mm(F.silu(gate) * up, w_down, offs=offsets)
    gate, up = add_bias(gate_up, terms.b_gate_up, offsets).chunk(2, dim=-1)
    return add_bias(grouped_mm(glu(gate, up, terms), w_down, offs=offsets), terms.b_down, offsets)


def expert_ffn_loop(
    x_sorted: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    offsets: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """Reference: the same computation as a plain loop over experts."""
    b_gate_up, b_down = (None, None) if terms is None else (terms.b_gate_up, terms.b_down)
    out = torch.empty_like(x_sorted)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            gate_up = x_sorted[start:end] @ w_gate_up[e]
            if b_gate_up is not None:
                gate_up = gate_up + b_gate_up[e]
            gate, up = gate_up.chunk(2, dim=-1)
            y = glu(gate, up, terms) @ w_down[e]
            out[start:end] = y if b_down is None else y + b_down[e]
        start = end
    return out


def combine_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    order: torch.Tensor,
    per_expert: torch.Tensor,
    weights: torch.Tensor,
    ffn: Callable[..., torch.Tensor] = expert_ffn_loop,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """Gather tokens by expert, run `ffn`, scale by router weights, add back in token order."""
    tokens = order // weights.shape[1]
    offsets = torch.cumsum(per_expert, 0).to(torch.int32)
    y = ffn(x[tokens], w_gate_up, w_down, offsets, terms)
    y = y * weights.flatten()[order].unsqueeze(1).to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, y)
