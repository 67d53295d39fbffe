"""Tensor-parallel rank and size; (0, 1) when torch.distributed is not initialised."""
import torch.distributed as dist


def tp_rank() -> int:
    """This process's rank in the tensor-parallel group."""
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    """Number of tensor-parallel ranks."""
    return dist.get_world_size() if dist.is_initialized() else 1
