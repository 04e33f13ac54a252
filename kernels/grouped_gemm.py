"""Expert FFN over tokens grouped by expert: SiLU(x W_gate) * (x W_up), then W_down."""

import torch
import torch.nn.functional as F


def expert_ffn(
    x_sorted: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """One grouped GEMM per projection over tokens sorted by expert.

    x_sorted [N, H]; w_gate_up [E, H, 2I]; w_down [E, I, H]; offsets [E] int32 group ends.
    """
    gate_up = F.grouped_mm(x_sorted, w_gate_up, offs=offsets)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.grouped_mm(F.silu(gate) * up, w_down, offs=offsets)


def expert_ffn_loop(
    x_sorted: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Reference: the same computation as a plain loop over experts."""
    out = torch.empty_like(x_sorted)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            gate, up = (x_sorted[start:end] @ w_gate_up[e]).chunk(2, dim=-1)
            out[start:end] = (F.silu(gate) * up) @ w_down[e]
        start = end
    return out
