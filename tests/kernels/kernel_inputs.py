"""Random inputs for the kernel tests: fresh, awkwardly sized, never zero."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def nonzero_randn(
    *shape: int, gen: torch.Generator, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Gaussian values pushed away from zero, on DEVICE."""
    x = torch.randn(*shape, generator=gen)
    x = (x + 0.1 * torch.sign(x) + (x == 0).float()) * scale
    return x.to(device=DEVICE, dtype=dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).abs().max() / b.abs().max())


def routing(
    tokens: int, experts: int, top_k: int, gen: torch.Generator, skew: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k softmax routing of random logits: (order, per_expert, weights [T, k] float32).

    `skew` biases the logits towards low expert ids, so high ones often get no token.
    """
    logits = torch.randn(tokens, experts, generator=gen)
    logits -= skew * torch.arange(experts, dtype=torch.float)
    weights, ids = torch.softmax(logits, -1).topk(top_k, -1)
    flat = ids.flatten()
    order = torch.sort(flat, stable=True).indices
    per_expert = torch.bincount(flat, minlength=experts)
    return order.to(DEVICE), per_expert.to(DEVICE), weights.to(DEVICE)
