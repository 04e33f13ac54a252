"""BlockManager on its own, no model: block states, prefix cache, LRU eviction, usable
capacity and the host swap pool.

Every block is used (ref_count > 0), cached (ref_count 0, hashed, evictable) or free;
`check_states` asserts that after each operation.
"""

from collections import Counter

import pytest

from engine import kv_cache
from engine.kv_cache import BlockManager, OutOfBlocks
from engine.request import Request
from engine.sampling_params import SamplingParams

BS = 4


def req(tokens: list[int] | range, rid: str = "") -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=4), request_id=rid)


def prefill(bm: BlockManager, r: Request, matched: list[int] | None = None) -> None:
    """Admit `r` (with its prefix hits), give it blocks for the rest and compute all of it."""
    bm.admit(r, matched or [])
    n = r.num_tokens - r.num_computed_tokens
    bm.allocate(r, n)
    r.num_computed_tokens += n
    bm.register_full_blocks(r)


def check_states(bm: BlockManager, live: list[Request]) -> None:
    """Each block in exactly one state; ref counts equal block-table references."""
    refs = Counter(b for r in live for b in r.block_table)
    blocks = [bm.blocks[i] for i in range(bm.total)]
    for block in blocks:
        assert block.ref_count == refs[block.block_id], block
    used = {b.block_id for b in blocks if b.ref_count > 0}
    cached = set(bm.cached)
    free = list(bm.free_ids)
    assert len(set(free)) == len(free)
    assert not used & cached and not used & set(free) and not cached & set(free)
    assert used | cached | set(free) == set(range(bm.total))
    assert bm.num_used == len(used)
    assert bm.num_free == len(free)
    for block_id in cached:
        assert bm.blocks[block_id].hash is not None
    for block_id in free:
        assert bm.blocks[block_id].hash is None
    for h, block_id in bm.hash_to_block.items():
        assert bm.blocks[block_id].hash == h
        assert block_id in used | cached


def test_allocate_and_free_without_prefix_caching() -> None:
    bm = BlockManager(8, BS, 0, prefix_caching=False)
    r = req(range(10))
    assert bm.blocks_needed(r, 10) == 3
    assert bm.blocks_for(10) == 3 and bm.blocks_for(12) == 3 and bm.blocks_for(13) == 4
    prefill(bm, r)
    assert r.block_table == [0, 1, 2]
    assert (bm.num_used, bm.num_cached, bm.num_free, bm.num_allocatable) == (3, 0, 5, 5)
    assert bm.blocks_needed(r, 2) == 0  # tokens 10 and 11 still fit in block 2
    assert bm.blocks_needed(r, 3) == 1
    assert all(bm.blocks[i].hash is None for i in range(bm.total))  # no hashes with caching off
    check_states(bm, [r])
    bm.free(r)
    assert r.block_table == [] and r.num_hashed_blocks == 0
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 0, 8)
    assert list(bm.free_ids) == [3, 4, 5, 6, 7, 2, 1, 0]  # freed last block first
    assert bm.prefix_match(req(range(10))) == []
    check_states(bm, [])


def test_allocating_past_the_allocatable_blocks_raises_and_changes_nothing() -> None:
    bm = BlockManager(4, BS, 0)
    a = req(range(12))
    prefill(bm, a)
    b = req(range(100, 108))
    bm.admit(b, [])
    with pytest.raises(OutOfBlocks, match="need 2 blocks, 1 allocatable"):
        bm.allocate(b, 8)
    assert b.block_table == [] and bm.num_used == 3
    check_states(bm, [a, b])


def test_only_full_computed_blocks_are_hashed() -> None:
    bm = BlockManager(8, BS, 0)
    r = req(range(10))
    bm.admit(r, [])
    bm.allocate(r, 10)
    r.num_computed_tokens = 6  # a first chunk: block 0 full, block 1 half
    bm.register_full_blocks(r)
    assert r.num_hashed_blocks == 1
    assert bm.blocks[0].token_ids == (0, 1, 2, 3)
    assert bm.blocks[1].hash is None and len(bm.hash_to_block) == 1
    r.num_computed_tokens = 10
    bm.register_full_blocks(r)
    assert r.num_hashed_blocks == 2
    assert bm.blocks[1].token_ids == (4, 5, 6, 7)
    assert bm.blocks[2].hash is None  # tokens 8, 9: not full
    bm.free(r)
    assert list(bm.cached) == [1, 0]  # freed last first: the tail is least recently used
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 2, 6)
    check_states(bm, [])


def test_prefix_hit_shares_full_blocks_and_leaves_one_token_to_compute() -> None:
    bm = BlockManager(16, BS, 0)
    a = req(range(10), "a")
    prefill(bm, a)
    assert a.block_table == [0, 1, 2]
    assert (bm.prefix_queries, bm.prefix_hits) == (10, 0)

    b = req([*range(8), 100, 101, 102], "b")
    matched = bm.prefix_match(b)
    assert matched == [0, 1]
    assert bm.hit_blocks_in_use(matched) == 2  # a holds them: sharing them costs nothing
    bm.admit(b, matched)
    assert b.num_computed_tokens == 8 and b.num_hashed_blocks == 2
    assert [bm.blocks[i].ref_count for i in (0, 1, 2)] == [2, 2, 1]
    bm.allocate(b, 3)
    assert b.block_table == [0, 1, 3]
    assert (bm.num_used, bm.prefix_queries, bm.prefix_hits) == (4, 21, 8)
    check_states(bm, [a, b])

    # a prompt that is exactly two cached blocks matches one: its last token must run
    assert bm.prefix_match(req(range(8))) == [0]
    assert bm.prefix_match(req(range(9))) == [0, 1]
    assert bm.prefix_match(req([*range(4), 99, 5, 6, 7, 8])) == [0]
    assert bm.prefix_match(req([1, 0, 2, 3, 4, 5])) == []

    bm.free(a)
    assert [bm.blocks[i].ref_count for i in (0, 1, 2)] == [1, 1, 0]
    assert (bm.num_used, bm.num_cached) == (3, 0)  # shared blocks stay used while b holds them
    bm.free(b)
    assert (bm.num_used, bm.num_cached) == (0, 2)
    check_states(bm, [])


def test_a_hit_on_cached_blocks_makes_them_used_again() -> None:
    bm = BlockManager(8, BS, 0)
    a = req(range(9))
    prefill(bm, a)
    bm.free(a)
    assert (bm.num_used, bm.num_cached) == (0, 2)
    b = req([*range(8), 50])
    matched = bm.prefix_match(b)
    assert matched == [0, 1] and bm.hit_blocks_in_use(matched) == 0
    bm.admit(b, matched)
    assert (bm.num_used, bm.num_cached) == (2, 0)
    assert [bm.blocks[i].ref_count for i in (0, 1)] == [1, 1]
    check_states(bm, [b])


def test_same_content_computed_twice_is_hashed_once() -> None:
    bm = BlockManager(8, BS, 0)
    a, b = req(range(9), "a"), req(range(9), "b")
    bm.admit(a, [])
    bm.admit(b, [])  # both admitted before either computed: no hit
    for r in (a, b):
        bm.allocate(r, 9)
        r.num_computed_tokens = 9
        bm.register_full_blocks(r)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4, 5]
    assert [bm.blocks[i].hash is not None for i in range(6)] == [True, True] + [False] * 4
    assert b.num_hashed_blocks == 2
    bm.free(b)  # b's duplicates go straight back to the free list
    assert (bm.num_used, bm.num_cached, bm.num_free) == (3, 0, 5)
    bm.free(a)
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 2, 6)
    check_states(bm, [])


def test_chained_hashes_match_a_block_only_after_the_same_prefix() -> None:
    bm = BlockManager(8, BS, 0)
    w, x, y = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    prefill(bm, req([*w, *x, 0]))
    assert bm.prefix_match(req([*w, *x, 0])) == [0, 1]
    assert bm.prefix_match(req([*y, *x, 0])) == []
    assert bm.prefix_match(req([*x, 0])) == []  # x cached, but only after w


def test_a_hash_collision_is_no_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "chain_hash", lambda parent, token_ids: 0)
    bm = BlockManager(8, BS, 0)
    prefill(bm, req(range(5)))
    assert bm.hash_to_block == {0: 0}
    assert bm.prefix_match(req([*range(4), 9])) == [0]
    assert bm.prefix_match(req([9, 9, 9, 9, 9])) == []  # same hash, other tokens


def test_cached_blocks_are_evicted_least_recently_used_first() -> None:
    bm = BlockManager(4, BS, 0)
    r1 = req(range(8), "r1")
    prefill(bm, r1)
    bm.free(r1)
    r2 = req(range(100, 108), "r2")
    prefill(bm, r2)
    assert r2.block_table == [2, 3]
    bm.free(r2)
    assert list(bm.cached) == [1, 0, 3, 2]
    r3 = req(range(200, 208), "r3")
    prefill(bm, r3)  # no free block left: evicts r1's, freed longest ago
    assert r3.block_table == [1, 0]
    assert list(bm.cached) == [3, 2]
    assert bm.prefix_match(req([*range(8), 0])) == []
    assert bm.prefix_match(req([*range(100, 108), 0])) == [2, 3]
    check_states(bm, [r3])


def test_a_prefix_hit_refreshes_blocks_in_the_lru_order() -> None:
    bm = BlockManager(4, BS, 0)
    for tokens in (range(8), range(100, 108)):
        r = req(tokens)
        prefill(bm, r)
        bm.free(r)
    assert list(bm.cached) == [1, 0, 3, 2]  # r1's blocks are the oldest
    again = req([*range(8), 9])
    prefill(bm, again, bm.prefix_match(again))  # reuses 0, 1; its third block evicts 3
    assert again.block_table == [0, 1, 3]
    bm.free(again)
    assert list(bm.cached) == [2, 1, 0]  # r1's blocks are now the newest
    r3 = req(range(200, 208))
    prefill(bm, r3)
    assert r3.block_table == [3, 2]
    assert bm.prefix_match(req([*range(8), 0])) == [0, 1]
    assert bm.prefix_match(req([*range(100, 108), 0])) == []
    check_states(bm, [r3])


def test_usable_bounds_used_plus_cached_blocks() -> None:
    bm = BlockManager(8, BS, 0)
    r1 = req(range(8))
    prefill(bm, r1)
    bm.free(r1)
    bm.set_usable(4)
    assert (bm.usable, bm.num_cached, bm.num_allocatable) == (4, 2, 4)
    r2 = req(range(100, 112))
    prefill(bm, r2)  # two free blocks, then a cached one rather than a third free one
    assert r2.block_table == [2, 3, 1]
    assert list(bm.cached) == [0]
    assert (bm.num_used, bm.num_allocatable) == (3, 1)
    bm.set_usable(3)  # evicts the cached block to fit
    assert (bm.num_cached, bm.num_free, bm.num_allocatable) == (0, 5, 0)
    bm.set_usable(2)  # below what is used: nothing allocatable, nothing evicted
    assert (bm.num_used, bm.num_allocatable) == (3, 0)
    with pytest.raises(OutOfBlocks):
        bm.allocate(r2, 1)
    check_states(bm, [r2])


def test_freeing_after_a_shrink_keeps_only_what_fits_cached() -> None:
    bm = BlockManager(8, BS, 0)
    r = req(range(12))
    prefill(bm, r)
    assert r.num_hashed_blocks == 3
    bm.set_usable(2)
    bm.free(r)  # caches blocks 2, 1, 0 in that order, then evicts down to 2
    assert list(bm.cached) == [1, 0]
    assert bm.prefix_match(req([*range(12), 0])) == [0, 1]
    check_states(bm, [])


def test_swap_out_and_in_move_blocks_through_the_host_pool() -> None:
    bm = BlockManager(8, BS, 3)
    r = req(range(10), "r")
    prefill(bm, r)
    assert r.block_table == [0, 1, 2]
    assert bm.can_swap_out(r)
    assert bm.swap_out(r) == [(0, 0), (1, 1), (2, 2)]  # (device, host)
    assert (r.block_table, r.host_blocks, list(bm.host_free)) == ([], [0, 1, 2], [])
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 2, 6)  # full blocks stay cached
    other = req(range(300, 302), "other")
    prefill(bm, other)
    assert other.block_table == [3]
    assert not bm.can_swap_out(other)  # the host pool is full
    assert bm.swap_in(r) == [(0, 4), (1, 5), (2, 6)]  # (host, device)
    assert (r.block_table, r.host_blocks, sorted(bm.host_free)) == ([4, 5, 6], [], [0, 1, 2])
    bm.register_full_blocks(r)  # same content as cached blocks 0, 1: not hashed again
    assert (bm.blocks[4].hash, bm.blocks[5].hash) == (None, None)
    assert r.num_hashed_blocks == 2
    check_states(bm, [r, other])
    bm.free(r)
    bm.free(other)
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 2, 6)
    check_states(bm, [])
