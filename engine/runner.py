"""Model runner: plans a step's flat batch on the host (persistent block tables, one copy to the
device), runs the model, samples on the device and copies results back once; swaps KV."""

import array
import time

import torch

from engine.block_tables import BlockTables
from engine.config import CacheConfig
from engine.decode_graphs import DecodeGraphs, graphs_enabled
from engine.ep.group import EPGroup
from engine.ep.placement import Placement
from engine.ep.weights import move, shard
from engine.model.context import DecodeGroup, ForwardContext, PrefillSeq, RankStats
from engine.model.transformer import MoETransformer
from engine.sampling import Sampled, SampleSpec, sample_on_device, to_host
from engine.scheduler import SchedulerOutput
from engine.step_records import (
    SEGMENTS,
    Executed,
    Forward,
    ForwardResult,
    MeasuredA2A,
    ModelInput,
    PrefillSpec,
    Rebalance,
    StepPlan,
    Swap,
)

DECODE_GROUP = 16
# the block-table writes of the sliding layers' pool (engine.window_pool), when it has one
WINDOW_SEGMENTS = ("window_write_slots", "window_write_cols", "window_write_blocks")
Pairs = list[tuple[int, int]]


def _host(values: array.array) -> torch.Tensor:
    """A host tensor over an int64 array's buffer (no copy): torch reads a list of ints at
    about 0.2 µs an element, an array's buffer at a fraction of that."""
    if not values:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(values, dtype=torch.long)


def _columns(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    cols = torch.tensor(pairs, dtype=torch.long).view(-1, 2)
    return cols[:, 0], cols[:, 1]


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
        scratch = 1 if graphs else 0
        window_blocks = cache.window_blocks + scratch if cache.window_blocks else 0
        model.allocate_kv_cache(cache.num_blocks + scratch, cache.block_size, window_blocks)
        self.window_pool_layers = model.window_pool_layers(window_blocks)
        self.graphs = (
            DecodeGraphs(model, cache.block_size, cache.num_blocks, cache.window_blocks)
            if graphs
            else None
        )
        width = -(-model.cfg.max_model_len // cache.block_size)
        self.tables = BlockTables(width, self.device)
        # the sliding layers' own block tables, when they have their own pool
        self.window_tables = BlockTables(width, self.device) if cache.window_blocks else None
        self.segments = SEGMENTS + (WINDOW_SEGMENTS if cache.window_blocks else ())
        # pinned host buffers for the step's one copy to a GPU, two so that the next step's
        # plan can be staged while the copy of the step before may still be reading its own
        self._staging = [torch.empty(0, dtype=torch.long) for _ in range(2)]
        self._staged = 0
        # one host tensor per device cache tensor (K and V, or MLA's latents), blocks first
        self.host_cache = [
            [torch.zeros((cache.num_host_blocks, *c.shape[1:]), dtype=c.dtype) for c in caches]
            for caches in model.kv_caches()
        ]

    def swap(self, swap_out: Pairs, swap_in: Pairs, window_out: Pairs, window_in: Pairs) -> None:
        """Copy swapped-out blocks to the host pool, then swapped-in blocks back (every rank);
        `window_*`: the copies of the sliding layers' pool, when it has one."""
        if not swap_out and not swap_in:
            return
        if self.ep is not None:
            self.ep.send(Swap(swap_out, swap_in, window_out, window_in))
        self._swap(swap_out, swap_in, window_out, window_in)

    def _swap(self, swap_out: Pairs, swap_in: Pairs, window_out: Pairs, window_in: Pairs) -> None:
        pools = {False: (_columns(swap_out), _columns(swap_in))}
        if self.window_tables is not None:
            pools[True] = (_columns(window_out), _columns(window_in))
        layers = zip(self.host_cache, self.model.kv_caches(), self.window_pool_layers, strict=True)
        for hosts, caches, in_window in layers:
            (out_dev, out_host), (in_host, in_dev) = pools[in_window]
            for host, cache in zip(hosts, caches, strict=True):
                host[out_host] = cache[out_dev.to(cache.device)].cpu()
                cache[in_dev.to(cache.device)] = host[in_host].to(cache.device)

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
                self._swap(command.out, command.into, command.window_out, command.window_into)
            elif isinstance(command, Rebalance):
                self._move(command.placement)
            else:
                with torch.inference_mode():
                    ctx = self._run(command.inp)[1]
                    self._gather(ctx)

    def prepare(
        self, out: SchedulerOutput, capacity_factor: float | None, sample: SampleSpec
    ) -> StepPlan:
        """The step's batch as host arrays (engine thread): a few appends per row, and block
        table entries only where they changed."""
        bs = self.block_size
        seg = {name: array.array("q") for name in self.segments}
        ids, positions, row_slots = seg["ids"], seg["positions"], seg["row_slots"]
        decode_rows, sample_rows = seg["decode_rows"], seg["sample_rows"]
        fill_rows, fill_from = seg["fill_rows"], seg["fill_from"]
        writes = (seg["write_slots"], seg["write_cols"], seg["write_blocks"])
        tables = self.tables
        source, written = tables.source, tables.written
        window_tables = self.window_tables
        if window_tables is not None:
            window_writes = tuple(seg[name] for name in WINDOW_SEGMENTS)
        prefills: list[PrefillSpec] = []
        for chunk in out.chunks:
            req, start, n, slot = chunk.req, chunk.start, chunk.num_tokens, chunk.slot
            row = len(ids)
            table = req.block_table
            # most steps change no row: the check inline, the writes in `track`
            if slot >= len(source) or source[slot] is not table or written[slot] != len(table):
                tables.track(slot, table, writes)
            if window_tables is not None:
                window_tables.track(slot, req.window_table, window_writes)
            known = req.all_token_ids
            if n == 1 and start > 0:  # a decode row: most rows, so no range or slice
                if start < len(known):
                    ids.append(known[start])
                else:  # the step in flight is sampling it
                    ids.append(0)
                    fill_rows.append(row)
                    fill_from.append(req.sample_index)
                positions.append(start)
                row_slots.append(slot)
                decode_rows.append(row)
            else:
                ctx_len = start + n
                assert ctx_len <= len(known), "a prefill chunk cannot hold a token in flight"
                ids.extend(known[start:ctx_len])
                positions.extend(range(start, ctx_len))
                row_slots.extend(array.array("q", [slot]) * n)
                prefills.append(PrefillSpec(row, n, ctx_len, slot, -(-ctx_len // bs)))
            if chunk.sample:
                sample_rows.append(row + n - 1)
        parts = {name: _host(values) for name, values in seg.items()}
        widths = self._sort_decodes(parts)
        return StepPlan(
            num_rows=len(ids),
            packed=torch.cat([parts[name] for name in self.segments]),
            sizes=[parts[name].numel() for name in self.segments],
            widths=widths,
            prefills=prefills,
            table_rows=len(source),
            placement=self.placement,
            capacity_factor=capacity_factor,
            sample=sample,
            swap_out=out.swap_out,
            swap_in=out.swap_in,
            window_swap_out=out.window_swap_out,
            window_swap_in=out.window_swap_in,
        )

    def _sort_decodes(self, parts: dict[str, torch.Tensor]) -> list[int]:
        """Decode rows with their context lengths and slots, sorted by context length so that
        each group of DECODE_GROUP neighbours pads little; the block-table width of each
        group."""
        rows = parts["decode_rows"]
        if not rows.numel():
            return []
        lens, order = torch.sort(parts["positions"][rows] + 1, stable=True)
        rows = rows[order]
        parts["decode_rows"], parts["decode_lens"] = rows, lens
        parts["decode_slots"] = parts["row_slots"][rows]
        n = lens.numel()
        ends = torch.arange(DECODE_GROUP - 1, n + DECODE_GROUP - 1, DECODE_GROUP).clamp(max=n - 1)
        longest = lens[ends]
        return ((longest + self.block_size - 1) // self.block_size).tolist()

    def _to_device(self, packed: torch.Tensor) -> torch.Tensor:
        """The step's one host-to-device copy (nothing to copy on the CPU)."""
        if self.device.type == "cpu":
            return packed
        self._staged ^= 1
        staging = self._staging[self._staged]
        if staging.numel() < packed.numel():
            staging = torch.empty(2 * packed.numel(), dtype=torch.long, pin_memory=True)
            self._staging[self._staged] = staging
        staging[: packed.numel()].copy_(packed)
        return staging[: packed.numel()].to(self.device, non_blocking=True)

    def materialize(self, plan: StepPlan, previous: torch.Tensor | None) -> ModelInput:
        """Device tensors for a plan (compute thread, once the step before has run):
        `previous` holds the tokens that step sampled."""
        dev = self._to_device(plan.packed)
        seg = dict(zip(self.segments, dev.split(plan.sizes), strict=True))
        self.tables.apply(
            plan.table_rows, seg["write_slots"], seg["write_cols"], seg["write_blocks"]
        )
        window = self.window_tables
        if window is not None:
            window.apply(plan.table_rows, *(seg[name] for name in WINDOW_SEGMENTS))
        ids, positions, fill_rows = seg["ids"], seg["positions"], seg["fill_rows"]
        if fill_rows.numel():
            assert previous is not None
            ids[fill_rows] = previous[seg["fill_from"]]
        tables, bs = self.tables.tables, self.block_size
        row_slots, block_cols, offsets = seg["row_slots"], positions // bs, positions % bs
        kv_index = tables[row_slots, block_cols] * bs + offsets
        wtables = None if window is None else window.tables
        window_kv_index = None if wtables is None else wtables[row_slots, block_cols] * bs + offsets
        decodes = []
        if plan.widths:
            rows, lens, slots = seg["decode_rows"], seg["decode_lens"], seg["decode_slots"]
            widest = max(plan.widths)
            picked = tables[:, :widest].index_select(0, slots)
            wpicked = None if wtables is None else wtables[:, :widest].index_select(0, slots)
            for i, width in enumerate(plan.widths):
                part = slice(i * DECODE_GROUP, (i + 1) * DECODE_GROUP)
                group = DecodeGroup(rows[part], picked[part, :width], lens[part])
                if wpicked is not None:
                    group.window_tables = wpicked[part, :width]
                decodes.append(group)
        prefills = [
            PrefillSeq(
                p.row,
                p.q_len,
                p.ctx_len,
                tables[p.slot, : p.num_blocks],
                None if wtables is None else wtables[p.slot, : p.num_blocks],
            )
            for p in plan.prefills
        ]
        ctx = ForwardContext(
            kv_index=kv_index,
            prefills=prefills,
            decodes=decodes,
            token_rank=plan.placement.token_ranks(plan.num_rows).to(self.device),
            window_kv_index=window_kv_index,
            expert_capacity_factor=plan.capacity_factor,
        )
        return ModelInput(ids, positions, ctx, seg["sample_rows"])

    @torch.inference_mode()
    def execute(self, plan: StepPlan, previous: torch.Tensor | None) -> Executed:
        """Run a planned step on this thread: swaps, inputs, forward, sampling on the device,
        then one device-to-host copy of the tokens, logprobs and MoE statistics."""
        started = time.perf_counter()
        self.swap(plan.swap_out, plan.swap_in, plan.window_swap_out, plan.window_swap_in)
        if not plan.num_rows:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            return Executed(empty, Sampled([], []), None, started, time.perf_counter())
        result = self.forward(self.materialize(plan, previous))
        out = sample_on_device(result.logits, plan.sample)
        measured = result.measured
        stats = [result.expert_counts, result.expert_dropped]
        if result.rank_pairs is not None:
            stats.append(result.rank_pairs)
        parts = [
            out.tokens,
            out.chosen_logprobs.double().view(torch.long),
            out.top_ids,
            out.top_logprobs.double().view(torch.long),
            *stats,
        ]
        host = torch.cat([p.to(self.device).flatten() for p in parts]).cpu()
        pieces = host.split([p.numel() for p in parts])
        tokens, chosen, top_ids, top_values = pieces[:4]
        shape = out.top_ids.shape
        sampled = to_host(
            plan.sample,
            tokens.tolist(),
            chosen.view(torch.float64).tolist(),
            top_ids.view(shape).tolist(),
            top_values.view(torch.float64).view(shape).tolist(),
        )
        counts, dropped, *pairs = (p.view(s.shape) for p, s in zip(pieces[4:], stats, strict=True))
        moe_s = result.ctx.moe_total_seconds() if result.ctx is not None else result.moe_seconds
        host_result = ForwardResult(
            result.logits,
            counts,
            dropped,
            moe_s,
            pairs[0] if pairs else None,
            measured,
            group_counts=None if result.group_counts is None else result.group_counts.cpu(),
        )
        return Executed(out.tokens, sampled, host_result, started, time.perf_counter())

    def _run(self, inp: ModelInput) -> tuple[torch.Tensor, ForwardContext]:
        ctx = inp.ctx
        ctx.placement = self.placement
        if self.ep is not None:
            ctx.ep = self.ep
            ctx.rank_stats = RankStats([0] * self.ep.size, [0] * self.ep.size)
        return self.model(inp.input_ids, inp.positions, ctx), ctx

    def _gather(
        self, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor, MeasuredA2A, torch.Tensor | None]:
        """Every rank's step statistics -> (expert counts, dropped, what was measured, chosen
        groups: each rank routes its own rows, so its group counts are summed like experts')."""
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
        groups = torch.stack(ctx.group_counts).cpu() if ctx.group_counts else counts[:0]
        mine = torch.cat(
            [torch.tensor(head, dtype=torch.float64), counts.flatten().double()]
            + [groups.flatten().double()]
        )
        every = self.ep.gather_stats(mine)
        dropped, sent, gathered, computed, seconds, experts, chosen = every.split(
            [layers, size, size, layers, 1, counts.numel(), groups.numel()], dim=1
        )
        measured = MeasuredA2A(
            bytes=sent.long().tolist(),
            gather_bytes=gathered.long().tolist(),
            computed=computed.long().T,
            compute_ms=[round(s * 1000, 3) for s in seconds.flatten().tolist()],
        )
        chosen_sum = chosen.sum(0).long().view_as(groups) if ctx.group_counts else None
        return experts.sum(0).long().view_as(counts), dropped.sum(0).long(), measured, chosen_sum

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> ForwardResult:
        ctx = inp.ctx
        if self.graphs is not None and self.graphs.eligible(ctx, inp.input_ids.numel()):
            ctx.placement = self.placement
            logits, counts, dropped, pairs, groups = self.graphs.run(
                inp.input_ids, inp.positions, ctx, inp.sample_rows
            )
            return ForwardResult(logits, counts, dropped, 0.0, pairs, group_counts=groups)
        if self.ep is not None:
            self.ep.send(Forward(inp))
        hidden, ctx = self._run(inp)
        logits = self.model.compute_logits(hidden[inp.sample_rows])
        if self.ep is not None:
            counts, dropped, measured, groups = self._gather(ctx)
            return ForwardResult(
                logits, counts, dropped, 0.0, measured=measured, ctx=ctx, group_counts=groups
            )
        counts = torch.stack(ctx.expert_counts)
        dropped = torch.stack(ctx.expert_dropped)
        pairs = torch.stack(ctx.rank_pairs)
        groups = torch.stack(ctx.group_counts) if ctx.group_counts else None
        return ForwardResult(logits, counts, dropped, 0.0, pairs, ctx=ctx, group_counts=groups)
