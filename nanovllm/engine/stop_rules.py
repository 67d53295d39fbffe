"""When a sequence ends, and why: end tokens, stop token ids, length limits and stop strings
(these through the engine's TextDecoder, which detokenizes). No torch here."""
from nanovllm.engine.sequence import Sequence


def length_done(seq: Sequence, max_model_len: int) -> bool:
    """Whether seq's newest (maybe pending) token is its last by length."""
    n = seq.num_tokens  # (num_completion_tokens without the property: every step, every seq)
    return n - seq.num_prompt_tokens >= seq.sampling_params.max_tokens or n >= max_model_len


def finish_reason(seq: Sequence, token_id: int, eos_ids: set[int],
                  max_model_len: int) -> tuple[str | None, int | None]:
    """(finish reason or None, stop reason) after seq sampled token_id: as in vLLM, an end
    token stops with stop reason None and a stop token id with that id, once seq has
    min_tokens. A sequence with a grammar advances it by the token, and stops once the
    grammar is complete (its end token accepted, also with ignore_eos)."""
    sp = seq.sampling_params
    grammar = seq.grammar
    # The sampler masked every token the grammar forbids: a rejection is an internal error.
    if grammar is not None and not grammar.accept(token_id):
        return "error", f"the structured output's grammar rejected token {token_id}"
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
    if grammar is not None and grammar.terminated:
        return "stop", None
    if generated >= sp.max_tokens or known >= max_model_len:
        return "length", None
    return None, None


def take_sampled(seq: Sequence, token_id: int, eos_ids: set[int],
                 max_model_len: int) -> tuple[str | None, int | str | None]:
    """Fill seq's oldest pending token with a step's sampled token_id; returns (finish reason
    or None, stop reason) as finish_reason does (a verify step's tokens: see speculation.py)."""
    if seq.sampling_params.max_tokens == 0:
        # Prompt only (scoring): the step sampled a token for the batch's sake; drop it (and
        # its logprob entry) so the sequence ends with none.
        seq.drop_pending()
        seq.truncate(seq.num_prompt_tokens)
        return "length", None
    seq.fill_pending(token_id)
    return finish_reason(seq, token_id, eos_ids, max_model_len)


def stop_string_end(seq: Sequence, old_len: int, decoder) -> str | None:
    """The stop string seq's newest tokens (those past old_len) complete, or None; a verify
    step's tokens are checked one by one, and those after the one that completes a stop
    string are dropped (single steps would not have made them)."""
    sp, known = seq.sampling_params, seq.num_tokens - seq.num_pending
    for end in range(max(old_len + 1, seq.num_prompt_tokens + sp.min_tokens + 1), known + 1):
        stop = decoder.stop_string_hit(seq.token_ids[seq.num_prompt_tokens:end], sp)
        if stop is not None:
            if end < known:
                seq.truncate(end)
            return stop
    return None
