"""What the engine core reports after a step: each sample's tokens not sent yet (streaming)
and each request's end, as typed outputs. No torch here."""
from nanovllm.engine.messages import Outputs, RequestEnd, SampleDelta
from nanovllm.engine.sequence import Sequence


class Reports:
    """The live requests and how much of each sample was reported; builds step()'s Outputs.

    stream=True reports every sample's new tokens after each step; stream=False reports a
    request once, whole, when it ends."""

    def __init__(self, stream: bool, speculating: bool):
        self.stream, self.speculating = stream, speculating
        self.live: set[int] = set()  # ids of the requests added and not reported ended
        self._sent: dict[tuple[int, int], int] = {}  # (request id, sample) -> tokens reported

    def clear(self) -> None:
        """Forget every request: none of them is reported any more."""
        self.live, self._sent = set(), {}

    def outputs(self, num_tokens: int, updated: list[Sequence],
                finished: list[Sequence]) -> Outputs:
        """The Outputs of a step that learned tokens of `updated` and ended `finished`."""
        out = Outputs(num_tokens=num_tokens)
        if self.stream:
            for seq in updated:
                if seq.request_id in self.live:
                    self._report(out, seq)
        for req in _finished_requests(finished):
            self._report_end(out, req)
        return out

    def _report(self, out: Outputs, seq: Sequence) -> None:
        """Add a sample's tokens not reported yet (and its end, if it ended) to out."""
        at = (seq.request_id, seq.index)
        start = self._sent.get(at, 0)
        if start < 0:
            return  # its end was reported
        # Only the new ids: slicing completion_token_ids first would copy the whole output.
        base = seq.num_prompt_tokens
        ids = seq.token_ids[base + start: seq.num_tokens - seq.num_pending]
        if not ids and not seq.is_finished:
            return  # a chunk of a prompt, or a token still in flight: nothing to send
        entries = None if seq.logprobs is None else seq.logprobs[start:start + len(ids)]
        if seq.is_finished:
            self._sent[at] = -1
            out.samples.append(SampleDelta(at[0], seq.index, ids, entries, seq.finish_reason,
                                           seq.stop_reason))
        else:
            self._sent[at] = start + len(ids)
            out.samples.append(SampleDelta(at[0], seq.index, ids, entries))

    def _report_end(self, out: Outputs, req: Sequence) -> None:
        """Add a request's end, after its samples' last tokens, to out; forget it."""
        if req.request_id not in self.live:
            return  # dropped by abort_all
        self.live.discard(req.request_id)
        for seq in req.samples:
            self._report(out, seq)
            self._sent.pop((req.request_id, seq.index), None)
        counts = None
        if self.speculating:
            counts = tuple(sum(c) for c in zip(*((s.num_spec_proposed, s.num_spec_accepted,
                                                  s.num_spec_steps) for s in req.samples)))
        out.ended.append(RequestEnd(req.request_id, req.finish_reason, req.prompt_logprobs,
                                    counts))


def _finished_requests(seqs: list[Sequence]) -> list[Sequence]:
    """The requests (first samples), in order of first mention, that seqs, the samples that
    just ended, completed: each request once, when its last sample ends."""
    reqs = {s.request_id: s.request for s in seqs if s.request_finished}
    return list(reqs.values())
