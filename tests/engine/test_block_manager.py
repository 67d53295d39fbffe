import random

import pytest

from nanovllm.engine import block_manager as bm_mod
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence

BS = 16


def seq_of(tokens):
    return Sequence(tokens, block_size=BS)


def computed(bm, seq):
    """Pretend the model computed every token but the last, as a finished prefill does."""
    seq.num_cached_tokens = seq.num_tokens
    bm.commit(seq)


def prefill_twice(num_blocks, n, free_first=False):
    """Allocate and compute a prompt of n tokens, optionally free it, then allocate the same
    prompt again: returns (bm, first, second)."""
    bm = BlockManager(num_blocks, BS)
    a = seq_of(list(range(n)))
    bm.allocate(a)
    computed(bm, a)
    if free_first:
        bm.deallocate(a)
        assert bm.num_free_blocks == num_blocks
    b = seq_of(list(range(n)))
    bm.allocate(b)
    return bm, a, b


def check_consistent(bm, live):
    refs = [0] * bm.num_blocks
    for s in live:
        for b in s.block_table:
            refs[b] += 1
    for b in bm.blocks:
        assert b.ref_count == refs[b.block_id], "ref count drifted"
        assert (b.ref_count == 0) == (b.block_id in bm.free_block_ids), "free list drifted"
    for h, b in bm.hash_to_block_id.items():
        assert bm.blocks[b].hash == h


def test_prefix_hit_shares_only_full_blocks():
    bm = BlockManager(16, BS)
    a = seq_of(list(range(40)))  # 2 full blocks + 8 tokens
    bm.allocate(a)
    computed(bm, a)
    b = seq_of(list(range(40)) + [999])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]  # partial block never shared
    assert b.num_cached_tokens == 32
    assert bm.blocks[a.block_table[0]].ref_count == 2
    check_consistent(bm, [a, b])


def test_fully_cached_prompt_still_computes_a_token():
    bm, a, b = prefill_twice(8, 32)
    assert b.num_cached_tokens == 16 and b.num_cached_tokens < b.num_tokens
    check_consistent(bm, [a, b])


def test_freed_blocks_stay_cached_until_reused():
    bm, _, b = prefill_twice(4, 33, free_first=True)
    assert b.num_cached_tokens == 32
    bm.deallocate(b)
    # Fill the whole cache with other content: the old prefix must be gone, not half-valid.
    c = seq_of([7] * 64)
    bm.allocate(c)
    bm.deallocate(c)
    d = seq_of(list(range(33)))
    assert bm.blocks_needed(d) == 3
    bm.allocate(d)
    assert d.num_cached_tokens == 0
    check_consistent(bm, [d])


def test_hash_collision_is_caught_by_token_check(monkeypatch):
    monkeypatch.setattr(bm_mod, "chain_hash", lambda tokens, prefix=-1: 42)
    bm = BlockManager(8, BS)
    a = seq_of([1] * 17)
    bm.allocate(a)
    computed(bm, a)
    b = seq_of([2] * 17)  # same (fake) hash, other tokens
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    assert not set(a.block_table) & set(b.block_table)


def test_collision_on_second_block_is_caught_by_parent_check(monkeypatch):
    # Same second-block tokens after different first blocks; every hash collides.
    monkeypatch.setattr(bm_mod, "chain_hash", lambda tokens, prefix=-1: hash(tokens))
    bm = BlockManager(8, BS)
    a = seq_of([1] * 16 + [5] * 16 + [0])
    bm.allocate(a)
    computed(bm, a)
    b = seq_of([2] * 16 + [5] * 16 + [0])
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_prefix_caching_off():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = seq_of(list(range(40)))
    bm.allocate(a)
    computed(bm, a)
    b = seq_of(list(range(40)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not bm.hash_to_block_id


def test_double_free_detected():
    bm = BlockManager(4, BS)
    a = seq_of([1, 2, 3])
    bm.allocate(a)
    table = list(a.block_table)
    bm.deallocate(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.deallocate(a)


@pytest.mark.parametrize("seed", range(5))
def test_random_allocate_append_free_preempt(seed):
    rng = random.Random(seed)
    bm = BlockManager(48, BS)
    live: list[Sequence] = []
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 60))] for _ in range(6)]
    for _ in range(3000):
        op = rng.random()
        if op < 0.3:
            tail = [rng.randrange(50) for _ in range(rng.randrange(0, 20))]
            toks = list(rng.choice(prefixes)) + tail
            s = seq_of(toks)
            if bm.can_allocate(s):
                free_before = bm.num_free_blocks
                need = bm.blocks_needed(s)
                bm.allocate(s)
                assert free_before - bm.num_free_blocks == need
                assert len(s.block_table) == s.num_blocks
                assert s.num_cached_tokens < s.num_tokens
                computed(bm, s)
                live.append(s)
        elif op < 0.75 and live:
            s = rng.choice(live)
            s.append_token(rng.randrange(50))
            before = list(s.block_table)
            if bm.try_append(s):
                assert len(s.block_table) == s.num_blocks
                computed(bm, s)
            else:  # no free block: nothing was taken
                assert s.block_table == before and not bm.free_block_ids
                bm.deallocate(s)  # preempt
                live.remove(s)
        elif live:
            s = live.pop(rng.randrange(len(live)))
            bm.deallocate(s)
        check_consistent(bm, live)
        # Every shared block holds the same tokens in every sequence that uses it.
        seen = {}
        for s in live:
            for i, b in enumerate(s.block_table[: s.num_tokens // BS]):
                assert seen.setdefault(b, tuple(s.block(i))) == tuple(s.block(i))
    for s in live:
        bm.deallocate(s)
    assert bm.num_free_blocks == bm.num_blocks
