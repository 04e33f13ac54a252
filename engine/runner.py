"""Model runner: turns a SchedulerOutput into flat input tensors, runs the model, swaps KV."""

from dataclasses import dataclass

import torch

from engine.config import CacheConfig
from engine.decode_graphs import DecodeGraphs, graphs_enabled
from engine.model.context import DecodeGroup, ForwardContext, PrefillSeq
from engine.model.transformer import MoETransformer
from engine.parallel import Placement
from engine.scheduler import SchedulerOutput

DECODE_GROUP = 16


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
class ForwardResult:
    """Logits for the chunks that sample this step, in chunk order, plus MoE statistics
    (on the CPU, whatever the model's device: telemetry reads them right away)."""

    logits: torch.Tensor
    expert_counts: torch.Tensor
    expert_dropped: torch.Tensor
    moe_seconds: float
    graphed: bool = False  # replayed from a decode graph (moe_seconds is then not measured)


class ModelRunner:
    def __init__(self, model: MoETransformer, cache: CacheConfig, device: str) -> None:
        self.model = model
        self.block_size = cache.block_size
        self.device = torch.device(device)
        graphs = graphs_enabled(self.device)
        # decode graphs pad with rows that write into one scratch block past the usable ones
        model.allocate_kv_cache(cache.num_blocks + (1 if graphs else 0), cache.block_size)
        self.graphs = DecodeGraphs(model, cache.block_size, cache.num_blocks) if graphs else None
        cfg = model.cfg
        dtype = model.embed_tokens.weight.dtype
        host_shape = (cfg.num_layers, 2, cache.num_host_blocks, cache.block_size,
                      cfg.num_kv_heads, cfg.head_dim)
        self.host_cache = torch.zeros(host_shape, dtype=dtype)

    def swap(self, out: SchedulerOutput) -> None:
        """Copy swapped-out blocks to the host pool, then swapped-in blocks back."""
        if not out.swap_out and not out.swap_in:
            return
        out_dev, out_host = _columns(out.swap_out)
        in_host, in_dev = _columns(out.swap_in)
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            for j, cache in enumerate((attn.k_cache, attn.v_cache)):
                self.host_cache[i, j, out_host] = cache[out_dev.to(cache.device)].cpu()
                cache[in_dev.to(cache.device)] = self.host_cache[i, j, in_host].to(cache.device)

    def prepare(
        self, out: SchedulerOutput, capacity_factor: float | None, placement: Placement
    ) -> ModelInput:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefills: list[PrefillSeq] = []
        decodes: list[tuple[int, int, list[int]]] = []
        sample_rows: list[int] = []
        for chunk in out.chunks:
            req, start, n = chunk.req, chunk.start, chunk.num_tokens
            row = len(ids)
            ids.extend(req.all_token_ids[start : start + n])
            pos = range(start, start + n)
            positions.extend(pos)
            table = req.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            ctx_len = start + n
            if n == 1 and start > 0:
                decodes.append((ctx_len, row, table[: -(-ctx_len // bs)]))
            else:
                blocks = torch.tensor(table[: -(-ctx_len // bs)], device=self.device)
                prefills.append(PrefillSeq(row, n, ctx_len, blocks))
            if chunk.sample:
                sample_rows.append(row + n - 1)
        dev = self.device
        ctx = ForwardContext(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            prefills=prefills,
            decodes=self._decode_groups(decodes),
            token_rank=placement.token_ranks(len(ids)).to(dev),
            ep_size=placement.ep_size,
            expert_capacity_factor=capacity_factor,
        )
        return ModelInput(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            ctx=ctx,
            sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=dev),
        )

    def _decode_groups(self, decodes: list[tuple[int, int, list[int]]]) -> list[DecodeGroup]:
        """Sort decode rows by context length and batch neighbours, so padding stays small."""
        decodes.sort()
        groups = []
        for i in range(0, len(decodes), DECODE_GROUP):
            part = decodes[i : i + DECODE_GROUP]
            width = len(part[-1][2])
            tables = [t + [0] * (width - len(t)) for _, _, t in part]
            groups.append(DecodeGroup(
                rows=torch.tensor([r for _, r, _ in part], device=self.device),
                block_tables=torch.tensor(tables, device=self.device),
                ctx_lens=torch.tensor([c for c, _, _ in part], device=self.device),
            ))
        return groups

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> ForwardResult:
        ctx = inp.ctx
        if self.graphs is not None and self.graphs.eligible(ctx, inp.input_ids.numel()):
            logits, counts, dropped = self.graphs.run(
                inp.input_ids, inp.positions, ctx, inp.sample_rows
            )
            return ForwardResult(logits, counts.cpu(), dropped.cpu(), 0.0, graphed=True)
        hidden = self.model(inp.input_ids, inp.positions, ctx)
        logits = self.model.compute_logits(hidden[inp.sample_rows])
        counts = torch.stack(ctx.expert_counts).cpu()  # waits for the device: timers are done
        dropped = torch.stack(ctx.expert_dropped).cpu()
        return ForwardResult(logits, counts, dropped, moe_seconds=ctx.moe_total_seconds())
