"""Small building blocks: RMSNorm and rotary position embedding."""

import torch
from torch import nn

from engine.config import RopeScaling
from engine.model.rope import inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Rotate-half RoPE with a cos/sin table precomputed up to `max_len` positions (with the
    checkpoint's rope scaling, whose attention factor scales the table as transformers does)."""

    cos: torch.Tensor  # buffers
    sin: torch.Tensor

    def __init__(
        self, head_dim: int, theta: float, max_len: int, scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        freq, factor = inv_freq(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float), freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * factor, persistent=False)
        self.register_buffer("sin", emb.sin() * factor, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] rotated by their positions [T]."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)
