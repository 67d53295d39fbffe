"""What a launched step hands back: its sampled ids and, when some sequence asks for them,
its logprobs, brought to the host with the ids (the same event; no per-token host syncs)."""
import torch

from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.worker.logprobs import LogprobsStep
from nanovllm.worker.stager import step_copy


class StepResult:
    """A launched step's sampled ids, and logprobs when asked for: ready now, or once the
    device gets there (one event covers both copies)."""

    def __init__(self, ids, done=None, logprobs: LogprobsStep | None = None,
                 row_counts: list[int] | None = None):
        """row_counts: a verify step's rows per sequence (ids then hold every row's token
        and accept flag, see worker/verify.py)."""
        self._ids, self._done, self._lp, self._rows = ids, done, logprobs, row_counts
        self.logprobs: StepLogprobs | None = None  # set by result()

    def result(self) -> list | None:
        """The ids (None on ranks other than 0), waiting for the device if needed: one per
        sequence, or for a verify step a list per sequence; then .logprobs holds the step's
        logprobs (None when no sequence asked)."""
        if self._done is not None:
            self._done.synchronize()
            self._ids, self._done = self._ids.tolist(), None
        if self._lp is not None:
            self.logprobs, self._lp = self._lp.unpack(), None
        if self._rows is not None:
            ids = _split(self._ids, self._rows)
            if self.logprobs is not None:  # the rows' entries, each sequence's kept rows'
                rows, start, per_seq = self.logprobs.sample, 0, []
                for count, kept in zip(self._rows, ids):
                    per_seq.append(rows[start:start + len(kept)])
                    start += count
                self.logprobs = StepLogprobs(per_seq, [None] * len(ids))
            self._ids, self._rows = ids, None
        return self._ids


def _split(packed: list[int], row_counts: list[int]) -> list[list[int]]:
    """Rows' tokens + accept flags -> each sequence's tokens out: its rows up to and
    including the first whose draft was rejected (or its last row, which has none)."""
    rows = len(packed) // 2
    out, start = [], 0
    for count in row_counts:
        kept = 1
        while kept < count and packed[rows + start + kept - 1]:
            kept += 1
        out.append(packed[start:start + kept])
        start += count
    return out


class HostBuffer:
    """A pinned host buffer, grown on demand, that a verify step's results travel back in
    (the step is waited for before the next: one buffer is enough)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def send(self, out: torch.Tensor, row_counts: list[int], lp: LogprobsStep | None,
             pinned: bool) -> StepResult:
        """Start out's copy to the host; the result splits it per sequence."""
        if not pinned:
            return StepResult(out.tolist(), logprobs=lp, row_counts=row_counts)
        if self.buffer is None or self.buffer.numel() < out.numel():
            self.buffer = torch.empty(max(out.numel(), 1024), dtype=torch.int32,
                                      pin_memory=True)
        host = self.buffer[:out.numel()]
        step_copy(host, out)  # a kernel writes the pinned buffer (kernels/host_copy.py)
        done = torch.cuda.Event()
        done.record()
        return StepResult(host, done, lp, row_counts=row_counts)
