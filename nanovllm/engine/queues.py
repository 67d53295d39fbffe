"""The scheduler's queues are kept in scheduling order (Sequence.sort_key: priority, arrival,
sample). No torch here."""
import bisect
from collections import deque

from nanovllm.engine.sequence import Sequence


def insert_in_order(queue: deque[Sequence], seq: Sequence) -> None:
    """Put seq in its place in a queue kept in sort_key order."""
    key = seq.sort_key
    # The common cases (all priorities equal: a new arrival, a preempted sequence) are O(1).
    if not queue or queue[-1].sort_key <= key:
        queue.append(seq)
    elif key < queue[0].sort_key:
        queue.appendleft(seq)
    else:
        queue.insert(bisect.bisect_right(queue, key, key=lambda s: s.sort_key), seq)
