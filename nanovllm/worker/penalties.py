"""Repetition, frequency and presence penalties and min_tokens, with vLLM's meanings: one
batched pass over the raw logits of the rows that use them, before temperature, top-k/p and
min-p, so greedy takes the argmax of the penalized logits.

The rows are built on the host (engine/sampling_rows.py: penalty_rows); this is their device
half. vLLM's order: min_tokens first (end tokens and stop ids get -inf), then repetition (a token
seen in the prompt or the output: a positive logit is divided by the penalty, a negative one
multiplied), frequency (minus penalty x the token's count in the output) and presence (minus
penalty once if the token is in the output).
"""
from dataclasses import dataclass

import torch

from nanovllm.engine.sampling_rows import PenaltyRows


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


def penalty_tensors(rows: PenaltyRows, dev: dict[str, torch.Tensor],
                    sampled: torch.Tensor) -> PenaltyTensors:
    """The host builder's PenaltyRows, their arrays already uploaded (`dev`), with each
    pending output token read from sampled (the previous step's ids, still on the device):
    called before this step overwrites them."""
    ints, floats = dev["penalty_ids"], dev["penalty_settings"]
    o0 = 2 + rows.prompt_cols
    k0 = o0 + rows.output_cols
    if rows.has_pending:
        src = ints[:, 1]
        pending = sampled[src.clamp(min=0)].long()
        # The vocab_size padding of the output's last column: the pending token's place.
        ints[:, k0 - 1] = torch.where(src >= 0, pending, ints[:, k0 - 1])
    return PenaltyTensors(
        rows=ints[:, 0].contiguous(),
        repetition=floats[:, 0], frequency=floats[:, 1], presence=floats[:, 2],
        prompt=ints[:, 2:o0] if rows.prompt_cols else None,
        output=ints[:, o0:k0] if rows.output_cols else None,
        banned=ints[:, k0:] if rows.banned_cols else None)


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
