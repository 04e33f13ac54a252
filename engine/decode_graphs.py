"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

A step whose chunks are all decodes is padded up to the next size in SIZES and run on static
buffers: token ids, positions, KV cache indices, block tables at the model's full width, context
lengths, ranks and a row mask. Padding rows write their K/V (MLA: their latent) into a
scratch block (one block past those the block manager hands out) and attend to it alone; MoE
layers leave them out of their expert counts and DeepSeek's group counts. A graph is captured
on the first step of its size, for the backends in force then. Eligible steps: Triton decode
attention, GQA (kernels.triton_attention) or MLA (kernels.triton_mla), whose work follows the
context lengths, not the padded table width; no expert capacity factor and not the per-expert
loop MoE backend (both need host syncs); at most SIZES[-1] rows. The MoE time of a replayed
step is not measured (reported as 0).

MOESCOPE_DECODE_GRAPHS=0 turns graphs off on CUDA; =1 on the CPU runs the same padded path
eagerly (nothing is captured), so that the padding is tested without a GPU.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model.context import DecodeGroup, ForwardContext
from engine.model.transformer import MoETransformer
from kernels import attn_backend, moe_backend

SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def graphs_enabled(device: torch.device) -> bool:
    """On by default on CUDA; MOESCOPE_DECODE_GRAPHS=0|1 decides otherwise."""
    flag = os.environ.get("MOESCOPE_DECODE_GRAPHS")
    return device.type == "cuda" if flag is None else flag == "1"


@dataclass
class _Graph:
    replay: Callable[[], None]
    logits: torch.Tensor
    counts: torch.Tensor
    dropped: torch.Tensor
    rank_pairs: torch.Tensor
    groups: torch.Tensor | None = None  # [MoE layers, groups] under DeepSeek's group routing


class DecodeGraphs:
    """Static decode buffers and the graphs captured over them, keyed by padded size."""

    def __init__(
        self, model: MoETransformer, block_size: int, scratch_block: int, window_blocks: int = 0
    ) -> None:
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self.scratch_block = scratch_block
        self.block_size = block_size
        self.scratch_index = scratch_block * block_size
        width = -(-model.cfg.max_model_len // block_size)
        n, dev, long = SIZES[-1], self.device, torch.long
        self.ids = torch.zeros(n, dtype=long, device=dev)
        self.positions = torch.zeros(n, dtype=long, device=dev)
        self.kv_index = torch.zeros(n, dtype=long, device=dev)
        self.tables = torch.zeros(n, width, dtype=long, device=dev)
        # the sliding layers' own pool (engine.window_pool): its tables, index and scratch
        self.window_scratch = window_blocks
        self.window_kv_index = torch.zeros(n, dtype=long, device=dev) if window_blocks else None
        self.window_tables = (
            torch.zeros(n, width, dtype=long, device=dev) if window_blocks else None
        )
        self.lens = torch.ones(n, dtype=long, device=dev)
        self.ranks = torch.zeros(n, dtype=long, device=dev)
        self.valid = torch.zeros(n, dtype=torch.bool, device=dev)
        self.rows = torch.arange(n, device=dev)
        self.graphs: dict[tuple[int, int, str, str], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None

    def eligible(self, ctx: ForwardContext, num_rows: int) -> bool:
        return (
            not ctx.prefills
            and ctx.expert_capacity_factor is None
            and ctx.ep is None
            and 0 < num_rows <= SIZES[-1]
            and attn_backend(self.device) == "triton"
            and self._moe() in ("triton", "torch")  # the others read counts on the host
        )

    def _moe(self) -> str:
        return moe_backend(self.device, self.dtype)

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        sample_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logits of sample_rows, expert counts, dropped, rank pairs, group counts or None)
        for one decode step."""
        n = input_ids.numel()
        size = next(s for s in SIZES if s >= n)
        self._fill(input_ids, positions, ctx, n, size)
        assert ctx.placement is not None
        key = (size, ctx.placement.version, self._moe(), attn_backend(self.device))
        graph = self.graphs.get(key) or self._capture(key, ctx)
        graph.replay()
        return (
            graph.logits[sample_rows],
            graph.counts.clone(),
            graph.dropped.clone(),
            graph.rank_pairs.clone(),
            None if graph.groups is None else graph.groups.clone(),
        )

    def _fill(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        n: int,
        size: int,
    ) -> None:
        """Copy the step into the static buffers; rows n..size become padding."""
        self.ids[:n].copy_(input_ids)
        self.ids[n:size].zero_()
        self.positions[:n].copy_(positions)
        self.positions[n:size].zero_()
        self.kv_index[:n].copy_(ctx.kv_index)
        self.kv_index[n:size].fill_(self.scratch_index)
        self.tables[:size].fill_(self.scratch_block)
        self.lens[:size].fill_(1)
        for group in ctx.decodes:
            self.tables[group.rows, : group.block_tables.shape[1]] = group.block_tables
            self.lens[group.rows] = group.ctx_lens
        if self.window_tables is not None and self.window_kv_index is not None:
            assert ctx.window_kv_index is not None
            self.window_kv_index[:n].copy_(ctx.window_kv_index)
            self.window_kv_index[n:size].fill_(self.window_scratch * self.block_size)
            self.window_tables[:size].fill_(self.window_scratch)
            for group in ctx.decodes:
                assert group.window_tables is not None
                width = group.window_tables.shape[1]
                self.window_tables[group.rows, :width] = group.window_tables
        self.ranks[:n].copy_(ctx.token_rank)
        self.ranks[n:size].zero_()
        self.valid[:n].fill_(True)
        self.valid[n:size].fill_(False)

    def _capture(self, key: tuple[int, int, str, str], step: ForwardContext) -> _Graph:
        size = key[0]
        ctx = ForwardContext(
            kv_index=self.kv_index[:size],
            prefills=[],
            decodes=[DecodeGroup(self.rows[:size], self.tables[:size], self.lens[:size])],
            token_rank=self.ranks[:size],
            placement=step.placement,
            row_valid=self.valid[:size],
        )
        if self.window_tables is not None and self.window_kv_index is not None:
            ctx.window_kv_index = self.window_kv_index[:size]
            ctx.decodes[0].window_tables = self.window_tables[:size]

        def forward() -> tuple[torch.Tensor, ...]:
            for stats in (ctx.expert_counts, ctx.expert_dropped, ctx.rank_pairs, ctx.group_counts):
                stats.clear()
            hidden = self.model(self.ids[:size], self.positions[:size], ctx)
            groups = [torch.stack(ctx.group_counts)] if ctx.group_counts else []
            return (
                self.model.compute_logits(hidden),
                torch.stack(ctx.expert_counts),
                torch.stack(ctx.expert_dropped),
                torch.stack(ctx.rank_pairs),
                *groups,
            )

        if self.pool is None:
            outputs = forward()

            def replay() -> None:
                for static, fresh in zip(outputs, forward(), strict=True):
                    static.copy_(fresh)

            graph = _Graph(replay, *outputs)
        else:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile the Triton kernels, warm up the libraries
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            cuda_graph = torch.cuda.CUDAGraph()
            # thread_local: with overlap the engine thread plans the next step meanwhile, and
            # a CUDA call of its own (a pinned buffer, a generator) must not void this capture
            with torch.cuda.graph(cuda_graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = forward()
            graph = _Graph(cuda_graph.replay, *outputs)
        self.graphs[key] = graph
        return graph
