"""The executors behind engine/executor.py's protocol, and the chooser.

Importing this module brings in no torch: the executor that is created does, so a process
that only holds the control plane (a front end, a client) stays light.
"""
from nanovllm.config import Config
from nanovllm.engine.executor import Executor
from nanovllm.engine.sequence import Sequence


class LocalExecutor:
    """A single ModelRunner in this process."""

    late_masks = True  # launch(late_masks=True) returns a LateSample (see ModelRunner.launch)

    def __init__(self, config: Config):
        from nanovllm.worker.model_runner import ModelRunner

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
        self.runner.set_eos_ids(eos_ids)

    def launch(self, seqs: list[Sequence], is_prefill: bool, late_masks: bool = False):
        """Start one step; the handle's result() waits for its sampled ids (and logprobs)."""
        return self.runner.launch(seqs, is_prefill, late_masks)

    def shutdown(self) -> None:
        """Drop the runner, so its weights and KV cache can be freed: its graphs first (the
        piecewise graphs' pieces and their owner refer to each other, and a cycle would keep
        the model, its cache and the graphs' pool alive until a garbage collection: a second
        engine in the process then found no memory left for its cache); then the freed
        memory goes back to the driver."""
        if self.runner is None:
            return
        self.runner.release_graphs()
        on_gpu, self.runner = self.on_gpu, None
        if on_gpu:
            from nanovllm.worker.kv_cache import hand_back_freed_memory

            hand_back_freed_memory(at_shutdown=True)


def create_executor(config: Config) -> Executor:
    """The executor for config.tensor_parallel_size ranks."""
    if config.tensor_parallel_size == 1:
        return LocalExecutor(config)
    from nanovllm.worker.multiproc import MultiprocExecutor

    return MultiprocExecutor(config)
