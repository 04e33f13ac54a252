"""The running requests' block tables, kept on the model's device from step to step (the
persistent batch): one row per batch slot, written only where it changed."""

import array

import torch


class BlockTables:
    """The block tables of the running requests, one row per batch slot, kept on the model's
    device from step to step. A row is written only when its slot changed hands or its
    request took new blocks, so a step's cost does not grow with the requests' lengths.
    The engine thread notes the writes (`track`); the compute thread makes them (`apply`)
    before the step's forward pass, after the previous one has read the tables."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.width = width
        self.device = device
        self.tables = torch.zeros(0, width, dtype=torch.long, device=device)
        self.source: list[list[int] | None] = []  # the block_table list a row was written from
        self.written: list[int] = []  # entries of it written

    def track(self, slot: int, table: list[int], writes: tuple[array.array, ...]) -> None:
        """Note the entries of `slot`'s row that differ from what the device holds."""
        if slot >= len(self.source):
            grow = slot + 1 - len(self.source)
            self.source += [None] * grow
            self.written += [0] * grow
        n = len(table)
        first = self.written[slot]
        if self.source[slot] is not table or n < first:  # a new request, or a new table
            self.source[slot], first = table, 0
        if n > first:
            slots, cols, blocks = writes
            slots.extend([slot] * (n - first))
            cols.extend(range(first, n))
            blocks.extend(table[first:n])
            self.written[slot] = n

    def apply(
        self, rows: int, slots: torch.Tensor, cols: torch.Tensor, blocks: torch.Tensor
    ) -> None:
        """Grow to `rows` slots and write the noted entries (compute thread)."""
        have = self.tables.shape[0]
        if rows > have:
            more = torch.zeros(max(rows, 2 * have) - have, self.width, dtype=torch.long)
            self.tables = torch.cat([self.tables, more.to(self.device)])
        if slots.numel():
            self.tables[slots, cols] = blocks
