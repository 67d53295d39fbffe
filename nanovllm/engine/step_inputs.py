"""The one host builder of a step's inputs: scheduled sequences -> every array the device
needs, in numpy (no torch). Prefill, eager decode and CUDA-graph decode all take their inputs
from here (tokens, positions, slots, block tables, and on rank 0 the sampling, penalty and
logprob rows), so the slot and block-table arithmetic exists once and is unit-tested without a
device; the device side uploads `device_parts()` in one host-to-device copy.
"""
from itertools import repeat
from operator import attrgetter

import numpy as np

from nanovllm.engine.block_tables import BlockTables, block_table_array
from nanovllm.engine.mixed_rows import decode_rows, leading_decode_rows
from nanovllm.engine.sampling_rows import (
    grammar_bitmask,
    logprob_plan,
    penalty_rows,
    sampling_rows,
    verify_rows,
)
from nanovllm.engine.sequence import PLACEHOLDER, Sequence
from nanovllm.engine.step_arrays import DECODE_META_ROWS, StepInputs

__all__ = ["DECODE_META_ROWS", "StepBuilder", "StepInputs", "decode_inputs", "prefill_inputs",
           "verify_inputs"]


class StepBuilder:
    """Builds each step's StepInputs for one rank; keeps what persists from step to step
    (block-table rows, the rows of the last step's sequences, the end tokens)."""

    def __init__(self, block_size: int, width: int, max_num_seqs: int,
                 vocab_size: int | None):
        self.block_size, self.width = block_size, width
        self.vocab_size = vocab_size  # None: this rank does not sample (no sampling rows)
        self.tables = BlockTables(2 * max_num_seqs, width)
        # Row of each sequence in the last launched step: where its pending token (async
        # scheduling) lies among that step's sampled ids, still on the device.
        self.prev_rows: dict[int, int] = {}
        self.eos_ids: frozenset[int] = frozenset()  # what min_tokens holds back
        # The last decode step's sequences and their sampling rows, while those rows depend on
        # nothing that changes from step to step (see _sampling_parts).
        self._same_seqs: list[Sequence] | None = None
        self._same_rows: tuple | None = None

    def build(self, seqs: list[Sequence], is_prefill: bool, rows: int = 0,
              late_masks: bool = False) -> StepInputs:
        """The step's inputs; a decode step is padded to `rows` rows. late_masks: leave out
        the grammar masks, which the caller supplies once the matchers have accepted the
        tokens of the step still in flight (grammar_bitmask(seqs, range(len(seqs)), ...))."""
        if is_prefill:
            inputs = prefill_inputs(seqs, self.block_size, self.width, self.tables,
                                    self.prev_rows)
        elif any(s.spec_token_ids for s in seqs):
            inputs = verify_inputs(seqs, self.block_size, rows, self.tables)
        else:
            inputs = decode_inputs(seqs, self.block_size, self.width, rows, self.prev_rows,
                                   self.tables)
        if self.vocab_size is None:
            return inputs
        # A grammar sequence has one row: it is never given drafts (speculation.py).
        seq_rows = (range(len(seqs)) if inputs.spec_starts is None
                    else inputs.spec_starts[:-1].tolist())
        masks = None if late_masks else grammar_bitmask(seqs, seq_rows,
                                                        inputs.num_rows or len(seqs))
        if masks is not None:
            inputs.grammar_bitmask, inputs.grammar_rows = masks
        if inputs.spec_starts is not None:
            inputs.sampling, inputs.penalties, inputs.logprobs = verify_rows(
                seqs, np.diff(inputs.spec_starts).tolist(), self.eos_ids, self.vocab_size)
        else:
            inputs.sampling, inputs.penalties, inputs.logprobs = self._sampling_parts(
                seqs, is_prefill, inputs.prompt_rows, masks is None and not late_masks)
        return inputs

    def _sampling_parts(self, seqs: list[Sequence], is_prefill: bool,
                        prompt_rows: np.ndarray | None, no_grammar: bool) -> tuple:
        """The step's sampling, penalty and logprob rows. A decode step of the very sequences
        of the last one takes that step's rows again when they hold nothing that changes from
        step to step (no seeds, penalties, min_tokens, logprobs or grammars): a large batch's
        steady state, where building them cost ~90 us of host time a step at 256 rows."""
        if not is_prefill and self._same_rows is not None and seqs == self._same_seqs:
            return self._same_rows
        parts = (sampling_rows([s.sampling_params for s in seqs],
                               [s.num_completion_tokens for s in seqs], self.vocab_size),
                 penalty_rows(seqs, self.eos_ids, self.prev_rows, self.vocab_size),
                 logprob_plan(seqs, is_prefill, prompt_rows))
        # Each of these depends only on the sequences' settings, fixed at their admission.
        same = (not is_prefill and no_grammar and parts[0].seeds is None
                and parts[1] is None and parts[2] is None)
        self._same_seqs, self._same_rows = (list(seqs), parts) if same else (None, None)
        return parts

    def launched(self, seqs: list[Sequence]) -> None:
        """Record the rows of a step that reached the device (its ids will be sampled)."""
        self.prev_rows = {s.seq_id: i for i, s in enumerate(seqs)}


def prefill_inputs(seqs: list[Sequence], block_size: int, width: int,
                   tables: BlockTables | None = None,
                   prev_rows: dict[int, int] | None = None) -> StepInputs:
    """Each sequence computes tokens [num_cached_tokens, + num_scheduled_tokens); leading
    ones that compute just their last token are decode rows (see mixed_rows.py), whose
    pending input tokens come from row prev_rows[seq_id] of the previous step's samples."""
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
    table = (block_table_array(seqs, width) if tables is None
             else tables.gather(seqs, refresh=True))
    nd = leading_decode_rows(seqs)
    rest = seqs[nd:]  # the prefill part: what the max lengths and the table describe
    inputs = StepInputs(
        is_prefill=True, num_seqs=len(seqs), num_decode_rows=nd,
        input_ids=_i32(ids), positions=_i32(pos), slot_mapping=_i32(slots),
        block_tables=table[nd:], cu_seqlens_q=_i32(cu_q), cu_seqlens_k=_i32(cu_k),
        max_seqlen_q=max((s.num_scheduled_tokens for s in rest), default=0),
        max_seqlen_k=max((s.num_cached_tokens + s.num_scheduled_tokens for s in rest),
                         default=0),
        has_cached_context=any(s.num_cached_tokens for s in rest),
        prompt_rows=_i32(prompt_rows) if prompt_rows else None)
    if nd:
        inputs.decode_tables = table[:nd]
        inputs.decode_rows, inputs.feed_rows = decode_rows(seqs[:nd], inputs.input_ids,
                                                           prev_rows)
    return inputs


def decode_inputs(seqs: list[Sequence], block_size: int, width: int, rows: int,
                  prev_rows: dict[int, int] | None = None,
                  tables: BlockTables | None = None) -> StepInputs:
    """One new token per sequence, padded to `rows` rows that attend to nothing and write
    nowhere (a CUDA graph runs a fixed batch size). A sequence whose input token is still
    pending takes it from row prev_rows[seq_id] of the previous step's samples."""
    # Per-sequence values by C-level maps, the rest as array arithmetic written in place into
    # the step's one meta array (what the decode graphs read): at 256 rows a step these are
    # ~1 us a row of host time in Python comprehensions, and at batch 1 every numpy call and
    # allocation saved is host time of the step.
    n = len(seqs)
    meta = _padding_meta(rows)  # every row padding; the first n columns are set below
    ids, positions, slots, lens, order, feed_row, _ = meta
    lens[:n] = np.fromiter(map(attrgetter("num_tokens"), seqs), np.int32, n)
    last = np.fromiter(map(attrgetter("last_token"), seqs), np.int32, n)
    feed = None
    pending = last == PLACEHOLDER
    if pending.any():
        prev = np.fromiter(map(prev_rows.get, map(attrgetter("seq_id"), seqs), repeat(-1)),
                           np.int32, n)
        assert (prev[pending] >= 0).all(), "a pending token not sampled by the last step"
        feed_row[:n] = np.where(pending, prev, -1)
        feed = feed_row
    np.maximum(last, 0, out=ids[:n])
    table = block_table_array(seqs, width, rows) if tables is None else tables.gather(seqs, rows)
    # The newest token's slot: its block (from the table just built) and its place in it.
    newest = lens[:n] - 1
    block = newest // block_size
    # A table row past its blocks reads 0, a real block: check (~12 us at 256 rows) rather
    # than let a missing block send a token's K/V into block 0.
    held = np.fromiter(map(len, map(attrgetter("block_table"), seqs)), np.int32, n)
    assert (block < held).all(), "a decode token without its block"
    slots[:n] = table[np.arange(n), block] * block_size + newest % block_size
    positions[:n] = newest
    if n > 1:
        order[:n] = np.argsort(-lens[:n], kind="stable")
    return StepInputs(is_prefill=False, num_seqs=n, num_rows=n, input_ids=ids,
                      positions=positions, slot_mapping=slots, block_tables=table,
                      context_lens=lens, order=order, feed_rows=feed, meta=meta)


_PADDING: dict[int, np.ndarray] = {}


def _padding_meta(rows: int) -> np.ndarray:
    """A fresh [DECODE_META_ROWS, rows] meta of padding rows: input id 0, position 0, slot -1
    (writes nowhere), context 0 (attends to nothing), order i (padding rows keep their places
    after the real ones, so order[:b] is a permutation of 0..b-1 for any graph size b >= the
    real rows), feed row -1, temperature 0. One copy of a kept template."""
    template = _PADDING.get(rows)
    if template is None:
        template = np.zeros((DECODE_META_ROWS, rows), dtype=np.int32)
        template[2] = template[5] = -1
        template[4] = np.arange(rows, dtype=np.int32)
        _PADDING[rows] = template
    return template.copy()


def verify_inputs(seqs: list[Sequence], block_size: int, rows: int, tables: BlockTables,
                  refresh: bool = False) -> StepInputs:
    """A verify step as decode rows: sequence s computes its last token and its drafts, a
    row each, row j attending to the context up to its own position (the rows' K/V are all
    stored before attention runs), so the decode kernels and graphs serve it unchanged."""
    counts = [1 + len(s.spec_token_ids) for s in seqs]
    starts = np.zeros(len(seqs) + 1, dtype=np.int32)
    starts[1:] = np.cumsum(counts)
    n = int(starts[-1])
    ids, positions, slots = (np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                             np.full(rows, -1, np.int32))
    drafts = np.full(rows, -1, dtype=np.int32)
    for s, r, c in zip(seqs, starts.tolist(), counts):
        tokens = [s.last_token, *s.spec_token_ids]
        ids[r:r + c] = tokens
        drafts[r:r + c - 1] = tokens[1:]
        first = s.num_tokens - 1
        positions[r:r + c] = range(first, first + c)
        slots[r:r + c] = [s.block_table[p // block_size] * block_size + p % block_size
                          for p in range(first, first + c)]
    lens = np.zeros(rows, dtype=np.int32)
    lens[:n] = positions[:n] + 1
    table = np.zeros((rows, tables.table.shape[1]), dtype=np.int32)
    table[:n] = np.repeat(tables.gather(seqs, refresh=refresh), counts, axis=0)
    order = np.arange(rows, dtype=np.int32)
    order[:n] = np.argsort(-lens[:n], kind="stable")
    return StepInputs(is_prefill=False, num_seqs=len(seqs), num_rows=n, input_ids=ids,
                      positions=positions, slot_mapping=slots, block_tables=table,
                      context_lens=lens, order=order, spec_drafts=drafts, spec_starts=starts)


def _i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)
