"""Which device and dtype a ModelRunner uses."""
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
