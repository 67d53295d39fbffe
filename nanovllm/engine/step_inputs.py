"""Scheduled sequences -> the host-side arrays of one model step. numpy only, no torch.

Both decode paths (eager, and CUDA-graph replay) and prefill take their inputs from here,
so the slot and block-table arithmetic exists once and is unit-tested without a device.
"""
from dataclasses import dataclass

import numpy as np

from nanovllm.engine.sequence import PLACEHOLDER, Sequence


@dataclass
class StepInputs:
    """Everything the model and the attention context need for one step, as int32 arrays."""

    is_prefill: bool
    num_seqs: int
    input_ids: np.ndarray        # [tokens] (decode: [rows], padding rows hold 0)
    positions: np.ndarray        # [tokens]
    slot_mapping: np.ndarray     # [tokens] cache slot each new K/V goes to; -1 = nowhere
    block_tables: np.ndarray     # [rows, width] physical block ids, 0-padded
    context_lens: np.ndarray | None = None  # decode: [rows] tokens attended, 0 = padding row
    # decode: [rows] the real rows by context length, longest first, then the padding rows:
    # the order the decode kernel may start their programs in (see triton_decode's LPT).
    order: np.ndarray | None = None
    cu_seqlens_q: np.ndarray | None = None  # prefill: [num_seqs + 1]
    cu_seqlens_k: np.ndarray | None = None  # prefill: [num_seqs + 1]
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    has_cached_context: bool = False  # prefill: some sequence attends to cached tokens
    # decode, async scheduling: [rows] row of the previous step's sampled ids that holds
    # this row's input token (still on the device), -1 where input_ids has it; None = none.
    feed_rows: np.ndarray | None = None
    # prefill: rows (of the step's tokens) whose logits give prompt logprobs; None = none.
    prompt_rows: np.ndarray | None = None

    @property
    def decode_meta(self) -> np.ndarray:
        """[5, rows]: ids, positions, slots, context lens, order (the decode graphs' input
        rows)."""
        return np.stack([self.input_ids, self.positions, self.slot_mapping, self.context_lens,
                         self.order])


def block_table_array(seqs: list[Sequence], width: int, rows: int | None = None) -> np.ndarray:
    """[rows, width] block ids; the width is fixed (max_model_len's blocks) so that kernels
    see one shape, and rows beyond len(seqs) are zero padding."""
    table = np.zeros((rows or len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        table[i, : len(s.block_table)] = s.block_table
    return table


class BlockTables:
    """Block-table rows kept from step to step, one per sequence: a decode step copies only
    the blocks a sequence gained since its last step (a block every block_size tokens), then
    takes the batch's rows in one numpy gather. Per step that is O(batch), not
    O(batch x context) as rebuilding every row was.

    A sequence's blocks change only by appending, except when it is preempted or prefilled
    again; prefill steps therefore rewrite their rows in full (refresh=True).
    """

    def __init__(self, capacity: int, width: int):
        self.table = np.zeros((capacity + 1, width), dtype=np.int32)
        self.pad_row = capacity  # stays all zeros: the rows of padding
        self.row_of: dict[int, int] = {}
        self.filled = [0] * capacity  # valid entries of each row
        self.free = list(range(capacity - 1, -1, -1))

    def gather(self, seqs: list[Sequence], rows: int | None = None,
               refresh: bool = False) -> np.ndarray:
        """[rows, width] block ids of seqs (zero rows after them), updating stored rows."""
        idx = np.full(rows or len(seqs), self.pad_row, dtype=np.intp)
        for i, s in enumerate(seqs):
            r = self.row_of.get(s.seq_id)
            if r is None:
                r = self._new_row(s.seq_id, seqs)
            bt, have = s.block_table, self.filled[r]
            n = len(bt)
            if refresh or n < have:
                self.table[r, :n] = bt
                self.table[r, n:have] = 0
            elif n > have:
                self.table[r, have:n] = bt[have:]
            self.filled[r] = n
            idx[i] = r
        return self.table[idx]

    def _new_row(self, seq_id: int, batch: list[Sequence]) -> int:
        if not self.free:
            # Rows of sequences outside this batch (finished, or waiting) are taken back;
            # one that returns later is simply written afresh.
            live = {s.seq_id for s in batch}
            for sid in [sid for sid in self.row_of if sid not in live]:
                r = self.row_of.pop(sid)
                self.table[r, : self.filled[r]] = 0
                self.filled[r] = 0
                self.free.append(r)
        r = self.free.pop()
        self.row_of[seq_id] = r
        return r


def prefill_inputs(seqs: list[Sequence], block_size: int, width: int,
                   tables: BlockTables | None = None) -> StepInputs:
    """Each sequence computes tokens [num_cached_tokens, + num_scheduled_tokens)."""
    ids, pos, slots, cu_q, cu_k, prompt_rows = [], [], [], [0], [0], []
    for s in seqs:
        start, n = s.num_cached_tokens, s.num_scheduled_tokens
        first, count = s.prompt_logit_rows()
        if count:
            prompt_rows += range(cu_q[-1] + first, cu_q[-1] + first + count)
        ids += s.scheduled_token_ids()
        pos += range(start, start + n)
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + start + n)
        # Slots block by block: a run of positions inside one block maps to a run of slots.
        for b in range(start // block_size, (start + n - 1) // block_size + 1):
            first, last = max(start, b * block_size), min(start + n, (b + 1) * block_size)
            base = s.block_table[b] * block_size - b * block_size
            slots += range(base + first, base + last)
    return StepInputs(
        is_prefill=True, num_seqs=len(seqs),
        input_ids=_i32(ids), positions=_i32(pos), slot_mapping=_i32(slots),
        block_tables=(block_table_array(seqs, width) if tables is None
                      else tables.gather(seqs, refresh=True)),
        cu_seqlens_q=_i32(cu_q), cu_seqlens_k=_i32(cu_k),
        max_seqlen_q=max(s.num_scheduled_tokens for s in seqs),
        max_seqlen_k=max(s.num_cached_tokens + s.num_scheduled_tokens for s in seqs),
        has_cached_context=any(s.num_cached_tokens for s in seqs),
        prompt_rows=_i32(prompt_rows) if prompt_rows else None)


def decode_inputs(seqs: list[Sequence], block_size: int, width: int, rows: int,
                  prev_rows: dict[int, int] | None = None,
                  tables: BlockTables | None = None) -> StepInputs:
    """One new token per sequence, padded to `rows` rows that attend to nothing and write
    nowhere (a CUDA graph runs a fixed batch size). A sequence whose input token is still
    pending takes it from row prev_rows[seq_id] of the previous step's samples."""
    n = len(seqs)
    feed = None
    if any(s.last_token == PLACEHOLDER for s in seqs):
        feed = np.full(rows, -1, dtype=np.int32)
        feed[:n] = [prev_rows[s.seq_id] if s.last_token == PLACEHOLDER else -1 for s in seqs]
    lens = np.zeros(rows, dtype=np.int32)
    lens[:n] = np.fromiter((len(s) for s in seqs), np.int32, n)
    ids = np.zeros(rows, dtype=np.int32)
    ids[:n] = np.fromiter((max(s.last_token, 0) for s in seqs), np.int32, n)
    slots = np.full(rows, -1, dtype=np.int32)
    slots[:n] = [s.block_table[(m - 1) // block_size] * block_size + (m - 1) % block_size
                 for s, m in zip(seqs, lens[:n].tolist())]
    positions = np.maximum(lens - 1, 0).astype(np.int32)
    # Padding rows keep their places after the real ones, so order[:b] is a permutation of
    # 0..b-1 for any graph size b >= n.
    order = np.arange(rows, dtype=np.int32)
    order[:n] = np.argsort(-lens[:n], kind="stable")
    return StepInputs(is_prefill=False, num_seqs=n, input_ids=ids, positions=positions,
                      slot_mapping=slots,
                      block_tables=(block_table_array(seqs, width, rows) if tables is None
                                    else tables.gather(seqs, rows)),
                      context_lens=lens, order=order, feed_rows=feed)


def _i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)
