"""Expert placement over expert-parallel ranks and the all-to-all volume it implies."""

import torch


class Placement:
    """Expert -> owning rank; by default contiguous equal shares."""

    def __init__(self, num_experts: int, ep_size: int) -> None:
        if ep_size < 1 or num_experts % ep_size:
            raise ValueError(f"ep_size ({ep_size}) must divide the {num_experts} experts")
        self.ep_size = ep_size
        self.owner = torch.arange(num_experts) * ep_size // num_experts

    def token_ranks(self, num_tokens: int) -> torch.Tensor:
        """Which rank holds each row of the flat batch (rows split into equal shares)."""
        return torch.arange(num_tokens) * self.ep_size // max(num_tokens, 1)

    def a2a_bytes(self, counts: torch.Tensor, bytes_per_token: int) -> list[list[int]]:
        """counts [layers, src_rank, expert] -> bytes [src][dst] crossing ranks.

        Each routed pair crosses twice: dispatch to the expert's rank and combine back.
        """
        onehot = torch.nn.functional.one_hot(self.owner, self.ep_size).to(counts.dtype)
        pairs = counts.sum(0) @ onehot
        pairs.fill_diagonal_(0)
        return (pairs * (2 * bytes_per_token)).tolist()
