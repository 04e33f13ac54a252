"""What some families add to the plain SwiGLU expert, shared by every MoE backend.

gpt-oss puts a bias after each expert projection and clamps its SwiGLU:
g = min(gate, limit), u = clamp(up, -limit, limit), act = (u + 1) * g * sigmoid(alpha * g).
Without terms (None) an expert is SiLU(x W_gate) * (x W_up) W_down, as it always was.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ExpertTerms:
    """Per-expert biases (rows of the experts passed beside them) and the clamped SwiGLU."""

    b_gate_up: torch.Tensor | None = None  # [E, 2I]: gate columns, then up
    b_down: torch.Tensor | None = None  # [E, H]
    swiglu_limit: float | None = None  # None: plain SiLU(gate) * up
    swiglu_alpha: float = 1.702

    def rows(self, experts: list[int]) -> "ExpertTerms":
        """The same terms for the experts `experts` (an expert-parallel rank's hosted ones)."""
        gate_up, down = self.b_gate_up, self.b_down
        return replace(
            self,
            b_gate_up=None if gate_up is None else gate_up[experts],
            b_down=None if down is None else down[experts],
        )


def glu(gate: torch.Tensor, up: torch.Tensor, terms: ExpertTerms | None) -> torch.Tensor:
    """The gated activation of gate and up (biases already added)."""
    if terms is None or terms.swiglu_limit is None:
        return F.silu(gate) * up
    limit = terms.swiglu_limit
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * terms.swiglu_alpha))


def expert_of_rows(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """The expert of each of `rows` rows sorted by expert (offsets [E]: group ends)."""
    positions = torch.arange(rows, device=offsets.device)
    return torch.searchsorted(offsets.long(), positions, right=True)


def add_bias(y: torch.Tensor, bias: torch.Tensor | None, offsets: torch.Tensor) -> torch.Tensor:
    """y [N, C] rows sorted by expert plus their expert's bias row [E, C] (or y as it is)."""
    if bias is None:
        return y
    return y + bias.to(y.dtype)[expert_of_rows(offsets, y.shape[0])]
