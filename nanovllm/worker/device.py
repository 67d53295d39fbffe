"""Which device and dtype a ModelRunner uses, and which GPUs each data-parallel replica gets."""
import os

import torch

from nanovllm.config import Config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(config: Config) -> torch.device:
    """config.device, or CUDA when available, else CPU; a clear error for a missing GPU."""
    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device={name!r} is not a device name ({e})") from e
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={name!r} but no CUDA GPU is available here: use "
                             "device='cpu' (or leave device unset to pick automatically)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= count:
            raise ValueError(f"device={name!r} but only {count} CUDA GPU(s) are visible")
    return device


def resolve_dtype(config: Config, device: torch.device) -> torch.dtype:
    """'auto' = the checkpoint's dtype on GPU and float32 on CPU (bf16 matmuls are slow there)."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device.type == "cpu":
        return torch.float32
    return DTYPES.get(str(config.hf_config.torch_dtype).replace("torch.", ""), torch.bfloat16)


def replica_gpus(config: Config) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each data-parallel replica: disjoint sets of
    tensor_parallel_size GPUs, from config.device's index on; None when running on CPU."""
    device = resolve_device(config)
    if device.type != "cuda":
        return None
    dp, tp = config.data_parallel_size, config.tensor_parallel_size
    # The children see only their own GPUs; name them as this process sees them.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    first = device.index or 0
    if len(ids) - first < dp * tp:
        raise ValueError(f"data_parallel_size={dp} x tensor_parallel_size={tp} needs {dp * tp} "
                         f"GPUs (from cuda:{first} on); {len(ids) - first} visible: lower "
                         "data_parallel_size or tensor_parallel_size")
    return [",".join(ids[first + r * tp: first + (r + 1) * tp]) for r in range(dp)]
