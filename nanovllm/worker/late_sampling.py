"""Steps that sample after their forward: structured output under async scheduling.

A grammar step's masks need the tokens of the step still in flight accepted by the matchers,
so ModelRunner.launch(late_masks=True) queues only the forward and returns a LateStep. The
core takes the previous step's results, fills the masks and hands them to sample(). The
sampling is queued just before the next step is staged (or when this step's result is
asked for): by then the host has built the next step's inputs while the device ran this
step's forward, and the next forward follows this sampling with no gap.
"""
import torch

from nanovllm.worker.logprobs import LogprobsStep
from nanovllm.worker.sampler import SamplingTensors
from nanovllm.worker.stager import Stager
from nanovllm.worker.step_output import StepResult


class LateSampling:
    """A runner's late steps: at most one whose masks came and whose sampling is not queued."""

    def __init__(self, runner):
        self.runner = runner
        self.stager = Stager(runner.device)  # the masks' own staging buffers
        self._due: "LateStep | None" = None

    def step(self, logits: torch.Tensor, st: SamplingTensors, lp: LogprobsStep | None,
             num_seqs: int, num_rows: int) -> "LateStep":
        """A launched step's handle; its sampling waits for sample(masks)."""
        return LateStep(self, logits, st, lp, num_seqs, num_rows)

    def flush(self) -> None:
        """Queue the due step's sampling (before anything that reads what it writes)."""
        if self._due is not None:
            due, self._due = self._due, None
            due.enqueue()


class LateStep:
    """A step whose forward is queued and whose sampling waits for its grammar masks."""

    def __init__(self, owner: LateSampling, logits, st, lp, num_seqs: int, num_rows: int):
        self._owner, self._logits, self._st, self._lp = owner, logits, st, lp
        self.num_seqs, self.num_rows = num_seqs, num_rows  # rows: the masks' first dim
        self._masks = None
        self._result: StepResult | None = None
        self.logprobs = None  # set by result(), as StepResult does

    def sample(self, masks: tuple | None) -> "LateStep":
        """Hand in the masks (sampling_rows.grammar_bitmask's pair, or None: no row is
        constrained); the sampling is queued with the next step. Returns self (the handle)."""
        assert self._owner._due is None, "a late step's sampling was never queued"
        self._masks, self._owner._due = masks, self
        return self

    def enqueue(self) -> None:
        """Queue the sampling on the device (LateSampling.flush calls it)."""
        runner, st = self._owner.runner, self._st
        if self._masks is not None:
            dev = self._owner.stager.upload(dict(bitmask=self._masks[0], rows=self._masks[1]))
            st.bitmask, st.grammar_rows = dev["bitmask"], dev["rows"]
        with torch.inference_mode():
            self._result = runner._sample(self._logits, st, self._lp, self.num_seqs)
        self._logits = self._st = self._lp = self._masks = None

    def result(self) -> list[int]:
        """The sampled ids, waiting for the device (queuing the sampling first if needed)."""
        if self._result is None:
            self._owner.flush()
        ids = self._result.result()
        self.logprobs = self._result.logprobs
        return ids
