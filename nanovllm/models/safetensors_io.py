"""Safetensors checkpoints read without trusting them: headers checked against the file's
size before anything is mapped, every library error turned into a ValueError naming the file,
and the fp8 KV-cache scales some checkpoints carry beside the weights."""
import contextlib
import glob
import json
import os
import re

import torch
from safetensors import SafetensorError, safe_open

# fp8 KV-cache scales (vLLM's names: self_attn.k_scale, self_attn.attn.k_scale or
# self_attn.k_proj.k_scale, v alike): read by read_kv_scales, not by the model.
KV_SCALE_NAME = re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.|[kv]_proj\.)?([kv])_scale$")


def read_safetensors_header(file: str) -> dict[str, list[int]]:
    """Tensor name -> shape from a .safetensors header, without reading tensor data.

    Refuses a file whose header is damaged or whose data is cut short (the header's largest
    data offset lies past the end of the file).
    """
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        prefix = f.read(8)
        n = int.from_bytes(prefix, "little")
        if len(prefix) < 8 or 8 + n > size:
            raise ValueError(f"{file} is truncated or not a safetensors file: its header "
                             f"does not fit in the file's {size} bytes")
        try:
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            shapes = {name: [int(d) for d in t["shape"]] for name, t in header.items()}
            end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise ValueError(f"{file} is not a safetensors file: unreadable header "
                             f"({type(e).__name__}: {e})") from None
    if 8 + n + end > size:
        raise ValueError(f"{file} is truncated: its header describes {8 + n + end} bytes, "
                         f"the file has {size}")
    return shapes


def safetensors_entries(path: str, read_data: bool):
    """(name, shape, file, read) of every tensor in <path>/*.safetensors."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"{path!r} has no *.safetensors weights (use load_format='dummy' for "
                         "random weights)")
    for file in files:
        shapes = read_safetensors_header(file)  # before safe_open maps a file cut short
        with (_open(file) if read_data else contextlib.nullcontext()) as f:
            for name, shape in shapes.items():
                yield name, shape, file, (lambda name=name: f.get_tensor(name))


@contextlib.contextmanager
def _open(file: str):
    """safe_open, with the library's own errors turned into a ValueError naming the file."""
    try:
        with safe_open(file, "pt", "cpu") as f:
            yield f
    except SafetensorError as e:
        raise ValueError(f"{file} is not a readable safetensors file ({e})") from None


def read_kv_scales(path: str, num_layers: int, num_kv_heads: int) -> torch.Tensor | None:
    """The checkpoint's fp8 KV-cache scales as fp32 [2 (K, V), layer, kv head], or None when it
    has none. Each may be a scalar (one per layer) or hold one value per kv head; the cache
    stores x / scale, so a scale is the dequantization factor (vLLM's convention)."""
    scales = torch.full((2, num_layers, num_kv_heads), float("nan"))
    found = 0
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        names = [n for n in read_safetensors_header(file) if KV_SCALE_NAME.search(n)]
        if not names:
            continue
        with _open(file) as f:
            for name in names:
                layer, kind = KV_SCALE_NAME.search(name).groups()
                t = f.get_tensor(name).float().flatten()
                if int(layer) >= num_layers or t.numel() not in (1, num_kv_heads) or not (
                        t > 0).all():
                    raise ValueError(f"tensor {name!r} in {file}: a KV-cache scale must be a "
                                     f"positive scalar or {num_kv_heads} positive values "
                                     f"(one per kv head) of a layer < {num_layers}")
                scales[0 if kind == "k" else 1, int(layer)] = t
                found += 1
    if not found:
        return None
    if scales.isnan().any():
        raise ValueError(f"the checkpoint in {path} has k_scale/v_scale for some layers but "
                         f"not all {num_layers}: give every layer's scales or none")
    return scales
