"""Repetition, frequency and presence penalties and min_tokens, with vLLM's meanings: one
batched pass over the raw logits of the rows that use them, before temperature, top-k/p and
min-p, so greedy takes the argmax of the penalized logits.

vLLM's order: min_tokens first (end tokens and stop ids get -inf), then repetition (a token
seen in the prompt or the output: a positive logit is divided by the penalty, a negative one
multiplied), frequency (minus penalty x the token's count in the output) and presence (minus
penalty once if the token is in the output).
"""
from dataclasses import dataclass

import numpy as np
import torch

from nanovllm.engine.sequence import Sequence


@dataclass
class PenaltyTensors:
    """The batch rows that use penalties or min_tokens, with their settings and history."""

    rows: torch.Tensor                 # [R] long: which rows of the batch's logits
    repetition: torch.Tensor           # [R] float; 1 = off
    frequency: torch.Tensor            # [R] float; 0 = off
    presence: torch.Tensor             # [R] float; 0 = off
    prompt: torch.Tensor | None        # [R, P] long prompt ids, padded with vocab_size
    output: torch.Tensor | None        # [R, O] long output ids so far, padded with vocab_size
    banned: torch.Tensor | None        # [R, K] long ids min_tokens holds back, padded


def penalty_tensors(seqs: list[Sequence], eos_ids: frozenset[int], prev_rows: dict[int, int],
                    sampled: torch.Tensor, vocab_size: int) -> PenaltyTensors | None:
    """The batch's PenaltyTensors on sampled's device, or None (nothing built) when no row
    uses a penalty or is short of its min_tokens.

    Host work is O(rows x tokens) a step for the rows that use them: their whole history is
    sent again each step, so the device keeps no per-sequence state. A token still pending
    (async scheduling: PLACEHOLDER on the host) is read here from sampled[prev_rows[seq_id]],
    the previous step's ids, before this step overwrites them.
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
    # One int64 matrix holds everything per row, so it goes over in one copy: [batch row |
    # row of its pending token in sampled (-1: none) | prompt | output | banned ids], padded
    # with vocab_size (a column the masks below cut off).
    p_len = max(s.num_prompt_tokens for s in active) if use_prompt else 0
    # One more output column for the pending token.
    o_len = max(s.num_completion_tokens for s in active) + 1 if use_output else 0
    k_len = max(map(len, bans))
    host = np.full((len(active), 2 + p_len + o_len + k_len), vocab_size, dtype=np.int64)
    host[:, 0] = picked
    host[:, 1] = -1
    o0, k0 = 2 + p_len, 2 + p_len + o_len
    for r, s in enumerate(active):
        known = s.num_tokens - s.num_pending
        if use_prompt:
            host[r, 2: 2 + s.num_prompt_tokens] = s.token_ids[: s.num_prompt_tokens]
        if use_output:
            host[r, o0: o0 + known - s.num_prompt_tokens] = s.token_ids[s.num_prompt_tokens:known]
            if s.num_pending:  # at most one: steps are launched one ahead, no further
                host[r, 1] = prev_rows[s.seq_id]
        host[r, k0: k0 + len(bans[r])] = bans[r]
    floats = np.array([(p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
                       for p in params], dtype=np.float32)
    ints, floats = _to_device(host, sampled.device), _to_device(floats, sampled.device)
    if use_output and host[:, 1].max() >= 0:
        src = ints[:, 1]
        pending = sampled[src.clamp(min=0)].long()
        ints[:, k0 - 1] = torch.where(src >= 0, pending, vocab_size)
    return PenaltyTensors(
        rows=ints[:, 0].contiguous(),
        repetition=floats[:, 0], frequency=floats[:, 1], presence=floats[:, 2],
        prompt=ints[:, 2:o0] if use_prompt else None,
        output=ints[:, o0:k0] if use_output else None,
        banned=ints[:, k0:] if k_len else None)


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


def apply_penalties(logits: torch.Tensor, pt: PenaltyTensors) -> torch.Tensor:
    """[B, V] logits -> float32 logits with pt's rows penalized; the input is left as it was
    (raw logits stay available to whoever wants them)."""
    x = logits.index_select(0, pt.rows).float()
    vocab = x.size(1)
    if pt.banned is not None:
        x.masked_fill_(_id_mask(pt.banned, vocab), float("-inf"))
    if pt.output is not None:
        counts = torch.zeros(x.size(0), vocab + 1, device=x.device)
        counts = counts.scatter_add_(1, pt.output, torch.ones_like(pt.output, dtype=x.dtype))
        counts = counts[:, :vocab]
        in_output = counts > 0
        if pt.prompt is not None:
            seen = in_output | _id_mask(pt.prompt, vocab)
            penalty = torch.where(seen, pt.repetition.unsqueeze(1), 1.0)
            x = torch.where(x > 0, x / penalty, x * penalty)
        x = x - pt.frequency.unsqueeze(1) * counts
        x = x - pt.presence.unsqueeze(1) * in_output
    return logits.float().index_copy(0, pt.rows, x)


def _id_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] bool: which ids each row lists (padding ids == vocab fall off the end)."""
    mask = torch.zeros(ids.size(0), vocab + 1, dtype=torch.bool, device=ids.device)
    return mask.scatter_(1, ids, True)[:, :vocab]


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """One host-to-device copy that does not wait for the device (pinned on a GPU)."""
    t = torch.from_numpy(a)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
