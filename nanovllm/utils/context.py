"""Attention metadata for the current forward, set by ModelRunner and read by Attention."""
from dataclasses import dataclass

import torch


@dataclass
class Context:
    """Batch layout of one step (tensors on the model's device)."""

    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    has_cached_context: bool = False  # some prefill sequence starts after cached tokens
    slot_mapping: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    decode_order: torch.Tensor | None = None  # decode: rows longest first (StepInputs.order)
    calibrate_kv: bool = False  # prefill: set the fp8 KV scales from this step's K/V first
    fit_feedback: int = 0  # prefill: refit the fp8 K feedback with the first n rows' queries
    # A prefill step whose first num_decode_rows rows each compute a sequence's last token
    # (a mixed step): they attend as decode rows (decode_part), the rest as a prefill
    # (prefill_part, None when there is no rest); cu_seqlens_q still covers every row.
    num_decode_rows: int = 0
    decode_part: "Context | None" = None
    prefill_part: "Context | None" = None


_CONTEXT = Context()


def get_context() -> Context:
    """The context of the forward in progress."""
    return _CONTEXT


def set_context(**kwargs) -> None:
    """Publish the next forward's attention metadata."""
    global _CONTEXT
    _CONTEXT = Context(**kwargs)


def reset_context() -> None:
    """Drop the metadata (and its tensors) after a forward."""
    global _CONTEXT
    _CONTEXT = Context()


# While piecewise graphs are captured (worker/piecewise_graph.py): called by
# Attention.forward instead of attending, with (the module, q, k, v, positions, rope,
# q_norm, k_norm); None otherwise.
_ATTENTION_CUT = None


def attention_cut():
    """The capture's attention hook, or None (every normal forward)."""
    return _ATTENTION_CUT


def set_attention_cut(fn) -> None:
    """Install (or with None remove) the attention hook of a piecewise capture."""
    global _ATTENTION_CUT
    _ATTENTION_CUT = fn
