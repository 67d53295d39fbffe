"""The device side: model runner, step staging, sampling, KV cache and the executors.

`create_executor` is the one entry point the control plane uses; importing it brings in no
torch until an executor is created.
"""
from nanovllm.worker.executor import create_executor

__all__ = ["create_executor"]
