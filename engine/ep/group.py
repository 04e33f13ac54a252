"""The expert-parallel process group: rank 0's commands, all-to-all of tokens, step statistics.

Two torch.distributed groups over the same ranks: the default one (gloo on the CPU, NCCL for
CUDA tensors) carries tokens and statistics with a bounded timeout, so a stuck rank surfaces
as an error; a gloo `control` group carries rank 0's commands, on which idle ranks may wait
indefinitely. A rank that exits closes its connections and the others' next collective fails
at once ("Connection closed by peer").
"""

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

IDLE_TIMEOUT = timedelta(days=365)


class EPGroup:
    """This process's membership of the expert-parallel group."""

    def __init__(
        self, rank: int, size: int, init_method: str, timeout_s: float, device: str
    ) -> None:
        if dist.is_initialized():
            raise RuntimeError(
                "this process already belongs to an expert-parallel group: "
                "close() the other distributed engine first"
            )
        backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s),
        )
        self.control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self.rank = rank
        self.size = size
        self.device = device  # this rank's

    def send(self, command: Any) -> None:
        """Rank 0: hand every other rank its next command."""
        dist.broadcast_object_list([command], src=0, group=self.control)

    def receive(self) -> Any:
        """Other ranks: wait for rank 0's next command."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def all_to_all(self, rows: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
        """Rows [n, ...] split by `send` per destination -> rows received, by source rank."""
        shape = rows.shape[1:]
        wire = rows.contiguous().reshape(rows.shape[0], shape.numel()).view(torch.uint8)
        out = wire.new_empty((sum(receive), wire.shape[1]))
        dist.all_to_all_single(out, wire, receive, send)
        return out.view(rows.dtype).reshape(out.shape[0], *shape)

    def exchange_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """counts [size, m] for each destination -> [size, m] from each source."""
        out = torch.empty_like(counts)
        dist.all_to_all_single(out, counts.contiguous())
        return out

    def all_gather_rows(self, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Every rank's rows (rank r has sizes[r] of them), concatenated in rank order."""
        width = max(sizes)
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])

    def gather_stats(self, stats: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D float64 statistics of the step, stacked [size, m]."""
        parts = [torch.empty_like(stats) for _ in range(self.size)]
        dist.all_gather(parts, stats)
        return torch.stack(parts)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
