"""A step that samples after its forward: structured output under async scheduling.

A grammar step's masks need the tokens of the step still in flight accepted by the matchers,
so ModelRunner.launch(late_masks=True) queues only the forward and returns a LateSample; the
core takes the previous step's results, fills the masks while the device runs the forward,
and hands them to sample(), which queues the sampling at once. (Queuing it later, just
before the next step's forward so that the host could build that step first, measured
slower on the H100: 68-72% of unconstrained against 74-80%.)
"""
import torch

from nanovllm.worker.logprobs import LogprobsStep
from nanovllm.worker.sampler import SamplingTensors
from nanovllm.worker.step_output import StepResult


class LateSample:
    """A step whose forward is queued and whose sampling waits for its grammar masks."""

    def __init__(self, runner, logits, st: SamplingTensors,
                 lp: LogprobsStep | None, num_seqs: int, num_rows: int):
        self._runner, self._logits, self._st, self._lp = runner, logits, st, lp
        self.num_seqs, self.num_rows = num_seqs, num_rows  # rows: the masks' first dim

    def sample(self, masks: tuple | None) -> StepResult:
        """Queue the sampling under masks (sampling_rows.grammar_bitmask's pair, or None:
        no row is constrained); returns the step's result handle."""
        runner, st = self._runner, self._st
        if masks is not None:
            dev = runner.mask_stager.upload(dict(bitmask=masks[0], rows=masks[1]))
            st.bitmask, st.grammar_rows = dev["bitmask"], dev["rows"]
        with torch.inference_mode():
            return runner._sample(self._logits, st, self._lp, self.num_seqs)
