"""RequestOutputs of finished requests: which requests a step completed, and their outputs."""
from nanovllm.engine import logprobs
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.outputs import CompletionOutput, RequestOutput


def finished_requests(seqs: list[Sequence]) -> list[Sequence]:
    """The requests (first samples), in order of first mention, that seqs, the samples that
    just ended, completed: each request once, when its last sample ends."""
    reqs = {s.request_id: s.request for s in seqs if s.request_finished}
    return list(reqs.values())


def request_output(req: Sequence, text: TextDecoder) -> RequestOutput:
    """req's RequestOutput (req: a request's first sample), one completion per sample."""
    decode = text.token_text
    completions = [CompletionOutput(
        index=s.index, text=text.completion_text(s), token_ids=s.completion_token_ids,
        finish_reason=s.finish_reason, stop_reason=s.stop_reason,
        **logprobs.completion_fields(s.logprobs, s.completion_token_ids, decode))
        for s in req.samples]
    # Samples never forked: the request was aborted before its prompt was computed.
    unforked = logprobs.completion_fields(None if req.logprobs is None else [], [], decode)
    completions += [CompletionOutput(index=i, text="", token_ids=[],
                                     finish_reason=req.finish_reason, **unforked)
                    for i in range(len(req.samples), req.sampling_params.n)]
    return RequestOutput(request_id=req.seq_id, prompt=req.prompt,
                         prompt_token_ids=req.prompt_token_ids, outputs=completions,
                         finished=req.request_finished,
                         prompt_logprobs=logprobs.prompt_logprobs(req, decode))
