"""Logprobs on the host: recording a step's results on its sequences, and vLLM's output
dicts. No torch here (the model runner computes them: see worker/step_output.py).

An entry is one position's (logprob, rank, top-k ids, top-k logprobs), in plain Python: the
chosen token's (the sampled one, or the prompt's next token) logprob and rank under the raw
distribution, and the k most likely tokens', best first.
"""
from collections.abc import Callable
from dataclasses import dataclass

from nanovllm.engine.sequence import Sequence
from nanovllm.outputs import Logprob, PositionLogprobs

Entry = tuple[float, int, list[int], list[float]]


@dataclass
class StepLogprobs:
    """One step's logprobs, by position of the sequence in the step (None: it has none)."""

    sample: list[Entry | None]  # the sampled token's entry
    prompt: list[list[Entry] | None]  # entries of the prompt tokens the step's chunk predicts


def record(seqs: list[Sequence], step: StepLogprobs) -> None:
    """Append a step's logprobs to its sequences, with its tokens (before Scheduler.on_result
    fills them): a sequence that ended since the step was launched gets none, as it gets no
    token, so each sequence's entries match its known tokens one for one."""
    for seq, sample, prompt in zip(seqs, step.sample, step.prompt):
        if seq.is_finished:
            continue
        if prompt:
            seq.prompt_logprobs.extend(prompt)
        if sample is not None:
            seq.logprobs.append(sample)


def record_verified(seqs: list[Sequence], step: StepLogprobs, known_before: list[int]) -> None:
    """Append a verify step's entries (a list per sequence) for the tokens each sequence
    took (after Scheduler.on_result: it stops at a token that ends the sequence)."""
    for seq, entries, before in zip(seqs, step.sample, known_before):
        if seq.logprobs is not None and entries:
            taken = seq.num_tokens - seq.num_pending - before
            seq.logprobs.extend(entries[:taken])


def position_logprobs(entry: Entry, token_id: int,
                      decode: Callable[[int], str | None]) -> PositionLogprobs:
    """vLLM's dict of one position: the chosen token first, with its own rank, then the top-k
    with ranks 1..k (a chosen token among them keeps its place and takes their rank)."""
    logprob, rank, top_ids, top_logprobs = entry
    out = {token_id: Logprob(logprob, rank, decode(token_id))}
    for r, (t, lp) in enumerate(zip(top_ids, top_logprobs), 1):
        out[t] = Logprob(lp, r, decode(t))
    return out


def completion_fields(entries: list[Entry] | None, tokens: list[int],
                      decode: Callable[[int], str | None]) -> dict:
    """CompletionOutput's logprobs and cumulative_logprob (the sum of the tokens' logprobs)
    from a sample's entries and tokens; both None when SamplingParams.logprobs was not set
    (entries None), as in vLLM."""
    if entries is None:
        return dict(logprobs=None, cumulative_logprob=None)
    # strict: one entry per known token is an invariant (see record), never to be papered over.
    return dict(logprobs=[position_logprobs(e, t, decode)
                          for e, t in zip(entries, tokens, strict=True)],
                cumulative_logprob=sum(e[0] for e in entries))


def prompt_logprobs(entries: list[Entry | None] | None, prompt_token_ids: list[int],
                    decode: Callable[[int], str | None]) -> list[PositionLogprobs | None] | None:
    """A request's prompt logprobs from its entries (a leading None, then one per prompt
    token computed so far): None for the first prompt token, then a dict per token; None when
    SamplingParams.prompt_logprobs was not set (entries None)."""
    if entries is None:
        return None
    # An aborted request may have fewer; more would be a bug (a prompt computed twice).
    tokens = prompt_token_ids[1: len(entries)]
    return [None] + [position_logprobs(e, t, decode)
                     for e, t in zip(entries[1:], tokens, strict=True)]
