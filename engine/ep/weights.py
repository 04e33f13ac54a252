"""Expert weights on expert-parallel ranks: keep the hosted ones, move them on a rebalance."""

import torch
from torch import nn

from engine.ep.group import EPGroup
from engine.ep.placement import LayerPlacement, Placement
from engine.model.moe import MoEBlock
from engine.model.transformer import MoETransformer


def _blocks(model: MoETransformer) -> list[MoEBlock]:
    return model.moe_blocks


def _set(block: MoEBlock, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    block.w_gate_up = nn.Parameter(gate_up, requires_grad=False)
    block.w_down = nn.Parameter(down, requires_grad=False)


def shard(model: MoETransformer, placement: Placement, rank: int) -> None:
    """Keep only the experts `rank` hosts, in its slot order (replicas are copies)."""
    for block, layer in zip(_blocks(model), placement.layers, strict=True):
        hosted = list(layer.hosted[rank])
        _set(block, block.w_gate_up.data[hosted].clone(), block.w_down.data[hosted].clone())


def _transfers(before: LayerPlacement, after: LayerPlacement) -> list[tuple[int, int, int]]:
    """(destination, expert, source) for each newly hosted expert; source: lowest old host."""
    ranks = range(len(before.hosted))
    return [
        (dst, e, min(r for r in ranks if e in before.hosted[r]))
        for dst in ranks
        for e in after.hosted[dst]
        if e not in before.hosted[dst]
    ]


def move(model: MoETransformer, old: Placement, new: Placement, group: EPGroup) -> int:
    """Send every rank the expert weights it newly hosts; returns the bytes this rank sent."""
    me, sent = group.rank, 0
    for block, before, after in zip(_blocks(model), old.layers, new.layers, strict=True):
        plan = _transfers(before, after)
        local = {e: j for j, e in reversed(list(enumerate(before.hosted[me])))}
        outgoing = [(dst, local[e]) for dst, e, src in plan if src == me]
        incoming = [e for src in range(group.size) for dst, e, s in plan if dst == me and s == src]
        packed = torch.cat([block.w_gate_up.data.flatten(1), block.w_down.data.flatten(1)], 1)
        rows = packed[[j for _, j in outgoing]]
        send = [sum(1 for dst, _ in outgoing if dst == r) for r in range(group.size)]
        receive = [sum(1 for dst, _, s in plan if dst == me and s == r) for r in range(group.size)]
        got = dict(zip(incoming, group.all_to_all(rows, send, receive), strict=True))
        sent += rows.numel() * rows.element_size()
        hosted = torch.stack([got[e] if e in got else packed[local[e]] for e in after.hosted[me]])
        split = block.w_gate_up[0].numel()
        _set(
            block,
            hosted[:, :split].reshape(-1, *block.w_gate_up.shape[1:]).clone(),
            hosted[:, split:].reshape(-1, *block.w_down.shape[1:]).clone(),
        )
    return sent
