"""Output processing, the one place where what a core reports becomes RequestOutputs:
detokenizing (whole or as a stream of deltas), the text cut at a stop string, logprob dicts,
cumulative logprobs and the samples a request never forked. Runs on the front side. No torch.
"""
from nanovllm.engine import logprobs as lp
from nanovllm.engine.messages import RequestEnd, SampleDelta
from nanovllm.engine.text_stream import TextStream
from nanovllm.engine.tokenizer import TextDecoder
from nanovllm.outputs import CompletionOutput, RequestOutput, SpecMetrics
from nanovllm.sampling_params import SamplingParams


class RequestState:
    """One request on the front side: its prompt, and per sample the text handed out so far.

    output() turns what arrived since its last call into a RequestOutput holding what is new:
    called once with everything (batch generation) it is the whole output; called as
    deltas arrive (streaming) it is the next delta."""

    def __init__(self, request_id, prompt: str | None, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, text: TextDecoder):
        self.request_id, self.prompt = request_id, prompt
        self.prompt_token_ids, self.sp, self._text = prompt_token_ids, sampling_params, text
        self._streams: dict[int, TextStream] = {}  # sample index -> its text so far
        self._cum: dict[int, float] = {}  # sample index -> cumulative logprob so far
        self._ended: set[int] = set()  # samples whose end was handed out

    def output(self, samples: list[SampleDelta], end: RequestEnd | None) -> RequestOutput:
        """The RequestOutput of these sample deltas (in arrival order) and, once the request
        ended, its end: one completion per sample that moved, `finished` with the end."""
        parts: dict[int, list] = {}  # sample index -> [ids, entries, text, reasons]
        for delta in samples:  # several steps' deltas of a sample: one window to decode
            part = parts.setdefault(delta.index, [[], None, "", None])
            part[0] += delta.token_ids
            if delta.logprobs is not None:
                part[1] = (part[1] or []) + delta.logprobs
            if delta.finish_reason is not None:
                part[3] = (delta.finish_reason, delta.stop_reason)
        for index, part in parts.items():
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = TextStream(self._text.decode, self.sp.stop)
            if part[3] is None:
                part[2] = stream.add(part[0])
                continue
            # The final text, cut at a stop string, replaces the held-back tail.
            stream.token_ids += part[0]
            part[2] = stream.finish(self._text.completion_text(stream.token_ids, self.sp))
            self._ended.add(index)
        if end is not None:  # samples never forked: the request ended before its prompt did
            empty = None if self.sp.logprobs is None else []
            for index in range(self.sp.n):
                if index not in self._ended:
                    parts[index] = [[], empty, "", (end.finish_reason, None)]
        completions = [self._completion(index, *parts[index]) for index in sorted(parts)]
        prompt_lps = None if end is None else lp.prompt_logprobs(
            end.prompt_logprobs, self.prompt_token_ids, self._text.token_text)
        spec = None if end is None or end.spec_counts is None else SpecMetrics(*end.spec_counts)
        return RequestOutput(request_id=self.request_id, prompt=self.prompt,
                             prompt_token_ids=self.prompt_token_ids, outputs=completions,
                             finished=end is not None, prompt_logprobs=prompt_lps,
                             spec_metrics=spec)

    def _completion(self, index: int, ids: list[int], entries, text: str,
                    reasons: tuple | None) -> CompletionOutput:
        fields = lp.completion_fields(entries, ids, self._text.token_text)
        if fields["cumulative_logprob"] is not None:
            total = self._cum.get(index, 0.0) + fields["cumulative_logprob"]
            self._cum[index] = fields["cumulative_logprob"] = total
        reason, stop_reason = (None, None) if reasons is None else reasons
        return CompletionOutput(index=index, text=text, token_ids=ids, finish_reason=reason,
                                stop_reason=stop_reason, **fields)


def failure(output: RequestOutput) -> str | None:
    """Why the engine step running this request raised (finish_reason "error"), or None."""
    failed = next((c for c in output.outputs if c.finish_reason == "error"), None)
    return None if failed is None else failed.stop_reason
