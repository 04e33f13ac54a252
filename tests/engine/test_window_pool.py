"""The sliding layers' own KV pool (engine.window_pool), no model: blocks behind the window
are given back while the full pool keeps every block, nothing leaks after finish, abort or
preemption, prefix hits need the window before them, swaps move only the live entries, and
the pool's sizing.

`check_pools` asserts after each operation that every block of each pool is in exactly one
state and that the ref counts equal the live table entries.
"""

from collections import Counter
from dataclasses import replace

import pytest
from test_scheduler import add, complete, make_knobs

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.request import Request, Status
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.window_pool import (
    WindowedBlocks,
    sized_window_pool,
    sliding_window,
    window_pool_blocks,
)

BS = 4
W = 5  # a chunk starting at n reads positions from n - 4


def pools(full: int = 32, window: int = 16, host: int = 0) -> WindowedBlocks:
    return WindowedBlocks(full, window, BS, host, True, W)


def check_pools(blocks: WindowedBlocks, live: list[Request]) -> None:
    """Each block of each pool in one state; ref counts equal the tables' live entries."""
    tables = {
        blocks: [r.block_table for r in live],
        blocks.pool: [r.window_table[r.window_first :] for r in live],
    }
    for bm, rows in tables.items():
        refs = Counter(b for row in rows for b in row)
        used = {i for i in range(bm.total) if bm.blocks[i].ref_count > 0}
        for i in range(bm.total):
            assert bm.blocks[i].ref_count == refs[i], (bm is blocks, i)
        free, cached = set(bm.free_ids), set(bm.cached)
        assert len(free) == len(bm.free_ids)
        assert used | cached | free == set(range(bm.total))
        assert not used & cached and not used & free and not cached & free
        assert bm.num_used == len(used)


def decode(blocks: WindowedBlocks, r: Request, steps: int) -> None:
    for _ in range(steps):
        blocks.allocate(r, 1)
        r.num_computed_tokens += 1
        r.append_token(1, 0.0)
        blocks.register_full_blocks(r)


def prefill(blocks: WindowedBlocks, r: Request, chunk: int = 1 << 20) -> None:
    blocks.admit(r, blocks.prefix_match(r))
    while r.num_computed_tokens < r.num_tokens:
        n = min(chunk, r.num_tokens - r.num_computed_tokens)
        blocks.allocate(r, n)
        r.num_computed_tokens += n
        blocks.register_full_blocks(r)


def request(tokens: list[int] | range, rid: str = "") -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=64), request_id=rid)


def test_window_pool_frees_blocks_behind_the_window_as_a_request_decodes() -> None:
    blocks = pools()
    r = request(range(100, 107))
    prefill(blocks, r)
    check_pools(blocks, [r])
    held = []
    for _ in range(30):
        decode(blocks, r, 1)
        check_pools(blocks, [r])
        n = r.num_computed_tokens
        # the next chunk starts at n and reads from n - 4: the blocks before are given back
        assert r.window_first == max(0, n - W + 1) // BS
        assert blocks.num_used == -(-n // BS)
        held.append(blocks.pool.num_used)
    assert max(held) <= -(-W // BS) + 1  # the window's blocks and one it straddles
    kv = blocks.stats([r])
    assert kv.behind_window == blocks.num_used - blocks.pool.num_used > 0
    assert (kv.window_total, kv.window_used) == (16, blocks.pool.num_used)
    assert kv.used == -(-r.num_computed_tokens // BS)


def test_a_long_chunk_takes_its_blocks_then_gives_back_what_fell_behind() -> None:
    blocks = pools()
    r = request(range(40))
    blocks.admit(r, [])
    blocks.allocate(r, 24)  # the chunk writes all 24 positions: 6 blocks in both pools
    assert blocks.pool.num_used == blocks.num_used == 6
    r.num_computed_tokens = 24
    blocks.register_full_blocks(r)
    assert r.window_first == 5 and blocks.pool.num_used == 1  # positions 20.. are read
    blocks.allocate(r, 16)
    assert blocks.pool.num_used == 5 and blocks.num_used == 10
    check_pools(blocks, [r])


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_no_leak_after_finish_abort_or_preemption(mode: str) -> None:
    blocks = pools(full=16, window=12, host=32)
    knobs = make_knobs(16, max_num_batched_tokens=16, prefill_chunk_size=8, preemption_mode=mode)
    sched = Scheduler(blocks, knobs, "continuous")
    reqs = [add(sched, f"r{i}", 14 + 3 * i, max_tokens=12) for i in range(4)]
    preempted = 0
    for _ in range(200):
        out = sched.schedule()
        preempted += len(out.preempted)
        live = [r for r in reqs if r.status is Status.RUNNING]
        check_pools(blocks, live)
        if not sched.num_unfinished:
            break
        complete(sched, out)
        if reqs[3].status is Status.RUNNING and reqs[3].output_token_ids:
            sched.finish(reqs[3], "abort")  # an abort mid-decode
    assert not sched.num_unfinished and preempted > 0
    for bm in (blocks, blocks.pool):
        assert bm.num_used == 0 and bm.num_allocatable == bm.total
        assert len(bm.host_free) == 32


def test_prefix_hit_needs_the_window_before_it() -> None:
    blocks = pools(full=32, window=8)
    a = request(range(100, 120), "a")  # 5 full blocks
    prefill(blocks, a)
    blocks.free(a)
    # a's hashed blocks are cached in both pools: its window blocks 3 and 4 among them
    b = request(list(range(100, 117)) + [7, 7, 7], "b")
    assert len(blocks.prefix_match(b)) == 4
    # evict the window pool's cached blocks: the hit needs blocks 2 and 3 before position 16
    filler = request(range(500, 532), "filler")
    blocks.pool.grow(filler, 32)
    assert not blocks.pool.cached
    blocks.pool.drop(filler)
    assert blocks.prefix_match(b) == []
    prefill(blocks, b)
    assert b.num_computed_tokens == b.num_tokens
    check_pools(blocks, [b])


def test_prefix_hit_shortened_to_what_the_window_pool_holds() -> None:
    blocks = pools(full=32, window=8)
    a = request(range(100, 120), "a")
    prefill(blocks, a, chunk=4)  # blocks 0..3 given back early, hashed: cached
    blocks.free(a)
    # drop the window pool's copy of block 4: a hit of all 5 full blocks needs it (the
    # window before position 20 starts at 16), a hit of 4 needs block 3 alone
    block4 = blocks.pool.hash_to_block[a.block_hashes[4]]
    assert block4 in blocks.pool.cached
    blocks.pool.cached.move_to_end(block4, last=False)
    blocks.pool._evict_one()
    b = request(list(range(100, 120)) + [9], "b")
    matched = blocks.prefix_match(b)
    assert len(matched) == 4
    blocks.admit(b, matched)
    assert b.window_first == 3 and b.num_computed_tokens == 16
    blocks.allocate(b, b.num_tokens - 16)
    check_pools(blocks, [b])


def test_blocks_given_back_before_registration_stay_cached() -> None:
    """With overlap the next chunk is allocated before the step before was registered:
    the blocks it gives back are hashed then, so a later request that shares only the
    first 16 tokens still finds the window before them."""
    blocks = pools(full=32, window=16)
    a = request(range(100, 140), "a")
    blocks.admit(a, [])
    for _ in range(5):  # chunks of 8, no register_full_blocks in between
        blocks.allocate(a, 8)
        a.num_computed_tokens += 8
    blocks.register_full_blocks(a)  # once the last step ended: hashes the live blocks only
    blocks.free(a)
    assert len(blocks.pool.cached) == 10
    b = request(list(range(100, 116)) + [1, 2, 3], "b")
    assert len(blocks.prefix_match(b)) == 4


def test_swap_out_and_in_moves_only_live_window_entries() -> None:
    blocks = pools(host=16)
    r = request(range(30))
    prefill(blocks, r)
    live = len(r.window_table) - r.window_first
    first = r.window_first
    assert blocks.can_swap_out(r)
    full, window = blocks.swap_out_all(r)
    assert len(full) == 8 and len(window) == live < len(full)
    assert blocks.num_used == 0 and blocks.pool.num_used == 0
    assert blocks.can_swap_in(r, 1, 0)
    full_in, window_in = blocks.swap_in_all(r)
    assert [h for h, _ in window_in] == [h for _, h in window]
    assert r.window_first == first and r.window_table[first:] == [d for _, d in window_in]
    check_pools(blocks, [r])
    decode(blocks, r, 3)
    check_pools(blocks, [r])
    blocks.free(r)
    assert blocks.pool.num_used == 0 and len(blocks.pool.host_free) == 16


def test_window_pool_sizing() -> None:
    """Blocks count: the window pool fits max_num_seqs requests' windows plus a step, never
    more than the full pool. Memory: the window pool's bytes first, the rest to full
    layers, which then hold more blocks than when every layer took every block."""
    assert window_pool_blocks(1000, 128, 16, 8, 512) == 8 * (40 + 1)
    assert window_pool_blocks(100, 128, 16, 8, 512) == 100
    plain = ModelConfig(
        family="gpt_oss",
        vocab_size=64,
        hidden_size=32,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=2,
        top_k=1,
    )
    assert sliding_window(plain) == 0
    kinds = ("sliding_attention", "full_attention") * 2
    cfg = replace(plain, sliding_window=128, layer_types=kinds)
    assert sliding_window(cfg) == 128
    knobs = make_knobs(4096, max_num_seqs=8, max_num_batched_tokens=512)
    by_count = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=4096), knobs=knobs)
    cache = sized_window_pool(by_count, cfg).cache
    assert (cache.num_blocks, cache.window_blocks) == (4096, 8 * 41)
    assert sized_window_pool(by_count, plain) is by_count
    # 64 MiB at 128 bytes a token a layer: 8192 blocks of 16 when all 4 layers hold them
    memory = replace(by_count, cache=replace(by_count.cache, memory_mib=64.0, num_blocks=8192))
    cache = sized_window_pool(memory, cfg).cache
    assert cache.window_blocks == 328
    assert cache.num_blocks == 2 * 8192 - 328  # the sliding layers' share, less their pool
