"""Loads safetensors weights (or random ones) into a model through per-parameter loaders."""
import glob
import os

import torch
from safetensors import safe_open
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Plain copy for parameters that are neither sharded nor packed."""
    param.data.copy_(loaded)


def load_model(model: nn.Module, path: str) -> None:
    """Copy every tensor of <path>/*.safetensors into its (possibly packed) parameter."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"{path!r} has no *.safetensors weights (use load_format='dummy' for "
                         "random weights)")
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = set()
    for file in files:
        with safe_open(file, "pt", "cpu") as f:
            for name in f.keys():
                target, shard = _map_name(name, packed)
                param = params.get(target)
                if param is None:
                    if "rotary_emb.inv_freq" in name:
                        continue
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter")
                loader = getattr(param, "weight_loader", default_weight_loader)
                tensor = f.get_tensor(name)
                if shard is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard)
                loaded.add(target)
    # Tied embeddings: the head shares the embedding's tensor, so one of the two suffices.
    missing = {n for n in params if n not in loaded and not _tied(model, n)}
    if missing:
        raise ValueError(f"the checkpoint lacks weights for {sorted(missing)[:5]}")


def _map_name(name: str, packed: dict) -> tuple[str, object]:
    for frag, (target, shard) in packed.items():
        if f".{frag}." in name:
            return name.replace(f".{frag}.", f".{target}."), shard
    return name, None


def _tied(model: nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and (
        model.lm_head.weight is model.model.embed_tokens.weight)


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights (vLLM's load_format='dummy'): small uniform values, norms at one."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            # Generate on CPU in fp32 so every device and dtype gets the same numbers.
            param.data.copy_(torch.empty(param.shape).uniform_(-0.02, 0.02, generator=g))
