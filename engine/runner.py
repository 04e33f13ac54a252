"""Model runner: turns a SchedulerOutput into flat input tensors, runs the model, swaps KV."""

from dataclasses import dataclass

import torch

from engine.config import CacheConfig
from engine.model.context import ForwardContext, PrefillSeq
from engine.model.transformer import MoETransformer
from engine.parallel import Placement
from engine.scheduler import SchedulerOutput


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    ctx: ForwardContext
    sample_rows: torch.Tensor


@dataclass
class ForwardResult:
    """Logits for the chunks that sample this step, in chunk order, plus MoE statistics."""

    logits: torch.Tensor
    expert_counts: torch.Tensor
    expert_dropped: torch.Tensor
    moe_seconds: float


class ModelRunner:
    def __init__(self, model: MoETransformer, cache: CacheConfig, device: str) -> None:
        self.model = model
        self.block_size = cache.block_size
        self.device = torch.device(device)
        model.allocate_kv_cache(cache.num_blocks, cache.block_size)
        cfg = model.cfg
        dtype = model.embed_tokens.weight.dtype
        host_shape = (cfg.num_layers, 2, cache.num_host_blocks, cache.block_size,
                      cfg.num_kv_heads, cfg.head_dim)
        self.host_cache = torch.zeros(host_shape, dtype=dtype)

    def swap(self, out: SchedulerOutput) -> None:
        """Copy swapped-out blocks to the host pool, then swapped-in blocks back."""
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            for j, cache in enumerate((attn.k_cache, attn.v_cache)):
                for dev, host in out.swap_out:
                    self.host_cache[i, j, host].copy_(cache[dev])
                for host, dev in out.swap_in:
                    cache[dev].copy_(self.host_cache[i, j, host])

    def prepare(
        self, out: SchedulerOutput, capacity_factor: float | None, placement: Placement
    ) -> ModelInput:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefills: list[PrefillSeq] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
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
                decode_rows.append(row)
                decode_tables.append(table[: -(-ctx_len // bs)])
                decode_lens.append(ctx_len)
            else:
                blocks = torch.tensor(table[: -(-ctx_len // bs)], device=self.device)
                prefills.append(PrefillSeq(row, n, ctx_len, blocks))
            if chunk.sample:
                sample_rows.append(row + n - 1)
        width = max((len(t) for t in decode_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in decode_tables]
        dev = self.device
        ctx = ForwardContext(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            prefills=prefills,
            decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=dev),
            decode_block_tables=torch.tensor(padded, dtype=torch.long, device=dev).view(
                len(padded), width
            ),
            decode_ctx_lens=torch.tensor(decode_lens, dtype=torch.long, device=dev),
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

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> ForwardResult:
        hidden = self.model(inp.input_ids, inp.positions, inp.ctx)
        logits = self.model.compute_logits(hidden[inp.sample_rows])
        ctx = inp.ctx
        return ForwardResult(
            logits=logits,
            expert_counts=torch.stack(ctx.expert_counts),
            expert_dropped=torch.stack(ctx.expert_dropped),
            moe_seconds=ctx.moe_seconds,
        )
