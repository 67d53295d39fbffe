"""Tensor parallelism across processes: channel, process group, workers, executor."""
