"""Fixed-size KV blocks: free list, ref counts and a verified prefix cache. No torch here."""
import struct
from collections import OrderedDict

import xxhash

from nanovllm.engine.sequence import Sequence


class Block:
    """Metadata of one physical KV block."""

    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "parent", "gen")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: tuple[int, ...] = ()
        # (block id, generation) of the block before this one in the sequence that filled it.
        self.parent: tuple[int, int] = (-1, -1)
        # Bumped on every reuse, so a child can tell its parent still holds the same content.
        self.gen = 0


def chain_hash(token_ids, prefix: int = -1) -> int:
    """xxhash64 of a block's tokens chained with the previous block's hash."""
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(prefix.to_bytes(8, "little"))
    # Each token as 4 little-endian bytes; struct packs a block ~10x faster than int.to_bytes.
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return h.intdigest()


class BlockManager:
    """Hands out KV blocks to sequences and shares full blocks with equal prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        # Insertion-ordered free set: allocate from the front (least recently freed), so
        # freed blocks keep their cached content as long as possible; O(1) removal on a hit.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Statistics: tokens looked up in the prefix cache when a sequence got its blocks
        # (prefix caching on), and those served from it.
        self.num_query_tokens = self.num_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, free or not."""
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (a freed block keeps its cached prefix until taken)."""
        return len(self.free_block_ids)

    # -- prefix cache -----------------------------------------------------------------------
    def _match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks equal to seq's leading full blocks, verified token by token."""
        # A prompt that still needs prompt logprobs computes every position, as in vLLM.
        if not self.enable_prefix_caching or seq.needs_prompt_logits:
            return []
        hits: list[int] = []
        h, parent = -1, (-1, -1)
        # Only blocks that end before the last token: at least one token must be computed
        # so the step has logits to sample from.
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(seq.block(i))
            h = chain_hash(tokens, h)
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent != parent:
                break  # a hash collision or a stale entry: never trust the hash alone
            hits.append(block_id)
            parent = (block_id, block.gen)
        return hits

    def commit(self, seq: Sequence) -> None:
        """Publish seq's full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_cached_tokens // self.block_size
        first = num_full
        while first > 0 and self.blocks[seq.block_table[first - 1]].hash == -1:
            first -= 1
        for i in range(first, num_full):
            block = self.blocks[seq.block_table[i]]
            if i == 0:
                prefix, parent = -1, (-1, -1)
            else:
                prev = self.blocks[seq.block_table[i - 1]]
                prefix, parent = prev.hash, (prev.block_id, prev.gen)
            block.token_ids = tuple(seq.block(i))
            block.hash = chain_hash(block.token_ids, prefix)
            block.parent = parent
            self.hash_to_block_id[block.hash] = block.block_id

    # -- allocation -------------------------------------------------------------------------
    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.parent = -1, (), (-1, -1)
        block.gen += 1
        block.ref_count = 1
        return block_id

    def blocks_needed(self, seq: Sequence) -> int:
        """Free blocks that allocate(seq) would consume now."""
        hits = self._match_prefix(seq)
        shared = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return seq.num_blocks - shared

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether the free list holds the blocks allocate(seq) would take now."""
        return self.blocks_needed(seq) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give seq blocks for all its tokens, reusing cached prefix blocks."""
        assert not seq.block_table, "sequence already holds blocks"
        hits = self._match_prefix(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
        seq.block_table = hits + [self._take_free_block()
                                  for _ in range(seq.num_blocks - len(hits))]
        seq.num_cached_tokens = len(hits) * self.block_size
        # A draft model recomputes hit blocks: their draft K/V may never have been written.
        seq.num_draft_cached = 0
        self.num_hit_tokens += seq.num_cached_tokens
        if self.enable_prefix_caching:
            self.num_query_tokens += seq.num_tokens

    @staticmethod
    def _num_fork_shared(child: Sequence) -> int:
        """Prompt blocks a forked sample shares: those that end before the last prompt token,
        whose K/V it would compute the same; the last token must be computed (for logits)."""
        return (child.num_prompt_tokens - 1) // child.block_size

    def can_fork(self, child: Sequence) -> bool:
        """Whether fork(parent, child) finds its fresh blocks (one: the last prompt block's)."""
        return child.num_blocks - self._num_fork_shared(child) <= self.num_free_blocks

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give child, a new sample of parent's request (holding only the prompt), parent's
        computed prompt blocks before the last token's by reference, and fresh blocks for
        the rest, which child computes itself (1..block_size tokens). Needs no prefix cache."""
        assert not child.block_table, "sequence already holds blocks"
        shared = self._num_fork_shared(child)
        assert parent.num_cached_tokens >= shared * self.block_size, "parent prompt not computed"
        for block_id in parent.block_table[:shared]:
            self.blocks[block_id].ref_count += 1  # held by parent: never on the free list
        fresh = [self._take_free_block() for _ in range(child.num_blocks - shared)]
        child.block_table = parent.block_table[:shared] + fresh
        child.num_cached_tokens = shared * self.block_size

    def deallocate(self, seq: Sequence) -> None:
        """Drop seq's references; blocks whose count hits zero go back to the free list."""
        # Last blocks first, so a prefix shared by many requests is the last to be evicted.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"double free of block {block_id}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table = []
        seq.num_cached_tokens = seq.num_draft_cached = 0

    def try_append(self, seq: Sequence) -> bool:
        """Give seq a new block when its newest token starts one; False (nothing changed)
        when that needs a block and none is free."""
        table = seq.block_table
        need = (seq.num_tokens + self.block_size - 1) // self.block_size
        if len(table) >= need:  # the common case: the token fits the last block
            return True
        if not self.free_block_ids:
            return False
        while len(table) < need:
            table.append(self._take_free_block())
        return True

    def reserve(self, seq: Sequence, num_tokens: int, keep: int = 0) -> int:
        """Give seq free blocks toward holding num_tokens tokens, leaving `keep` free ones
        (for others' next tokens: drafts never cause a preemption); returns how many tokens
        its blocks hold now. Speculative drafts' K/V go there."""
        need = -(-num_tokens // self.block_size)
        while len(seq.block_table) < need and len(self.free_block_ids) > keep:
            seq.block_table.append(self._take_free_block())
        return len(seq.block_table) * self.block_size
