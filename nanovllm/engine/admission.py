"""The prompt part of a step: chunks of partly computed prompts, then admissions from the
waiting queue, within a token budget. No torch here; the Scheduler decides the budget (all of
max_num_batched_tokens in a prefill step, what decodes leave in a mixed one)."""
from collections import deque

from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.forks import num_forks
from nanovllm.engine.queues import insert_in_order
from nanovllm.engine.sequence import Sequence, SequenceStatus


def schedule_prompts(running: deque[Sequence], waiting: deque[Sequence],
                     block_manager: BlockManager, budget: int, max_num_seqs: int,
                     admit: bool = True) -> list[Sequence]:
    """Set num_scheduled_tokens of the sequences whose prompts this step computes and return
    them: running ones whose prompts earlier steps only chunked first, then (with admit)
    waiting ones in order while blocks, max_num_seqs and the budget allow; those are
    allocated and moved to running."""
    scheduled = []
    # Samples that requests with n > 1 fork when this step completes their prompt: each
    # takes a running slot and one block (see forks.py), which later admissions leave free.
    promised = 0
    for seq in running:
        remaining = seq.num_tokens - seq.num_cached_tokens
        if remaining > 1 and budget > 0:
            seq.num_scheduled_tokens = min(remaining, budget)
            budget -= seq.num_scheduled_tokens
            scheduled.append(seq)
            if seq.num_scheduled_tokens == remaining:
                promised += num_forks(seq, max_num_seqs)
    while admit and waiting and budget > 0:
        seq = waiting[0]
        # A sequence preempted with a token in flight is recomputed once it is known.
        if seq.num_pending:
            break
        # A request with n > 1 waits for room for its samples too, unless nothing runs:
        # then it must start alone (samples that do not fit wait, see forks.py).
        forks = num_forks(seq, max_num_seqs)
        want = promised + (forks if running else 0)
        if (len(running) + want >= max_num_seqs
                or block_manager.blocks_needed(seq) + want > block_manager.num_free_blocks):
            break
        block_manager.allocate(seq)
        remaining = seq.num_tokens - seq.num_cached_tokens
        seq.num_scheduled_tokens = min(remaining, budget)
        budget -= seq.num_scheduled_tokens
        if seq.num_scheduled_tokens == remaining:
            promised += forks
        seq.status = SequenceStatus.RUNNING
        waiting.popleft()
        insert_in_order(running, seq)
        scheduled.append(seq)
    return scheduled
