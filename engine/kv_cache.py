"""Paged KV cache bookkeeping: blocks, block tables, prefix caching, swap pool, capacity limit."""

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.request import Request


@dataclass(frozen=True)
class KVStats:
    """Block counts at one moment (device and host pools) and prefix-cache lookups so far."""

    block_size: int
    total: int
    usable: int
    used: int
    cached: int
    free: int
    host_total: int
    host_used: int
    prefix_queries: int
    prefix_hits: int
    # sliding layers' own pool (engine.window_pool), when the model has sliding layers:
    # blocks it does not hold because they fell behind the window (used here, not there)
    behind_window: int = 0
    window_total: int = 0
    window_used: int = 0

    @property
    def usage(self) -> float:
        """Used share of the usable blocks."""
        return round(self.used / self.usable, 4) if self.usable else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache, as a share of those looked up."""
        return round(self.prefix_hits / self.prefix_queries, 4) if self.prefix_queries else 0.0


class OutOfBlocks(RuntimeError):
    """Raised when an allocation is attempted without enough usable blocks."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


class Blocks(dict[int, Block]):
    """Block records by id, each made on first use: the twin builds a BlockManager for every
    simulated run, and making thousands of records up front cost it a tenth of a run."""

    def __missing__(self, block_id: int) -> Block:
        block = self[block_id] = Block(block_id)
        return block


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block, chained on the hash of the block before it."""
    return hash((parent, token_ids))


class BlockManager:
    """Allocates fixed-size KV blocks to requests and keeps full blocks for prefix reuse.

    Every block is in exactly one state: used (ref_count > 0), cached (ref_count 0 but
    holding a hashed full block, evictable in least-recently-used order) or free.
    Allocation keeps used + cached within `usable`, evicting cached blocks when needed.
    A model with sliding layers has a second pool for them (engine.window_pool.WindowedBlocks,
    a BlockManager that owns it); the scheduler asks the `fits`, `window_fits`, `can_swap_in`
    and `*_all` methods, which that one answers for both pools.
    """

    window = 0  # positions a sliding layer reads (0: no sliding layer, one pool)

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int,
        prefix_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.blocks = Blocks()
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[int, int] = {}
        self.num_host_blocks = num_host_blocks
        self.host_free: deque[int] = deque(range(num_host_blocks))
        self.prefix_caching = prefix_caching
        self.usable = num_blocks
        self.num_used = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def total(self) -> int:
        return self.num_blocks

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    @property
    def num_free(self) -> int:
        return self.total - self.num_used - self.num_cached

    @property
    def num_allocatable(self) -> int:
        """Blocks that can still be handed out (free within the usable area, or evictable)."""
        return max(0, self.usable - self.num_used)

    def stats(self, running: Iterable[Request] = ()) -> KVStats:
        """Block counts now (`running`: the requests running, for a pool that needs them)."""
        return KVStats(
            block_size=self.block_size,
            total=self.total,
            usable=self.usable,
            used=self.num_used,
            cached=self.num_cached,
            free=self.num_free,
            host_total=self.num_host_blocks,
            host_used=self.num_host_blocks - len(self.host_free),
            prefix_queries=self.prefix_queries,
            prefix_hits=self.prefix_hits,
        )

    def set_usable(self, usable: int) -> None:
        self.usable = usable
        self._trim()

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        total = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(req.block_table))

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _block_hashes(self, req: Request, num_full: int) -> list[int]:
        hashes = req.block_hashes
        bs = self.block_size
        while len(hashes) < num_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, tuple(req.all_token_ids[i * bs : (i + 1) * bs])))
        return hashes

    def prefix_match(self, req: Request) -> list[int]:
        """Cached blocks holding the request's leading full blocks; leaves one token to compute."""
        if not self.prefix_caching:
            return []
        num_full = (req.num_tokens - 1) // self.block_size
        matched = []
        for i, h in enumerate(self._block_hashes(req, num_full)):
            block_id = self.cached_block(req, i, h)
            if block_id is None:
                break
            matched.append(block_id)
        return matched

    def cached_block(self, req: Request, i: int, block_hash: int) -> int | None:
        """The cached block holding the request's block `i` (chain hash `block_hash`), its
        tokens checked one by one: a hash collision is no hit."""
        block_id = self.hash_to_block.get(block_hash)
        bs = self.block_size
        if block_id is None or self.blocks[block_id].token_ids != tuple(
            req.all_token_ids[i * bs : (i + 1) * bs]
        ):
            return None
        return block_id

    def admit(self, req: Request, matched: list[int]) -> None:
        """Give a fresh request its prefix-cache hits; its computed tokens start after them."""
        self.prefix_queries += req.num_tokens
        self.prefix_hits += len(matched) * self.block_size
        self.share(matched)
        req.block_table = list(matched)
        req.num_hashed_blocks = len(matched)
        req.num_computed_tokens = len(matched) * self.block_size

    def share(self, block_ids: list[int]) -> None:
        """Take one more reference on each block (a cached one is used again)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.cached.pop(block_id)
                self.num_used += 1
            block.ref_count += 1

    def hit_blocks_in_use(self, matched: list[int]) -> int:
        """How many of the matched blocks are already used (sharing them costs nothing)."""
        return sum(1 for b in matched if self.blocks[b].ref_count > 0)

    def allocate(self, req: Request, num_new_tokens: int) -> None:
        needed = self.blocks_needed(req, num_new_tokens)
        if needed > self.num_allocatable:
            raise OutOfBlocks(f"need {needed} blocks, {self.num_allocatable} allocatable")
        for _ in range(needed):
            req.block_table.append(self._take())

    def fits(self, req: Request, num_new_tokens: int) -> bool:
        """Whether `req` can take the blocks for `num_new_tokens` more tokens now."""
        return self.blocks_needed(req, num_new_tokens) <= self.num_allocatable

    def window_fits(self, req: Request, num_hit_blocks: int, num_tokens: int) -> bool:
        """Whether a sliding layers' pool can admit `req` (none here: always)."""
        return True

    def can_swap_in(self, req: Request, num_new_tokens: int, spare: int) -> bool:
        """Whether swapped `req` can come back and run `num_new_tokens`, `spare` blocks left."""
        needed = max(
            len(req.host_blocks), self.blocks_for(req.num_computed_tokens + num_new_tokens)
        )
        return needed <= self.num_allocatable - spare

    def swap_out_all(self, req: Request) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """swap_out in every pool: (this pool's copies, the sliding layers' pool's)."""
        return self.swap_out(req), []

    def swap_in_all(self, req: Request) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """swap_in in every pool: (this pool's copies, the sliding layers' pool's)."""
        return self.swap_in(req), []

    def step_fits_window_pool(self, num_tokens: int) -> bool:
        """Whether one request's step of `num_tokens` fits a sliding layers' pool (none here)."""
        return True

    def behind(self, req: Request) -> bool:
        """Whether `req` holds blocks behind a sliding window to give back (none here)."""
        return False

    def drop_swapped(self, req: Request) -> None:
        """Give back the host blocks of a swapped request that ends."""
        self.host_free.extend(req.host_blocks)
        req.host_blocks = []

    def _take(self) -> int:
        if self.free_ids and self.num_used + self.num_cached < self.usable:
            block_id = self.free_ids.popleft()
        elif self.cached:
            block_id = self._evict_one(to_free=False)
        else:
            raise OutOfBlocks("no free or evictable block")
        self.blocks[block_id].ref_count = 1
        self.num_used += 1
        return block_id

    def _evict_one(self, to_free: bool = True) -> int:
        block_id, _ = self.cached.popitem(last=False)
        block = self.blocks[block_id]
        assert block.hash is not None  # only hashed full blocks are cached
        del self.hash_to_block[block.hash]
        block.hash = None
        block.token_ids = ()
        if to_free:
            self.free_ids.append(block_id)
        return block_id

    def free(self, req: Request) -> None:
        """Release a request's blocks; full hashed ones stay cached for reuse."""
        for block_id in reversed(req.block_table):
            self._release(block_id)
        req.block_table = []
        req.num_hashed_blocks = 0
        self._trim()

    def _release(self, block_id: int) -> None:
        """Drop one reference; a block no one uses is cached when hashed, else free."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.num_used -= 1
            if block.hash is not None:
                self.cached[block_id] = None
            else:
                self.free_ids.append(block_id)

    def _trim(self) -> None:
        while self.num_used + self.num_cached > self.usable and self.cached:
            self._evict_one()

    def register_full_blocks(self, req: Request) -> None:
        """Hash blocks that became full this step so later requests can reuse them."""
        if not self.prefix_caching:
            return
        num_full = min(req.num_computed_tokens // self.block_size, len(req.block_table))
        if num_full <= req.num_hashed_blocks:
            return
        self._block_hashes(req, num_full)
        self.hash_entries(req, req.block_table, req.num_hashed_blocks, num_full)
        req.num_hashed_blocks = num_full

    def hash_entries(self, req: Request, table: list[int], start: int, end: int) -> None:
        """Hash the blocks of `table` at positions [start, end) with the request's chain
        hashes (computed), unless a block already holds those tokens."""
        bs = self.block_size
        for i in range(start, end):
            block = self.blocks[table[i]]
            h = req.block_hashes[i]
            if block.hash is None and h not in self.hash_to_block:
                block.hash = h
                block.token_ids = tuple(req.all_token_ids[i * bs : (i + 1) * bs])
                self.hash_to_block[h] = block.block_id

    def can_swap_out(self, req: Request) -> bool:
        return len(req.block_table) <= len(self.host_free)

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Move a request's blocks to the host pool; returns (device, host) copies to make."""
        host = [self.host_free.popleft() for _ in req.block_table]
        pairs = list(zip(req.block_table, host, strict=True))
        self.free(req)
        req.host_blocks = host
        return pairs

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Bring a swapped request back; returns (host, device) copies to make."""
        device = [self._take() for _ in req.host_blocks]
        pairs = list(zip(req.host_blocks, device, strict=True))
        self.host_free.extend(req.host_blocks)
        req.host_blocks = []
        req.block_table = device
        return pairs
