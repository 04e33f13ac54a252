"""Model runner: turns a SchedulerOutput into flat input tensors, runs the model, swaps KV."""

import array
from dataclasses import dataclass

import torch

from engine.config import CacheConfig
from engine.decode_graphs import DecodeGraphs, graphs_enabled
from engine.ep.group import EPGroup
from engine.ep.placement import Placement
from engine.ep.weights import move, shard
from engine.model.context import DecodeGroup, ForwardContext, PrefillSeq, RankStats
from engine.model.transformer import MoETransformer
from engine.scheduler import SchedulerOutput

DECODE_GROUP = 16


def long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """`torch.tensor(values)`, built through an array: torch reads a list of ints at about
    0.2 µs an element, an array's buffer at a fraction of that (the batch is built anew
    every step, with rows for every running request)."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(array.array("q", values), dtype=torch.long).to(device)


def _columns(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    cols = torch.tensor(pairs, dtype=torch.long).view(-1, 2)
    return cols[:, 0], cols[:, 1]


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    ctx: ForwardContext
    sample_rows: torch.Tensor


@dataclass
class MeasuredA2A:
    """What the ranks measured in one step: bytes sent [from][to] by the all-to-alls and by
    the all-gathers, pairs computed per layer and rank [layers, ranks], and each rank's
    grouped-GEMM milliseconds."""

    bytes: list[list[int]]
    gather_bytes: list[list[int]]
    computed: torch.Tensor
    compute_ms: list[float]


@dataclass
class ForwardResult:
    """Logits for the chunks that sample this step, in chunk order, plus MoE statistics
    (on the CPU, whatever the model's device: telemetry reads them right away)."""

    logits: torch.Tensor
    expert_counts: torch.Tensor  # [layers, experts]
    expert_dropped: torch.Tensor  # [layers]
    moe_seconds: float
    rank_pairs: torch.Tensor | None = None  # [layers, src, dst] as the placement models it
    measured: MeasuredA2A | None = None  # with real expert-parallel ranks


@dataclass
class Swap:
    """Command to the other ranks: copy KV blocks (device, host) out, then (host, device) in."""

    out: list[tuple[int, int]]
    into: list[tuple[int, int]]


@dataclass
class Forward:
    """Command to the other ranks: run the model over this step's flat batch."""

    inp: ModelInput


@dataclass
class Rebalance:
    """Command to the other ranks: move expert weights to this placement."""

    placement: Placement


class ModelRunner:
    """Runs the model on this rank; rank 0 (the engine's) also sends each step to the others."""

    def __init__(
        self,
        model: MoETransformer,
        cache: CacheConfig,
        device: str,
        placement: Placement,
        ep: EPGroup | None = None,
    ) -> None:
        self.model = model
        self.block_size = cache.block_size
        self.device = torch.device(device)
        self.placement = placement
        self.ep = ep
        if ep is not None:
            shard(model, placement, ep.rank)
        graphs = graphs_enabled(self.device) and ep is None
        # decode graphs pad with rows that write into one scratch block past the usable ones
        model.allocate_kv_cache(cache.num_blocks + (1 if graphs else 0), cache.block_size)
        self.graphs = DecodeGraphs(model, cache.block_size, cache.num_blocks) if graphs else None
        cfg = model.cfg
        dtype = model.embed_tokens.weight.dtype
        host_shape = (
            cfg.num_layers,
            2,
            cache.num_host_blocks,
            cache.block_size,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.host_cache = torch.zeros(host_shape, dtype=dtype)

    def swap(self, out: SchedulerOutput) -> None:
        """Copy swapped-out blocks to the host pool, then swapped-in blocks back (every rank)."""
        if not out.swap_out and not out.swap_in:
            return
        if self.ep is not None:
            self.ep.send(Swap(out.swap_out, out.swap_in))
        self._swap(out.swap_out, out.swap_in)

    def _swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        out_dev, out_host = _columns(swap_out)
        in_host, in_dev = _columns(swap_in)
        for i, layer in enumerate(self.model.decoder_layers):
            attn = layer.self_attn
            for j, cache in enumerate((attn.k_cache, attn.v_cache)):
                self.host_cache[i, j, out_host] = cache[out_dev.to(cache.device)].cpu()
                cache[in_dev.to(cache.device)] = self.host_cache[i, j, in_host].to(cache.device)

    def rebalance(self, placement: Placement) -> int:
        """Switch to a new placement; with real ranks, move the weights (returns bytes moved)."""
        if self.ep is not None:
            self.ep.send(Rebalance(placement))
            return self._move(placement)
        self.placement = placement
        return 0

    def _move(self, placement: Placement) -> int:
        """Every rank: move expert weights to `placement`; the bytes all ranks sent."""
        assert self.ep is not None
        sent = move(self.model, self.placement, placement, self.ep)
        self.placement = placement
        return int(self.ep.gather_stats(torch.tensor([float(sent)], dtype=torch.float64)).sum())

    def serve(self) -> None:
        """Ranks other than 0: run rank 0's commands until it sends None."""
        assert self.ep is not None
        while (command := self.ep.receive()) is not None:
            if isinstance(command, Swap):
                self._swap(command.out, command.into)
            elif isinstance(command, Rebalance):
                self._move(command.placement)
            else:
                with torch.inference_mode():
                    ctx = self._run(command.inp)[1]
                    self._gather(ctx)

    def prepare(self, out: SchedulerOutput, capacity_factor: float | None) -> ModelInput:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        kv_index: list[int] = []
        prefills: list[PrefillSeq] = []
        decodes: list[tuple[int, int, list[int]]] = []
        sample_rows: list[int] = []
        dev = self.device
        for chunk in out.chunks:
            req, start, n = chunk.req, chunk.start, chunk.num_tokens
            row = len(ids)
            table = req.block_table
            ctx_len = start + n
            if n == 1 and start > 0:  # a decode row: most rows, so no range or generator
                ids.append(req.all_token_ids[start])
                positions.append(start)
                kv_index.append(table[start // bs] * bs + start % bs)
                decodes.append((ctx_len, row, table[: -(-ctx_len // bs)]))
            else:
                ids.extend(req.all_token_ids[start:ctx_len])
                pos = range(start, ctx_len)
                positions.extend(pos)
                kv_index.extend(table[p // bs] * bs + p % bs for p in pos)
                blocks = long_tensor(table[: -(-ctx_len // bs)], dev)
                prefills.append(PrefillSeq(row, n, ctx_len, blocks))
            if chunk.sample:
                sample_rows.append(row + n - 1)
        ctx = ForwardContext(
            kv_index=long_tensor(kv_index, dev),
            prefills=prefills,
            decodes=self._decode_groups(decodes),
            token_rank=self.placement.token_ranks(len(ids)).to(dev),
            expert_capacity_factor=capacity_factor,
        )
        return ModelInput(
            input_ids=long_tensor(ids, dev),
            positions=long_tensor(positions, dev),
            ctx=ctx,
            sample_rows=long_tensor(sample_rows, dev),
        )

    def _decode_groups(self, decodes: list[tuple[int, int, list[int]]]) -> list[DecodeGroup]:
        """Sort decode rows by context length and batch neighbours, so padding stays small."""
        decodes.sort()
        rows = long_tensor([r for _, r, _ in decodes], self.device)
        ctx_lens = long_tensor([c for c, _, _ in decodes], self.device)
        groups = []
        for i in range(0, len(decodes), DECODE_GROUP):
            part = decodes[i : i + DECODE_GROUP]
            width = len(part[-1][2])
            tables: list[int] = []
            for _, _, t in part:
                tables += t
                tables += [0] * (width - len(t))
            groups.append(
                DecodeGroup(
                    rows=rows[i : i + DECODE_GROUP],
                    block_tables=long_tensor(tables, self.device).view(len(part), width),
                    ctx_lens=ctx_lens[i : i + DECODE_GROUP],
                )
            )
        return groups

    def _run(self, inp: ModelInput) -> tuple[torch.Tensor, ForwardContext]:
        ctx = inp.ctx
        ctx.placement = self.placement
        if self.ep is not None:
            ctx.ep = self.ep
            ctx.rank_stats = RankStats([0] * self.ep.size, [0] * self.ep.size)
        return self.model(inp.input_ids, inp.positions, ctx), ctx

    def _gather(self, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, MeasuredA2A]:
        """Every rank's step statistics -> (expert counts, dropped, what was measured)."""
        assert self.ep is not None and ctx.rank_stats is not None
        stats, size = ctx.rank_stats, self.ep.size
        counts = torch.stack(ctx.expert_counts).cpu()
        layers = counts.shape[0]
        head = (
            stats.dropped
            + stats.sent_bytes
            + stats.gathered_bytes
            + stats.computed
            + [stats.compute_s]
        )
        mine = torch.cat([torch.tensor(head, dtype=torch.float64), counts.flatten().double()])
        every = self.ep.gather_stats(mine)
        dropped, sent, gathered, computed, seconds, experts = every.split(
            [layers, size, size, layers, 1, counts.numel()], dim=1
        )
        measured = MeasuredA2A(
            bytes=sent.long().tolist(),
            gather_bytes=gathered.long().tolist(),
            computed=computed.long().T,
            compute_ms=[round(s * 1000, 3) for s in seconds.flatten().tolist()],
        )
        return experts.sum(0).long().view_as(counts), dropped.sum(0).long(), measured

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> ForwardResult:
        ctx = inp.ctx
        if self.graphs is not None and self.graphs.eligible(ctx, inp.input_ids.numel()):
            ctx.placement = self.placement
            logits, counts, dropped, pairs = self.graphs.run(
                inp.input_ids, inp.positions, ctx, inp.sample_rows
            )
            return ForwardResult(logits, counts.cpu(), dropped.cpu(), 0.0, pairs.cpu())
        if self.ep is not None:
            self.ep.send(Forward(inp))
        hidden, ctx = self._run(inp)
        logits = self.model.compute_logits(hidden[inp.sample_rows])
        if self.ep is not None:
            counts, dropped, measured = self._gather(ctx)
            return ForwardResult(
                logits, counts, dropped, ctx.moe_total_seconds(), measured=measured
            )
        counts = torch.stack(ctx.expert_counts).cpu()  # waits for the device: timers are done
        dropped = torch.stack(ctx.expert_dropped).cpu()
        pairs = torch.stack(ctx.rank_pairs).cpu()
        return ForwardResult(logits, counts, dropped, ctx.moe_total_seconds(), pairs)
