"""The rank-0 rows of a step's host inputs: sampling settings, penalty histories, the
grammar bitmask (structured output) and the logprob plan, one row per sequence (a verify
step: per token it computes), as numpy arrays. No torch: the device side only uploads them
(with the rest of the step, in one copy) and views them as tensors.
"""
from dataclasses import dataclass

import numpy as np

from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams


@dataclass
class SamplingRows:
    """Per-row sampling settings of one batch."""

    temperatures: np.ndarray             # [B] float32; 0 = greedy
    top_ks: np.ndarray | None = None     # [B] int32; vocab size = off
    top_ps: np.ndarray | None = None     # [B] float32; 1 = off
    min_ps: np.ndarray | None = None     # [B] float32; 0 = off
    seeds: list[tuple[int, int, int]] | None = None  # (row, seed, step) for seeded rows
    all_greedy: bool = False


def sampling_rows(params: list[SamplingParams], steps: list[int],
                  vocab_size: int) -> SamplingRows:
    """The batch's settings; steps[i] = tokens row i generated so far (seeded streams)."""
    rows = SamplingRows(np.array([p.temperature for p in params], np.float32),
                        all_greedy=all(p.temperature == 0 for p in params))
    if rows.all_greedy:
        return rows
    # Each optional part exists only when some row uses it, so plain batches take the fused
    # single-pass sampler.
    if any(p.top_k != -1 for p in params):
        # Clamped to the vocabulary: a larger top_k keeps every token anyway.
        rows.top_ks = np.array([vocab_size if p.top_k == -1 else min(p.top_k, vocab_size)
                                for p in params], np.int32)
    if any(p.top_p < 1 for p in params):
        rows.top_ps = np.array([p.top_p for p in params], np.float32)
    if any(p.min_p > 0 for p in params):
        rows.min_ps = np.array([p.min_p for p in params], np.float32)
    seeded = [(i, p.seed, step) for i, (p, step) in enumerate(zip(params, steps))
              if p.seed is not None and p.temperature > 0]
    rows.seeds = seeded or None
    return rows


@dataclass
class PenaltyRows:
    """The batch rows that use penalties or min_tokens, with their settings and history.

    `ids` is one int64 matrix, so it travels in the step's one copy: [batch row | row of its
    pending token in the previous step's sampled ids (-1: none) | prompt | output (one more
    column for the pending token) | banned ids], padded with vocab_size (a column the device
    side's masks cut off).
    """

    ids: np.ndarray       # [R, 2 + prompt_cols + output_cols + banned_cols] int64
    settings: np.ndarray  # [R, 3] float32: repetition (1 = off), frequency, presence (0 = off)
    prompt_cols: int      # 0 when no row uses a repetition penalty
    output_cols: int      # 0 when no row uses any penalty (min_tokens only)
    banned_cols: int      # 0 when no row is short of its min_tokens
    has_pending: bool     # some row's last output token is still on the device


def penalty_rows(seqs: list[Sequence], eos_ids: frozenset[int], prev_rows: dict[int, int],
                 vocab_size: int) -> PenaltyRows | None:
    """The batch's PenaltyRows, or None (nothing built) when no row uses a penalty or is
    short of its min_tokens.

    Host work is O(rows x tokens) a step for the rows that use them: their whole history is
    sent again each step, so the device keeps no per-sequence state. A token still pending
    (async scheduling: PLACEHOLDER on the host) is named by its row prev_rows[seq_id] of the
    previous step's sampled ids; the device side reads it there.
    """
    picked, banning = _rows_to_process(seqs)
    if not picked:
        return None
    active = [seqs[i] for i in picked]
    params = [s.sampling_params for s in active]
    use_prompt = any(p.repetition_penalty != 1 for p in params)
    use_output = any(p.penalized for p in params)
    # vLLM bans the end tokens even with ignore_eos (they are in its all_stop_token_ids);
    # an id outside the vocabulary can never be sampled anyway.
    bans = [sorted(t for t in {*eos_ids, *s.sampling_params.stop_token_ids} if t < vocab_size)
            if ban else [] for s, ban in zip(active, banning)]
    p_len = max(s.num_prompt_tokens for s in active) if use_prompt else 0
    o_len = max(s.num_completion_tokens for s in active) + 1 if use_output else 0
    k_len = max(map(len, bans))
    ids = np.full((len(active), 2 + p_len + o_len + k_len), vocab_size, dtype=np.int64)
    ids[:, 0] = picked
    ids[:, 1] = -1
    o0, k0 = 2 + p_len, 2 + p_len + o_len
    for r, s in enumerate(active):
        known = s.num_tokens - s.num_pending
        if use_prompt:
            ids[r, 2: 2 + s.num_prompt_tokens] = s.token_ids[: s.num_prompt_tokens]
        if use_output:
            ids[r, o0: o0 + known - s.num_prompt_tokens] = s.token_ids[s.num_prompt_tokens:known]
            if s.num_pending:  # at most one: steps are launched one ahead, no further
                ids[r, 1] = prev_rows[s.seq_id]
        ids[r, k0: k0 + len(bans[r])] = bans[r]
    settings = np.array([(p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
                         for p in params], dtype=np.float32)
    return PenaltyRows(ids, settings, p_len, o_len, k_len,
                       has_pending=bool(use_output and ids[:, 1].max() >= 0))


def _rows_to_process(seqs: list[Sequence]) -> tuple[list[int], list[bool]]:
    """Rows that use a penalty or are short of min_tokens, and whether each bans its stops."""
    picked, banning = [], []
    for i, s in enumerate(seqs):
        sp = s.sampling_params
        # Plain attribute tests first: this is all that a batch without penalties pays
        # (~0.1 us a row).
        if not (sp.min_tokens or sp.repetition_penalty != 1 or sp.presence_penalty
                or sp.frequency_penalty):
            continue
        ban = s.num_completion_tokens < sp.min_tokens
        if ban or sp.penalized:
            picked.append(i)
            banning.append(ban)
    return picked, banning


def grammar_bitmask(seqs: list[Sequence], rows: list[int],
                    num_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The step's grammar masks, or None (nothing built) when no sequence has a grammar:
    [num_rows, words] int32 over the grammar's vocabulary (bit i of word w set when token
    32 w + i may come next) and [num_rows] int32, 1 on the rows a grammar constrains (the
    sampler forbids their logits past the grammar's vocabulary: padding ids). rows[j] is
    sequence j's row; rows without a grammar allow everything. A sequence already finished
    (async scheduling computed one row too many for it) is left unconstrained."""
    constrained = [(r, s.grammar) for r, s in zip(rows, seqs)
                   if s.grammar is not None and not s.is_finished]
    if not constrained:
        return None
    service = constrained[0][1].service
    mask = np.full((num_rows, service.words), -1, dtype=np.int32)
    flags = np.zeros(num_rows, dtype=np.int32)
    at = [r for r, _ in constrained]
    # Each matcher has accepted every known token of its sequence.
    service.fill(mask, at, [g for _, g in constrained])
    flags[at] = 1
    return mask, flags


@dataclass
class LogprobPlan:
    """Which rows of a step want logprobs: (row of the step's sampled ids, k) per sampled
    row and (sequence's row, prompt positions, k) per prompt chunk, with their arrays."""

    num_seqs: int
    sample: list[tuple[int, int]]
    prompt: list[tuple[int, int, int]]
    k: int
    sample_rows: np.ndarray | None  # [S] int32 when only some rows want them (None: all)
    targets: np.ndarray | None      # [P] int32 the prompt tokens the prompt rows predict


def logprob_plan(seqs: list[Sequence], is_prefill: bool,
                 prompt_rows: np.ndarray | None) -> LogprobPlan | None:
    """The step's logprob work, or None when no sequence asks (the common case: free)."""
    if prompt_rows is None and all(s.logprobs is None for s in seqs):
        return None
    sample, prompt, targets = [], [], []
    for i, s in enumerate(seqs):
        # A prefill chunk that stops short of the prompt's end samples nothing real.
        if s.logprobs is not None and (
                not is_prefill or s.num_cached_tokens + s.num_scheduled_tokens >= len(s)):
            sample.append((i, s.sampling_params.logprobs))
        first, count = s.prompt_logit_rows() if is_prefill else (0, 0)
        if count:
            start = s.num_cached_tokens + first + 1  # position p's logits predict p + 1
            targets += s.token_ids[start: start + count]
            prompt.append((i, count, s.sampling_params.prompt_logprobs))
    if not sample and not prompt:
        return None
    some = 0 < len(sample) < len(seqs)
    return LogprobPlan(len(seqs), sample, prompt, max(e[-1] for e in sample + prompt),
                       np.array([i for i, _ in sample], np.int32) if some else None,
                       np.array(targets, np.int32) if prompt else None)


def row_logprob_plan(params: list[SamplingParams], rows: int) -> LogprobPlan | None:
    """A verify step's logprob work: every row of the sequences that ask (the host keeps
    those of the tokens it accepts), or None."""
    sample = [(r, p.logprobs) for r, p in enumerate(params[:rows]) if p.logprobs is not None]
    if not sample:
        return None
    some = len(sample) < rows
    return LogprobPlan(rows, sample, [], max(k for _, k in sample),
                       np.array([r for r, _ in sample], np.int32) if some else None, None)


def verify_rows(seqs: list[Sequence], counts: list[int], eos_ids: frozenset[int],
                vocab_size: int) -> tuple:
    """(sampling, penalty, logprob) rows of a verify step: a row per token computed, row j
    of a sequence sampling its (j + 1)-th new token."""
    params = [s.sampling_params for s, c in zip(seqs, counts) for _ in range(c)]
    steps = [s.num_completion_tokens + j for s, c in zip(seqs, counts) for j in range(c)]
    penalties = None
    if any(p.penalized or p.min_tokens for p in params):
        penalties = penalty_rows(row_views(seqs, counts), eos_ids, {}, vocab_size)
    return (sampling_rows(params, steps, vocab_size), penalties,
            row_logprob_plan(params, len(params)))


class _RowView:
    """Row j of a verify step's sequence, as the penalty rows read a sequence: its tokens
    and drafts up to the token row j samples after (drafts judged as if accepted: a row
    counts only when they were)."""

    __slots__ = ("num_completion_tokens", "num_prompt_tokens", "num_tokens", "sampling_params",
                 "token_ids")
    num_pending = 0

    def __init__(self, seq: Sequence, j: int):
        self.token_ids = seq.token_ids[:seq.num_tokens] + seq.spec_token_ids[:j]
        self.num_tokens = seq.num_tokens + j
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.num_completion_tokens = seq.num_completion_tokens + j
        self.sampling_params = seq.sampling_params


def row_views(seqs: list[Sequence], counts: list[int]) -> list:
    """Every row of a verify step as a sequence-like view (for penalty_rows)."""
    return [_RowView(s, j) if s.sampling_params.penalized or s.sampling_params.min_tokens
            else s for s, c in zip(seqs, counts) for j in range(c)]
