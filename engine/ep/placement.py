"""Expert placement over expert-parallel ranks: which rank computes each routed token-expert pair.

Each layer has its own placement: `hosted[rank]` lists the logical experts that rank hosts (its
local experts, in order). An expert hosted on several ranks has replicas; a pair picks one by
its row in the flat batch (row % replicas), so a replicated expert's tokens are split evenly.
The flat batch's rows are split into equal contiguous shares, one per rank (the source ranks).
"""

import torch

Hosted = tuple[tuple[int, ...], ...]


class LayerPlacement:
    """One layer's hosted experts per rank, with lookup tables for routing pairs to ranks."""

    def __init__(self, hosted: Hosted, num_experts: int) -> None:
        self.hosted = hosted
        hosts: list[list[tuple[int, int]]] = [[] for _ in range(num_experts)]
        for rank, experts in enumerate(hosted):
            for local, expert in enumerate(experts):
                hosts[expert].append((rank, local))
        missing = [e for e, h in enumerate(hosts) if not h]
        if missing:
            raise ValueError(f"experts {missing} are not placed on any rank")
        width = max(len(h) for h in hosts)
        padded = [h + [h[0]] * (width - len(h)) for h in hosts]
        self.replicas = torch.tensor([len(h) for h in hosts])
        self.rank = torch.tensor([[r for r, _ in h] for h in padded])
        self.local = torch.tensor([[j for _, j in h] for h in padded])
        self.num_local = max(len(s) for s in hosted)
        self._tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._tables:
            self._tables[device] = tuple(
                t.to(device) for t in (self.replicas, self.rank, self.local)
            )
        return self._tables[device]

    def destinations(
        self, experts: torch.Tensor, first_row: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """experts [n, k] of rows first_row.. -> (rank [n*k], local slot [n*k]) of each pair."""
        replicas, rank, local = self._on(experts.device)
        n, k = experts.shape
        rows = torch.arange(first_row, first_row + n, device=experts.device)
        flat = experts.flatten()
        choice = rows.repeat_interleave(k) % replicas[flat]
        return rank[flat, choice], local[flat, choice]

    def rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        """Expected pairs per rank for per-expert loads [E] (replicas share evenly)."""
        share = load.double() / self.replicas
        return torch.stack(
            [share[list(s)].sum() if s else share.new_zeros(()) for s in self.hosted]
        )


class Placement:
    """Per-layer expert placement over `ep_size` ranks; `version` grows with each rebalance."""

    def __init__(self, layers: list[LayerPlacement], ep_size: int, version: int = 1) -> None:
        if any(len(lp.hosted) != ep_size for lp in layers):
            raise ValueError(f"every layer must place experts on {ep_size} ranks")
        self.layers = layers
        self.ep_size = ep_size
        self.version = version

    @classmethod
    def contiguous(cls, num_layers: int, num_experts: int, ep_size: int) -> "Placement":
        """Equal contiguous shares of the experts, the same on every layer."""
        if ep_size < 1 or num_experts % ep_size:
            raise ValueError(f"ep_size ({ep_size}) must divide the {num_experts} experts")
        share = num_experts // ep_size
        hosted = tuple(tuple(range(r * share, (r + 1) * share)) for r in range(ep_size))
        return cls([LayerPlacement(hosted, num_experts) for _ in range(num_layers)], ep_size)

    def token_ranks(self, num_tokens: int) -> torch.Tensor:
        """Which rank is the source of each row of the flat batch (equal contiguous shares)."""
        return torch.arange(num_tokens) * self.ep_size // max(num_tokens, 1)

    def row_range(self, rank: int, num_tokens: int) -> tuple[int, int]:
        """Rows [start, end) of the flat batch whose source is `rank`."""
        ep = self.ep_size
        return (rank * num_tokens + ep - 1) // ep, ((rank + 1) * num_tokens + ep - 1) // ep

    def hosted(self) -> list[list[list[int]]]:
        """[layer][rank] -> hosted logical experts, as plain lists."""
        return [[list(s) for s in lp.hosted] for lp in self.layers]


def max_replicas(num_experts: int, ep_size: int) -> int:
    """Most redundant replicas a layer can hold: every expert on every rank."""
    return num_experts * (ep_size - 1)


def a2a_bytes(pairs: torch.Tensor, bytes_per_pair: int) -> list[list[int]]:
    """Pair counts [layers, src, dst] -> bytes sent [from][to] (dispatch plus combine).

    Rank a sends b its pairs computed on b (dispatch) and the results of b's pairs it computed
    (combine); pairs computed where they start never cross.
    """
    total = pairs.sum(0)
    sent = total + total.T
    sent.fill_diagonal_(0)
    return (sent * bytes_per_pair).tolist()


def gather_bytes(ep_size: int, num_rows: int, layers: int, row_bytes: int) -> list[list[int]]:
    """Bytes [from][to] of the all-gather that follows each MoE layer.

    Attention is replicated, so every rank sends its share of the layer's output rows, padded
    to the largest share (ceil(num_rows / ep_size)), to every other rank.
    """
    sent = -(-num_rows // ep_size) * layers * row_bytes
    return [[0 if src == dst else sent for dst in range(ep_size)] for src in range(ep_size)]


def imbalance(rank_pairs: torch.Tensor) -> float:
    """Per-layer pairs per rank [layers, ranks] -> sum of busiest-rank loads / sum of means.

    Every layer waits for its busiest rank, so this is the MoE time lost to imbalance.
    """
    mean = rank_pairs.double().mean(1).sum().item()
    return round(rank_pairs.double().max(1).values.sum().item() / mean, 4) if mean else 1.0
