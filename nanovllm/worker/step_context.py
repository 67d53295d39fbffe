"""The attention context of a staged prefill step: one prefill over every row, or for a mixed
step (engine/mixed_rows.py) a decode part over the leading rows and a prefill part over the
rest (layers/attention.py splits the rows between them)."""
import torch

from nanovllm.engine.step_inputs import StepInputs
from nanovllm.utils.context import Context


def prefill_context(inputs: StepInputs, dev: dict[str, torch.Tensor],
                    calibrate_kv: bool = False, fit_feedback: int = 0) -> dict:
    """set_context's arguments for the staged prefill step `inputs` (device tensors `dev`)."""
    cu_q, cu_k, slots = dev["cu_seqlens_q"], dev["cu_seqlens_k"], dev["slot_mapping"]
    common = dict(is_prefill=True, max_seqlen_q=inputs.max_seqlen_q,
                  max_seqlen_k=inputs.max_seqlen_k, has_cached_context=inputs.has_cached_context)
    d = inputs.num_decode_rows
    if not d:
        return dict(common, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, slot_mapping=slots,
                    block_tables=dev["block_tables"], calibrate_kv=calibrate_kv,
                    fit_feedback=fit_feedback)
    lens, order = dev["decode_rows"][:, :d]
    decode = Context(slot_mapping=slots[:d], context_lens=lens,
                     block_tables=dev["decode_tables"], decode_order=order)
    prefill = None
    if inputs.num_seqs > d:
        # Rebased to the prefill part's rows (two tiny device ops a step, no host sync).
        prefill = Context(**common, cu_seqlens_q=cu_q[d:] - d, cu_seqlens_k=cu_k[d:] - cu_k[d],
                          slot_mapping=slots[d:], block_tables=dev["block_tables"])
    # The whole step's: every row's slot (one K/V store) and cu_seqlens_q (the LM head takes
    # each sequence's last row); attention reads the parts.
    return dict(common, cu_seqlens_q=cu_q, slot_mapping=slots, calibrate_kv=calibrate_kv,
                fit_feedback=fit_feedback, num_decode_rows=d, decode_part=decode,
                prefill_part=prefill)


def feed_tokens(ids: torch.Tensor, feed_rows: torch.Tensor, sampled: torch.Tensor) -> None:
    """ids[i] = sampled[feed_rows[i]] where feed_rows[i] >= 0, on the device (no host sync)."""
    if ids.is_cuda:  # one launch instead of five (a batch-1 step's replay is ~1 ms)
        from nanovllm.kernels.feed_tokens import feed_tokens_gpu

        return feed_tokens_gpu(ids, feed_rows, sampled)
    ids.copy_(torch.where(feed_rows >= 0, sampled[feed_rows.clamp(min=0)], ids))
