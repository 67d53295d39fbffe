"""How rank 0 reaches its model runner(s): directly for one rank; tensor parallelism later."""
from nanovllm.config import Config
from nanovllm.engine.model_runner import ModelRunner


class LocalRunner:
    """A single ModelRunner in this process."""

    def __init__(self, config: Config):
        self.runner = ModelRunner(config)

    def call(self, method: str, *args):
        """Invoke a ModelRunner method."""
        return getattr(self.runner, method)(*args)

    def shutdown(self) -> None:
        """Nothing to stop for a single in-process runner."""


def create_runner(config: Config):
    """The runner front for config.tensor_parallel_size ranks."""
    if config.tensor_parallel_size == 1:
        return LocalRunner(config)
    raise ValueError("tensor_parallel_size > 1 is not available yet")
