"""What a launched step hands back: its sampled ids and, when some sequence asks for them,
its logprobs, brought to the host with the ids (the same event; no per-token host syncs)."""
from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.worker.logprobs import LogprobsStep


class StepResult:
    """A launched step's sampled ids, and logprobs when asked for: ready now, or once the
    device gets there (one event covers both copies)."""

    def __init__(self, ids, done=None, logprobs: LogprobsStep | None = None):
        self._ids, self._done, self._lp = ids, done, logprobs
        self.logprobs: StepLogprobs | None = None  # set by result()

    def result(self) -> list[int] | None:
        """The ids (None on ranks other than 0), waiting for the device if needed; then
        .logprobs holds the step's logprobs (None when no sequence asked)."""
        if self._done is not None:
            self._done.synchronize()
            self._ids, self._done = self._ids.tolist(), None
        if self._lp is not None:
            self.logprobs, self._lp = self._lp.unpack(), None
        return self._ids
