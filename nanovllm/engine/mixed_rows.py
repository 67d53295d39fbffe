"""A mixed step's decode rows, as the host builds them (no torch).

A prefill step's leading sequences that compute one token at their end (a mixed step's
decodes: the scheduler puts them first) attend through the decode kernel, as in a decode
step, instead of the varlen prefill kernel, whose query tiles would be 1 row of 64-128 there;
the rows after them are the prefill part. See layers/attention.py (the split) and
worker/step_context.py (the two contexts)."""
import numpy as np

from nanovllm.engine.sequence import PLACEHOLDER, Sequence


def leading_decode_rows(seqs: list[Sequence]) -> int:
    """How many leading sequences compute exactly their last token."""
    n = 0
    for s in seqs:
        if s.num_scheduled_tokens != 1 or s.num_cached_tokens != s.num_tokens - 1:
            break
        n += 1
    return n


def decode_rows(seqs: list[Sequence], input_ids: np.ndarray,
                prev_rows: dict[int, int] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """For the decode rows seqs (rows 0.. of the step): [2, >= rows] int32 context lengths
    and the order the decode kernel starts them in (longest first), and the feed rows: where a
    row's input token is still pending (async scheduling), the row of the previous step's
    sampled ids that holds it (-1 elsewhere; None when none is), its input_ids entry set to
    0 meanwhile."""
    n = len(seqs)
    # Columns padded to a multiple of 4: the order row then starts 16-byte aligned on the
    # device (Triton specialises kernels on pointer alignment).
    meta = np.zeros((2, -(-n // 4) * 4), dtype=np.int32)
    meta[0, :n] = np.fromiter((s.num_tokens for s in seqs), np.int32, n)
    meta[1, :n] = np.argsort(-meta[0, :n], kind="stable")
    pending = [i for i, s in enumerate(seqs) if s.last_token == PLACEHOLDER]
    if not pending:
        return meta, None
    feed = np.full(n, -1, dtype=np.int32)
    feed[pending] = [prev_rows[seqs[i].seq_id] for i in pending]
    input_ids[pending] = 0
    return meta, feed
