"""Expert-parallel load balancing: a new placement from recent per-expert loads.

Per layer: give the hottest experts extra replicas (each replica then takes an equal share of
its expert's load), then pack the replicas onto ranks greedily, heaviest first, each onto the
least loaded rank with room (longest-processing-time packing; every rank gets the same number
of hosted experts, up to one) and, where possible, never two replicas of one expert on one rank.
"""

import torch

from engine.ep.placement import LayerPlacement, Placement, imbalance


def replica_counts(load: list[float], ep_size: int, extra: int) -> list[int]:
    """How many copies of each expert: `extra` replicas go, one by one, to the heaviest share."""
    copies = [1] * len(load)
    for _ in range(extra):
        room = [e for e in range(len(load)) if copies[e] < ep_size]
        if not room:
            break
        hottest = max(room, key=lambda e: (load[e] / copies[e], -e))
        copies[hottest] += 1
    return copies


def pack(load: list[float], ep_size: int, extra: int) -> tuple[tuple[int, ...], ...]:
    """One layer's hosted experts per rank for per-expert loads, with `extra` redundant replicas."""
    copies = replica_counts(load, ep_size, extra)
    items = sorted(
        ((load[e] / copies[e], e) for e in range(len(load)) for _ in range(copies[e])),
        key=lambda item: (-item[0], item[1]),
    )
    base, spare = divmod(len(items), ep_size)
    hosted: list[list[int]] = [[] for _ in range(ep_size)]
    rank_load = [0.0] * ep_size
    for share, expert in items:
        spare_left = spare - sum(len(s) > base for s in hosted)
        open_ranks = [
            r
            for r in range(ep_size)
            if len(hosted[r]) < base or (len(hosted[r]) == base and spare_left > 0)
        ]
        fresh = [r for r in open_ranks if expert not in hosted[r]] or open_ranks
        rank = min(fresh, key=lambda r: (rank_load[r], r))
        hosted[rank].append(expert)
        rank_load[rank] += share
    return tuple(tuple(sorted(s)) for s in hosted)


def rebalance(loads: torch.Tensor, current: Placement, replicas: int) -> Placement:
    """A new placement for per-layer expert loads [layers, experts] (version + 1)."""
    num_experts = loads.shape[1]
    layers = [
        LayerPlacement(pack(layer.tolist(), current.ep_size, replicas), num_experts)
        for layer in loads.double()
    ]
    return Placement(layers, current.ep_size, current.version + 1)


def predicted_imbalance(placement: Placement, loads: torch.Tensor) -> float:
    """Sum over layers of the busiest rank's expected load / sum of the mean loads."""
    per_rank = torch.stack(
        [lp.rank_loads(load) for lp, load in zip(placement.layers, loads, strict=True)]
    )
    return imbalance(per_rank)
