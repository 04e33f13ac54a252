"""Sliding layers' own KV pool (gpt-oss): blocks that fell behind the window are given back.

A sliding layer reads only a request's last `window` positions, but a full-attention layer
reads all of them, so one block table cannot free anything. Here the full layers keep the
engine's pool and block table; the sliding layers get a second, smaller pool and a second
table per request (`Request.window_table`, by the same block positions), whose entries
wholly before the next chunk's window are given back (cached when hashed, else free) and
left as placeholders: kernels never read a position before the window unmasked, and the
cache is zero-initialised and only ever written with finite values, so a placeholder's
block (any valid id) is harmless under the torch path's -inf mask.

Released blocks may still be read by the step in flight (engine overlap): they go to
another request only in a later step, which the device runs after that one, as blocks of
preempted requests already do.
"""

from collections.abc import Iterable
from dataclasses import replace

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.kv_cache import BlockManager, KVStats, OutOfBlocks
from engine.model.loader import model_config, sized_by_kv_memory
from engine.request import Request

PLACEHOLDER = 0  # a released entry's block id: any valid one (never read unmasked)

Pairs = list[tuple[int, int]]


def sliding_window(cfg: ModelConfig) -> int:
    """The window of the model's sliding layers (0: none, one pool serves every layer)."""
    if any(cfg.window(i) for i in range(cfg.num_layers)):
        return cfg.sliding_window
    return 0


def window_pool_blocks(
    full_blocks: int, window: int, block_size: int, max_num_seqs: int, max_batched: int
) -> int:
    """Blocks of the sliding layers' pool: enough for `max_num_seqs` requests each holding
    its window plus a whole step's tokens (and a block that straddles), never more than the
    full pool."""
    per_request = -(-(window + max_batched) // block_size) + 1
    return min(full_blocks, max_num_seqs * per_request)


def sized_cache(config: EngineConfig) -> EngineConfig:
    """`config` with its KV pools sized as every rank must size them: blocks bought by
    `kv_cache_memory_mib`, then the sliding layers' pool."""
    sized = sized_by_kv_memory(config)
    return sized_window_pool(sized, model_config(sized.model, sized.router_skew))


def sized_window_pool(config: EngineConfig, cfg: ModelConfig) -> EngineConfig:
    """`config` with the sliding layers' pool sized (`cache.window_blocks`), when the model
    has sliding layers. With `kv_cache_memory_mib` the memory left after that pool goes to
    the full layers' blocks (`num_blocks` was sized as if every layer held every block)."""
    window = sliding_window(cfg)
    if not window:
        return config
    cache, knobs = config.cache, config.knobs
    blocks = window_pool_blocks(
        cache.num_blocks,
        window,
        cache.block_size,
        knobs.max_num_seqs,
        knobs.max_num_batched_tokens,
    )
    full_blocks = cache.num_blocks
    sliding = sum(1 for i in range(cfg.num_layers) if cfg.window(i))
    if cache.memory_mib and sliding < cfg.num_layers:
        layer_block = cfg.kv_elements_per_token * config.dtype.itemsize * cache.block_size
        budget = int(cache.memory_mib * 2**20) - blocks * sliding * layer_block
        full_blocks = budget // ((cfg.num_layers - sliding) * layer_block)
    return replace(config, cache=replace(cache, num_blocks=full_blocks, window_blocks=blocks))


class WindowPool(BlockManager):
    """The sliding layers' blocks, kept in `Request.window_table` (the first
    `window_first` entries released); block-level bookkeeping (use, cache, eviction, host
    pool) is BlockManager's."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int,
        prefix_caching: bool,
        window: int,
    ) -> None:
        super().__init__(num_blocks, block_size, num_host_blocks, prefix_caching)
        self.window = window

    def first_read(self, start: int) -> int:
        """The first block a chunk starting at position `start` (or any later one) reads."""
        return max(0, start - self.window + 1) // self.block_size

    def release_behind(self, req: Request) -> None:
        """Give back the entries before the window of the request's next chunk, hashed first
        so that they stay cached for prefix hits (with overlap this runs before the step
        that filled them was registered; their tokens are known, their KV is written before
        any later step reads it)."""
        table = req.window_table
        end = min(self.first_read(req.num_computed_tokens), len(table))
        if self.prefix_caching and end > req.window_first:
            self._block_hashes(req, end)
            self.hash_blocks(req, req.window_first, end)
        for i in range(req.window_first, end):
            self._release(table[i])
            table[i] = PLACEHOLDER
        req.window_first = max(req.window_first, end)

    def new_blocks(self, req: Request, num_new_tokens: int) -> int:
        """Blocks `req` takes for `num_new_tokens` more tokens (after release_behind)."""
        target = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        have = max(len(req.window_table), self.first_read(req.num_computed_tokens))
        return max(0, target - have)

    def grow(self, req: Request, num_new_tokens: int) -> None:
        """Entries for `num_new_tokens` more tokens: placeholders up to the window, then new
        blocks."""
        self.release_behind(req)
        needed = self.new_blocks(req, num_new_tokens)
        if needed > self.num_allocatable:
            raise OutOfBlocks(f"window pool: need {needed}, {self.num_allocatable} allocatable")
        table = req.window_table
        first = self.first_read(req.num_computed_tokens)
        if len(table) < first:  # everything before was released already
            table.extend([PLACEHOLDER] * (first - len(table)))
            req.window_first = first
        for _ in range(needed):
            table.append(self._take())

    def lookup(self, req: Request, num_hit_blocks: int) -> list[int] | None:
        """Cached blocks covering the window before a prefix hit of `num_hit_blocks` blocks
        (their ids from the first one read), or None when one is not held."""
        first = self.first_read(num_hit_blocks * self.block_size)
        found = []
        for i in range(first, num_hit_blocks):
            block_id = self.cached_block(req, i, req.block_hashes[i])
            if block_id is None:
                return None
            found.append(block_id)
        return found

    def hit_cost(self, found: list[int]) -> int:
        """Blocks a hit on `found` takes from the allocatable ones (those not in use)."""
        return len(found) - self.hit_blocks_in_use(found)

    def take_hit(self, req: Request, num_hit_blocks: int) -> None:
        """Give a fresh request the window's blocks of its prefix hit."""
        found = self.lookup(req, num_hit_blocks)
        assert found is not None, "prefix hit not held by the window pool"
        self.share(found)
        first = num_hit_blocks - len(found)
        req.window_table = [PLACEHOLDER] * first + found
        req.window_first = first

    def hash_blocks(self, req: Request, start: int, end: int) -> None:
        """Hash live blocks [start, end) with the chain hashes the full pool computed."""
        table = req.window_table
        self.hash_entries(req, table, max(start, req.window_first), min(end, len(table)))

    def drop(self, req: Request) -> None:
        """Release every live entry of the request."""
        table = req.window_table
        for i in range(len(table) - 1, req.window_first - 1, -1):
            self._release(table[i])
        req.window_table = []
        req.window_first = 0
        self._trim()

    def can_move_out(self, req: Request) -> bool:
        return len(req.window_table) - req.window_first <= len(self.host_free)

    def move_out(self, req: Request) -> Pairs:
        """Live entries to the host pool; (device, host) copies to make. The released
        entries stay released (`window_first` is kept)."""
        first = req.window_first
        live = req.window_table[first:]
        host = [self.host_free.popleft() for _ in live]
        self.drop(req)
        req.window_first = first
        req.window_host = host
        return list(zip(live, host, strict=True))

    def move_in(self, req: Request) -> Pairs:
        """Back from the host pool; (host, device) copies to make."""
        device = [self._take() for _ in req.window_host]
        pairs = list(zip(req.window_host, device, strict=True))
        self.host_free.extend(req.window_host)
        req.window_host = []
        req.window_table = [PLACEHOLDER] * req.window_first + device
        return pairs

    def drop_host(self, req: Request) -> None:
        self.host_free.extend(req.window_host)
        req.window_host = []
        req.window_first = 0


class WindowedBlocks(BlockManager):
    """The full layers' pool (this BlockManager, whose numbers the scheduler's limits and
    knobs speak of) and the sliding layers' pool (`pool`): each question the scheduler asks
    is answered for both."""

    def __init__(
        self,
        num_blocks: int,
        window_blocks: int,
        block_size: int,
        num_host_blocks: int,
        prefix_caching: bool,
        window: int,
    ) -> None:
        super().__init__(num_blocks, block_size, num_host_blocks, prefix_caching)
        self.window = window
        self.pool = WindowPool(window_blocks, block_size, num_host_blocks, prefix_caching, window)

    def stats(self, running: Iterable[Request] = ()) -> KVStats:
        """Both pools; behind_window: the full pool's used blocks the window pool needs not
        hold (the sliding layers' share of them is saved)."""
        pool = self.pool
        return replace(
            super().stats(running),
            behind_window=max(0, self.num_used - pool.num_used),
            window_total=pool.total,
            window_used=pool.num_used,
        )

    def step_fits_window_pool(self, num_tokens: int) -> bool:
        """A pool sized for fewer blocks than the full one (by the knobs at start) must hold
        one request's window and a step of `num_tokens` (a larger budget set later could
        otherwise never run); one as large as the full pool holds what that one holds."""
        pool = self.pool
        need = window_pool_blocks(self.total, self.window, self.block_size, 1, num_tokens)
        return pool.total >= self.total or need <= pool.total

    def behind(self, req: Request) -> bool:
        """Whether `req` has entries behind its window still to give back."""
        first = min(self.pool.first_read(req.num_computed_tokens), len(req.window_table))
        return first > req.window_first

    def fits(self, req: Request, num_new_tokens: int) -> bool:
        """Both pools can take `num_new_tokens` more (gives back what fell behind first)."""
        self.pool.release_behind(req)
        pool = self.pool
        return super().fits(req, num_new_tokens) and (
            pool.new_blocks(req, num_new_tokens) <= pool.num_allocatable
        )

    def window_fits(self, req: Request, num_hit_blocks: int, num_tokens: int) -> bool:
        pool = self.pool
        found = pool.lookup(req, num_hit_blocks)
        assert found is not None, "prefix_match keeps only hits the window pool holds"
        start = num_hit_blocks * self.block_size
        new = -(-(start + num_tokens) // self.block_size) - num_hit_blocks
        return pool.hit_cost(found) + new <= pool.num_allocatable

    def prefix_match(self, req: Request) -> list[int]:
        """The full pool's hit, shortened to the longest the window pool also holds the
        window before."""
        matched = super().prefix_match(req)
        for k in range(len(matched), 0, -1):
            if self.pool.lookup(req, k) is not None:
                return matched[:k]
        return []

    def admit(self, req: Request, matched: list[int]) -> None:
        super().admit(req, matched)
        self.pool.take_hit(req, len(matched))

    def allocate(self, req: Request, num_new_tokens: int) -> None:
        if not self.fits(req, num_new_tokens):
            raise OutOfBlocks(f"cannot grow {req.request_id} by {num_new_tokens} tokens")
        self.pool.grow(req, num_new_tokens)
        super().allocate(req, num_new_tokens)

    def free(self, req: Request) -> None:
        super().free(req)
        if req.window_table:  # empty once swap_out_all moved it out: nothing to drop then
            self.pool.drop(req)

    def register_full_blocks(self, req: Request) -> None:
        """Hash new full blocks in both pools, then give back what fell behind the window
        (hashed first, so that those stay cached for prefix hits)."""
        before = req.num_hashed_blocks
        super().register_full_blocks(req)
        if self.prefix_caching:
            self.pool.hash_blocks(req, before, req.num_hashed_blocks)
        self.pool.release_behind(req)

    def can_swap_out(self, req: Request) -> bool:
        return super().can_swap_out(req) and self.pool.can_move_out(req)

    def swap_out_all(self, req: Request) -> tuple[Pairs, Pairs]:
        window = self.pool.move_out(req)
        return self.swap_out(req), window

    def can_swap_in(self, req: Request, num_new_tokens: int, spare: int) -> bool:
        pool = self.pool
        target = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        have = max(
            req.window_first + len(req.window_host), pool.first_read(req.num_computed_tokens)
        )
        needed = len(req.window_host) + max(0, target - have)
        return super().can_swap_in(req, num_new_tokens, spare) and needed <= pool.num_allocatable

    def swap_in_all(self, req: Request) -> tuple[Pairs, Pairs]:
        return self.swap_in(req), self.pool.move_in(req)

    def drop_swapped(self, req: Request) -> None:
        super().drop_swapped(req)
        self.pool.drop_host(req)


def block_manager(cache: CacheConfig, window: int) -> BlockManager:
    """The KV blocks an engine of `cache` keeps (the engine's, and the twin's simulated
    ones): two pools when the model's sliding layers got their own (`cache.window_blocks`,
    `window` positions each reads), else one."""
    if cache.window_blocks:
        return WindowedBlocks(
            cache.num_blocks,
            cache.window_blocks,
            cache.block_size,
            cache.num_host_blocks,
            cache.enable_prefix_caching,
            window,
        )
    return BlockManager(
        cache.num_blocks, cache.block_size, cache.num_host_blocks, cache.enable_prefix_caching
    )
