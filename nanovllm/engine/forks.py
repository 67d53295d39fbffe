"""Parallel sampling (n > 1) on the control plane. No torch here.

A request is admitted and prefilled as one sequence, its first sample. The step that computes
the end of its prompt forks the other n - 1 (fork_samples): each shares, by reference count,
the prompt's blocks before the last token's and computes only the rest of the prompt to sample
its own first token; from then on every sample is an ordinary sequence, and the request ends
when all its samples have.
"""
from collections import deque

from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.queues import insert_in_order
from nanovllm.engine.sequence import Sequence, SequenceStatus


def num_forks(seq: Sequence, max_num_seqs: int) -> int:
    """Samples seq forks when its prompt completes that can run beside it at once."""
    if not seq.needs_fork:
        return 0
    return min(seq.sampling_params.n - len(seq.samples), max_num_seqs - 1)


def fork_samples(parent: Sequence, running: deque[Sequence], waiting: deque[Sequence],
                 block_manager: BlockManager, max_num_seqs: int) -> None:
    """Make the other samples of parent's request, whose prompt this step computes. A
    sample that finds a running slot and a block starts now, sharing the prompt's blocks
    (launched before any step of its own, so on the device they are written first); one
    that does not waits in line, to be computed like a preempted sequence (with prefix
    caching on, still mostly from the shared blocks)."""
    while parent.needs_fork:
        child = parent.spawn_sample()
        if len(running) < max_num_seqs and block_manager.can_fork(child):
            block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            insert_in_order(running, child)
        else:
            insert_in_order(waiting, child)
