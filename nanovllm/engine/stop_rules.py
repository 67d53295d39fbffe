"""When a sequence ends, and why: end tokens, stop token ids and length limits. No torch here.

(Stop strings need the detokenized text, so the engine checks those; see TextDecoder.)
"""
from nanovllm.engine.sequence import Sequence


def length_done(seq: Sequence, max_model_len: int) -> bool:
    """Whether seq's newest (maybe pending) token is its last by length."""
    return (seq.num_completion_tokens >= seq.sampling_params.max_tokens
            or seq.num_tokens >= max_model_len)


def finish_reason(seq: Sequence, token_id: int, eos_ids: set[int],
                  max_model_len: int) -> tuple[str | None, int | None]:
    """(finish reason or None, stop reason) after seq sampled token_id: as in vLLM, an end
    token stops with stop reason None and a stop token id with that id, once seq has
    min_tokens."""
    sp = seq.sampling_params
    # Count only known tokens: a later step may already have a pending one in flight.
    known = seq.num_tokens - seq.num_pending
    generated = known - seq.num_prompt_tokens
    # vLLM's rule: no end token or stop id ends a sequence short of min_tokens (the sampler
    # already keeps them out; this holds even if one slipped through).
    if generated >= sp.min_tokens:
        if not sp.ignore_eos and token_id in eos_ids:
            return "stop", None
        if token_id in sp.stop_token_ids:
            return "stop", token_id
    if generated >= sp.max_tokens or known >= max_model_len:
        return "length", None
    return None, None
