"""Builds a model and loads safetensors or GGUF weights (or random ones) into it through
per-parameter loaders.

Every checkpoint problem is a ValueError naming the file and what is wrong: a file cut short,
a tensor whose shape disagrees with config.json (each `weight_loader` checks the full,
unsharded shape it expects), or tensors the model needs but the checkpoint lacks. Tensors the
model does not use are logged and skipped. `check_checkpoint` runs the same checks from the
safetensors headers alone, on a model built on the meta device, so rank 0 can refuse a bad
checkpoint before any tensor-parallel worker starts.
"""
import logging
import os
import re

import torch
from torch import nn

from nanovllm.config import Config, ModelConfig
from nanovllm.layers.weights import CheckpointTensorError, default_weight_loader
from nanovllm.models import model_class
from nanovllm.models.safetensors_io import KV_SCALE_NAME, safetensors_entries
from nanovllm.utils.dist import tp_rank

logger = logging.getLogger(__name__)

# Buffers some checkpoints still carry; the model recomputes them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# 8-bit float tensors: only a quantized layer's parameters take them.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Names listed in one error message; the rest are counted.
MAX_LISTED = 20


def build_model(config: Config, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """config's model on `device`, in `dtype`, with its weights (random ones for
    load_format="dummy"), in eval mode."""
    hf = config.hf_config
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(hf.architecture)(hf)
    finally:
        torch.set_default_dtype(default_dtype)
    if config.load_format == "dummy":
        init_dummy_weights(model, config.seed)
    else:
        load_model(model, config.model)
    if config.lm_head_quantization == "int8":
        model.lm_head.quantize_int8()
    return model.eval()


def load_model(model: nn.Module, path: str) -> None:
    """Copy every tensor of <path>/*.safetensors, or of the GGUF file `path`, into its
    (possibly packed) parameter."""
    _load(model, path, read_data=True)


def check_checkpoint(path: str, hf_config: ModelConfig) -> None:
    """Validate <path>/*.safetensors against config.json without reading tensor data.

    Raises the ValueError `load_model` would raise (damaged file, shape mismatch, missing
    tensors) and logs the same warning about unused tensors, from the headers alone.
    """
    # Meta tensors carry shapes only: building the model and running every weight_loader
    # on them allocates nothing and reads nothing.
    with torch.device("meta"):
        model = model_class(hf_config.architecture)(hf_config)
    _load(model, path, read_data=False)


def _load(model: nn.Module, path: str, read_data: bool) -> None:
    """The loop behind load_model (read_data) and check_checkpoint (headers only)."""
    packed = getattr(model, "packed_modules_mapping", {})
    experts = getattr(model, "expert_modules_mapping", {})
    params = dict(model.named_parameters(remove_duplicate=False))
    found, unused = set(), []
    entries = (_gguf_entries(path, read_data) if os.path.isfile(path)
               else safetensors_entries(path, read_data))
    for name, shape, file, read in entries:
        target, shard = _map_expert_name(name, experts) or _map_name(name, packed)
        param = params.get(target) if read is not None else None
        if param is None:
            if not name.endswith(IGNORED_SUFFIXES) and not KV_SCALE_NAME.search(name):
                unused.append(f"{name} ({os.path.basename(file)})")
            continue
        tensor = read() if read_data else torch.empty(shape, device="meta")
        if tensor.dtype in FP8_DTYPES and param.dtype not in FP8_DTYPES:
            # Cast without its scale, an fp8 tensor would load as wrong numbers, silently.
            raise ValueError(f"tensor {name!r} in {file} is {tensor.dtype}, but nanovllm keeps "
                             f"{target} unquantized (embeddings, the LM head, MoE experts "
                             "and modules config.json's quantization_config ignores)")
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
        except CheckpointTensorError as e:
            raise ValueError(f"tensor {name!r} in {file} {e}") from None
        found.add(name)
    if unused and tp_rank() == 0:  # every rank reads the same files: say it once
        logger.warning("%s: ignoring %d checkpoint tensor(s) the model does not use: %s",
                       path, len(unused), _listing(unused))
    missing = _expected_names(model, params, packed, experts) - found
    if missing:
        raise ValueError(f"the checkpoint in {path} lacks {len(missing)} tensor(s) the model "
                         f"needs: {_listing(sorted(missing))}")


def _gguf_entries(path: str, read_data: bool):
    """(Hugging Face name, shape, file, read) of every tensor of a GGUF file, dequantized."""
    from nanovllm.models.gguf_weights import gguf_weights
    from nanovllm.utils.gguf_file import GGUFCheckpoint

    ckpt = GGUFCheckpoint(path)
    ckpt.check_types()
    for name, shape, read in gguf_weights(ckpt, read_data):
        yield name, shape, path, read


def _map_name(name: str, packed: dict) -> tuple[str, object]:
    """Checkpoint name -> (our parameter name, shard id or None)."""
    for frag, (target, shard) in packed.items():
        if f".{frag}." in name:
            return name.replace(f".{frag}.", f".{target}."), shard
    return name, None


# A per-expert checkpoint tensor: <prefix>.experts.<expert>.<module>.<kind>, the kind a weight
# or, for fp8 experts, one of its scales.
EXPERT_KINDS = ("weight", "weight_scale", "weight_scale_inv", "input_scale")
_EXPERT_NAME = re.compile(rf"^(.*\.experts)\.(\d+)\.(\w+)\.({'|'.join(EXPERT_KINDS)})$")


def _expert_param(param: str, kind: str) -> str:
    """Our packed parameter for a kind of tensor: w13_weight -> w13_weight_scale_inv, ..."""
    return param if kind == "weight" else param.removesuffix("weight") + kind


def _map_expert_name(name: str, experts: dict) -> tuple[str, tuple] | None:
    """A per-expert checkpoint name -> (our packed experts parameter, (expert, shard)), or
    None for other names. `experts` is the model's expert_modules_mapping."""
    m = _EXPERT_NAME.match(name) if experts else None
    if m is None or m.group(3) not in experts:
        return None
    param, shard = experts[m.group(3)]
    return f"{m.group(1)}.{_expert_param(param, m.group(4))}", (int(m.group(2)), shard)


def _expected_names(model: nn.Module, params: dict, packed: dict,
                    experts: dict) -> set[str]:
    """The checkpoint names the model needs: the name mappings inverted over every parameter."""
    names = set()
    for pname, param in params.items():
        # Tied embeddings: the head shares the embedding's tensor, so one of the two suffices.
        # Scales computed while loading (fp8 quantized at load) are not in the checkpoint.
        if _tied(model, pname) or getattr(param, "computed", False):
            continue
        prefix, _, last = pname.rpartition(".")
        modules = [(mod, kind) for mod, (target, _) in experts.items() for kind in EXPERT_KINDS
                   if _expert_param(target, kind) == last and prefix.endswith(".experts")]
        if modules:  # packed experts: one tensor per expert (leading dim) and module
            names.update(f"{prefix}.{e}.{mod}.{kind}" for mod, kind in modules
                         for e in range(model.get_submodule(prefix).num_experts))
            continue
        frags = [frag for frag, (target, _) in packed.items() if f".{target}." in pname]
        for frag in frags:
            names.add(pname.replace(f".{packed[frag][0]}.", f".{frag}."))
        if not frags:
            names.add(pname)
    return names


def _tied(model: nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and (
        model.lm_head.weight is model.model.embed_tokens.weight)


def _listing(names: list[str]) -> str:
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" ... and {more} more" if more > 0 else "")


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights (vLLM's load_format='dummy'): small uniform values, norms at one."""
    gens = {}
    for name, param in model.named_parameters():
        if name.endswith(("norm.weight", "weight_scale", "weight_scale_inv")):
            param.data.fill_(1.0)  # a quantized weight's scales: the values stand as drawn
            continue
        # Drawn in fp32 on the parameter's own device: every dtype gets the same numbers, and
        # a GPU fills 0.6B parameters in milliseconds where the CPU took seconds of start-up.
        dev = param.device
        if dev not in gens:
            gens[dev] = torch.Generator(device=dev).manual_seed(seed)
        noise = torch.empty(param.shape, dtype=torch.float32, device=dev)
        param.data.copy_(noise.uniform_(-0.02, 0.02, generator=gens[dev]))
