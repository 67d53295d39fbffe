"""How the engine reaches the model: one interface, in-process or over worker processes.

This module imports no torch: the executor that is chosen brings it in.
"""
from typing import Protocol

from nanovllm.config import Config
from nanovllm.engine.sequence import Sequence


class Executor(Protocol):
    """Runs engine steps on every rank; the engine sees nothing else of the device side."""

    @property
    def num_kvcache_blocks(self) -> int:
        """KV-cache blocks allocated (the same on every rank)."""

    def set_eos_ids(self, eos_ids: set[int]) -> None:
        """The end tokens, which min_tokens keeps from being sampled (rank 0 samples)."""

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        """One step: returns the token sampled for each sequence."""

    def launch(self, seqs: list[Sequence], is_prefill: bool):
        """Start one step (or run it, for an executor that cannot overlap); returns a handle
        whose result() gives the sampled token ids, and then .logprobs the step's logprobs."""

    def shutdown(self) -> None:
        """Release workers, process groups and shared memory (idempotent)."""


class AsyncExecutor(Executor, Protocol):
    """An executor whose launch() returns before the step ends (async scheduling)."""

    @property
    def on_gpu(self) -> bool:
        """Whether the steps run on a GPU (where overlapping host and device work pays)."""


class LocalExecutor:
    """A single ModelRunner in this process."""

    def __init__(self, config: Config):
        from nanovllm.engine.model_runner import ModelRunner

        self.runner = ModelRunner(config)

    @property
    def num_kvcache_blocks(self) -> int:
        """KV-cache blocks the runner allocated."""
        return self.runner.num_kvcache_blocks

    @property
    def on_gpu(self) -> bool:
        """Whether the runner's device is a GPU."""
        return self.runner.device.type == "cuda"

    def set_eos_ids(self, eos_ids: set[int]) -> None:
        """Tell the runner the end tokens (for min_tokens)."""
        self.runner.eos_ids = frozenset(eos_ids)

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        """One step on the one runner."""
        return self.runner.run(seqs, is_prefill)

    def launch(self, seqs: list[Sequence], is_prefill: bool):
        """Start one step; the handle's result() waits for its sampled ids (and logprobs)."""
        return self.runner.launch(seqs, is_prefill)

    def shutdown(self) -> None:
        """Drop the runner, so its weights and KV cache can be freed."""
        self.runner = None


def create_executor(config: Config) -> Executor:
    """The executor for config.tensor_parallel_size ranks."""
    if config.tensor_parallel_size == 1:
        return LocalExecutor(config)
    from nanovllm.distributed.executor import MultiprocExecutor

    return MultiprocExecutor(config)
