"""Loads safetensors or GGUF weights (or random ones) into a model through per-parameter
loaders.

Every checkpoint problem is a ValueError naming the file and what is wrong: a file cut short,
a tensor whose shape disagrees with config.json (each `weight_loader` checks the full,
unsharded shape it expects), or tensors the model needs but the checkpoint lacks. Tensors the
model does not use are logged and skipped. `check_checkpoint` runs the same checks from the
safetensors headers alone, on a model built on the meta device, so rank 0 can refuse a bad
checkpoint before any tensor-parallel worker starts.
"""
import contextlib
import glob
import json
import logging
import os
import re

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from nanovllm.config import ModelConfig
from nanovllm.utils.dist import tp_rank

logger = logging.getLogger(__name__)

# Buffers some checkpoints still carry; the model recomputes them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# fp8 KV-cache scales (vLLM's names: self_attn.k_scale, self_attn.attn.k_scale or
# self_attn.k_proj.k_scale, v alike): read by read_kv_scales, not by the model.
KV_SCALE_NAME = re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.|[kv]_proj\.)?([kv])_scale$")
# Names listed in one error message; the rest are counted.
MAX_LISTED = 20


class WeightShapeError(ValueError):
    """A checkpoint tensor's full shape differs from the one config.json implies."""

    def __init__(self, shape: tuple, expected: tuple):
        self.shape, self.expected = tuple(shape), tuple(expected)
        super().__init__(f"has shape {list(self.shape)}, config.json implies "
                         f"{list(self.expected)}")


def check_weight_shape(loaded: torch.Tensor, expected) -> None:
    """Refuse `loaded` unless its shape is `expected` (the full, unsharded shape).

    Needed because `copy_` broadcasts and `narrow` only sees one dimension: a wrong tensor
    would load silently or fail with an index error naming neither tensor nor file.
    """
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(loaded.shape, expected)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Plain copy for parameters that are neither sharded nor packed."""
    check_weight_shape(loaded, param.shape)
    param.data.copy_(loaded)


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


def load_model(model: nn.Module, path: str) -> None:
    """Copy every tensor of <path>/*.safetensors, or of the GGUF file `path`, into its
    (possibly packed) parameter."""
    _load(model, path, read_data=True)


def check_checkpoint(path: str, hf_config: ModelConfig) -> None:
    """Validate <path>/*.safetensors against config.json without reading tensor data.

    Raises the ValueError `load_model` would raise (damaged file, shape mismatch, missing
    tensors) and logs the same warning about unused tensors, from the headers alone.
    """
    # Imported here: the models import the layers, which import this module.
    from nanovllm.models import MODELS

    # Meta tensors carry shapes only: building the model and running every weight_loader
    # on them allocates nothing and reads nothing.
    with torch.device("meta"):
        model = MODELS[hf_config.architecture](hf_config)
    _load(model, path, read_data=False)


def _load(model: nn.Module, path: str, read_data: bool) -> None:
    """The loop behind load_model (read_data) and check_checkpoint (headers only)."""
    packed = getattr(model, "packed_modules_mapping", {})
    experts = getattr(model, "expert_modules_mapping", {})
    params = dict(model.named_parameters(remove_duplicate=False))
    found, unused = set(), []
    entries = (_gguf_entries(path, read_data) if os.path.isfile(path)
               else _safetensors_entries(path, read_data))
    for name, shape, file, read in entries:
        target, shard = _map_expert_name(name, experts) or _map_name(name, packed)
        param = params.get(target) if read is not None else None
        if param is None:
            if not name.endswith(IGNORED_SUFFIXES) and not KV_SCALE_NAME.search(name):
                unused.append(f"{name} ({os.path.basename(file)})")
            continue
        tensor = read() if read_data else torch.empty(shape, device="meta")
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
        except WeightShapeError as e:
            raise ValueError(f"tensor {name!r} in {file} {e}") from None
        found.add(name)
    if unused and tp_rank() == 0:  # every rank reads the same files: say it once
        logger.warning("%s: ignoring %d checkpoint tensor(s) the model does not use: %s",
                       path, len(unused), _listing(unused))
    missing = _expected_names(model, params, packed, experts) - found
    if missing:
        raise ValueError(f"the checkpoint in {path} lacks {len(missing)} tensor(s) the model "
                         f"needs: {_listing(sorted(missing))}")


def _safetensors_entries(path: str, read_data: bool):
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


def _gguf_entries(path: str, read_data: bool):
    """(Hugging Face name, shape, file, read) of every tensor of a GGUF file, dequantized."""
    from nanovllm.utils.gguf_loader import GGUFCheckpoint

    ckpt = GGUFCheckpoint(path)
    ckpt.check_types()
    for name, shape, read in ckpt.weights(read_data):
        yield name, shape, path, read


@contextlib.contextmanager
def _open(file: str):
    """safe_open, with the library's own errors turned into a ValueError naming the file."""
    try:
        with safe_open(file, "pt", "cpu") as f:
            yield f
    except SafetensorError as e:
        raise ValueError(f"{file} is not a readable safetensors file ({e})") from None


def _map_name(name: str, packed: dict) -> tuple[str, object]:
    """Checkpoint name -> (our parameter name, shard id or None)."""
    for frag, (target, shard) in packed.items():
        if f".{frag}." in name:
            return name.replace(f".{frag}.", f".{target}."), shard
    return name, None


# A per-expert checkpoint tensor: <prefix>.experts.<expert>.<module>.weight
_EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def _map_expert_name(name: str, experts: dict) -> tuple[str, tuple] | None:
    """A per-expert checkpoint name -> (our packed experts parameter, (expert, shard)), or
    None for other names. `experts` is the model's expert_modules_mapping."""
    m = _EXPERT_NAME.match(name) if experts else None
    if m is None or m.group(3) not in experts:
        return None
    param, shard = experts[m.group(3)]
    return f"{m.group(1)}.{param}", (int(m.group(2)), shard)


def _expected_names(model: nn.Module, params: dict, packed: dict,
                    experts: dict) -> set[str]:
    """The checkpoint names the model needs: the name mappings inverted over every parameter."""
    names = set()
    for pname, param in params.items():
        # Tied embeddings: the head shares the embedding's tensor, so one of the two suffices.
        if _tied(model, pname):
            continue
        prefix, _, last = pname.rpartition(".")
        modules = [mod for mod, (target, _) in experts.items()
                   if target == last and prefix.endswith(".experts")]
        if modules:  # packed experts: one tensor per expert (leading dim) and module
            names.update(f"{prefix}.{e}.{mod}.weight" for mod in modules
                         for e in range(param.shape[0]))
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


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights (vLLM's load_format='dummy'): small uniform values, norms at one."""
    gens = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
            continue
        # Drawn in fp32 on the parameter's own device: every dtype gets the same numbers, and
        # a GPU fills 0.6B parameters in milliseconds where the CPU took seconds of start-up.
        dev = param.device
        if dev not in gens:
            gens[dev] = torch.Generator(device=dev).manual_seed(seed)
        noise = torch.empty(param.shape, dtype=torch.float32, device=dev)
        param.data.copy_(noise.uniform_(-0.02, 0.02, generator=gens[dev]))
