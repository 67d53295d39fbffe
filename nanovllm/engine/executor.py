"""How the engine reaches the device: one typed interface. The implementations (in-process,
or over tensor-parallel worker processes) live in nanovllm/worker/; this module, like the rest
of engine/, imports no torch and nothing of the device side."""
from typing import Protocol

from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.engine.sequence import Sequence


class StepHandle(Protocol):
    """A launched step: its sampled ids once the device gets there, then its logprobs."""

    logprobs: StepLogprobs | None  # set by result(); None when no sequence asked

    def result(self) -> list[int]:
        """The token sampled for each sequence of the step, waiting for the device."""


class Executor(Protocol):
    """Runs engine steps on every rank; the engine sees nothing else of the device side."""

    @property
    def num_kvcache_blocks(self) -> int:
        """KV-cache blocks allocated (the same on every rank)."""

    @property
    def on_gpu(self) -> bool:
        """Whether the steps run on a GPU (where overlapping host and device work pays)."""

    def set_eos_ids(self, eos_ids: set[int]) -> None:
        """The end tokens, which min_tokens keeps from being sampled (rank 0 samples)."""

    # Whether launch(..., late_masks=True) is supported: it queues the forward and returns
    # a handle whose sample(masks) queues the sampling under the step's grammar masks
    # (sampling_rows.grammar_bitmask), filled while the device runs the forward.
    late_masks: bool

    def launch(self, seqs: list[Sequence], is_prefill: bool) -> StepHandle:
        """Start one step (or run it, for an executor that cannot overlap); the handle's
        result() gives the sampled token ids, and then .logprobs the step's logprobs."""

    def shutdown(self) -> None:
        """Release workers, process groups and shared memory (idempotent)."""
